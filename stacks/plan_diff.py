"""What changing a stack file does: two offline plans compared resource by resource. Pure (plan documents in,
plain data and text out).

Each resource is added, removed, updated (the input paths that changed, secrets redacted) or replaced. Replacement
is what the engine would decide from what a plan knows: a changed input the provider recreates the resource for
(``FORCE_NEW``, from the providers' schemas), a changed ``triggers`` (pulumi-command always replaces then), a change
under ``replaceOnChanges``, or the replacement of something listed in its ``replaceWith``. Changes under
``ignoreChanges`` never reach the provider and are left out.

What the changes disrupt and how they are shown: ``plan_report.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxmox_gpu_cluster.render.agent_bundle import STEP_PATH

FORCE_NEW: Mapping[str, tuple[str, ...]] = {
    # bpg/terraform-provider-proxmox: node_name and vm_id are ForceNew on proxmox_virtual_environment_vm.
    "proxmoxve:index/vmLegacy:VmLegacy": ("nodeName", "vmId"),
    # A hardware mapping is identified by its name (the API path /cluster/mapping/pci/{id}).
    "proxmoxve:hardware/mapping/pci:Pci": ("name",),
    # Kubernetes objects are identified by name and namespace: a new one is another object.
    "kubernetes:core/v1:ConfigMap": ("metadata.name", "metadata.namespace"),
    "kubernetes:core/v1:Namespace": ("metadata.name",),
}
"""Type -> input paths whose change makes the provider replace the resource."""


@dataclass(frozen=True)
class Change:
    """One resource a ``pulumi up`` would touch."""

    urn: str
    type: str
    name: str
    action: str
    """``add``, ``remove``, ``update`` or ``replace``."""
    paths: tuple[str, ...] = ()
    """Changed input paths (``update``/``replace``)."""
    bundle: str = ""
    """For a node-agent step whose bundle changed: ``<step> <old fingerprint>→<new fingerprint>``."""


def _bundle(resource: Mapping[str, Any]) -> tuple[str, str] | None:
    """The node-agent step and fingerprint a resource's command runs, if it runs one."""
    create = resource.get("inputs", {}).get("create")
    match = STEP_PATH.search(create) if isinstance(create, str) else None
    return (match[1], match[2]) if match else None


def _bundle_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    before, after = _bundle(old), _bundle(new)
    if before is None or after is None or before == after:
        return ""
    return f"{after[0]} {before[1]}→{after[1]}"


def input_paths(before: Any, after: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths (``a.b[2].c``) where two input values differ."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        for key in sorted({*before, *after}):
            yield from input_paths(before.get(key), after.get(key), f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            yield from input_paths(b, a, f"{prefix}[{i}]")
    elif before != after:
        yield prefix or "(all)"


def _under(path: str, patterns: Sequence[str]) -> bool:
    def norm(p: str) -> str:
        return p.replace("[*]", "").replace("[", ".").replace("]", "")

    flat = norm(path)
    for pattern in patterns:
        wanted = norm(pattern)
        if "[*]" in pattern:
            parts, want = flat.split("."), wanted.split(".")
            kept = [p for p in parts if not p.isdigit()]
            if kept[: len(want)] == want:
                return True
        elif flat == wanted or flat.startswith(wanted + "."):
            return True
    return False


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Change]:
    """The changes from plan document ``before`` to ``after`` (``plan_document`` output), in ``after``'s order,
    removals last."""
    old = {r["urn"]: r for r in before["resources"]}
    new = {r["urn"]: r for r in after["resources"]}
    changes: dict[str, Change] = {}
    for urn, r in new.items():
        if urn not in old:
            changes[urn] = Change(urn, r["type"], r["name"], "add")
            continue
        options = r.get("options", {})
        paths = tuple(
            p for p in input_paths(old[urn]["inputs"], r["inputs"]) if not _under(p, options.get("ignoreChanges", []))
        )
        if not paths:
            continue
        forced = (*FORCE_NEW.get(r["type"], ()), *options.get("replaceOnChanges", []))
        replace = any(_under(p, forced) for p in paths) or (
            r["type"].startswith("command:") and any(_under(p, ["triggers"]) for p in paths)
        )
        action = "replace" if replace else "update"
        changes[urn] = Change(urn, r["type"], r["name"], action, paths, _bundle_change(old[urn], r))
    # A resource whose replaceWith target is replaced is replaced too (repeat until nothing more follows).
    grew = True
    while grew:
        grew = False
        for urn, r in new.items():
            targets = r.get("options", {}).get("replaceWith", [])
            if urn in old and any(changes.get(t, Change("", "", "", "")).action == "replace" for t in targets):
                current = changes.get(urn)
                if current is None or current.action != "replace":
                    paths = current.paths if current else ()
                    bundle = current.bundle if current else ""
                    changes[urn] = Change(urn, r["type"], r["name"], "replace", paths, bundle)
                    grew = True
    ordered = [changes[u] for u in new if u in changes]
    return ordered + [Change(u, r["type"], r["name"], "remove") for u, r in old.items() if u not in new]


def cluster_prefix(document: Mapping[str, Any]) -> str:
    """The name prefix of a GpuCluster's children (``<name>-``), empty when the program has none."""
    names = [r["name"] for r in document["resources"] if r["type"] == "proxmox-gpu-cluster:cluster:GpuCluster"]
    return f"{names[0]}-" if len(names) == 1 else ""


SYMBOL = {"add": "+", "remove": "-", "update": "~", "replace": "+-"}


def change_rows(change: Change) -> list[str]:
    """The lines one change shows in the resource list of a diff (plain text; the markdown puts them in a
    ``diff`` code block)."""
    return [
        f"{SYMBOL[change.action]:<2} {change.type} {change.name}"
        + (f"  ({', '.join(change.paths)})" if change.paths else "")
        + (f"  [agent {change.bundle}]" if change.bundle else "")
    ]
