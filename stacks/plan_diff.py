"""What changing a stack file does: two offline plans compared resource by resource. Pure (plan documents in,
plain data and text out).

Each resource is added, removed, updated (the input paths that changed, secrets redacted) or replaced. Replacement
is what the engine would decide from what a plan knows: a changed input the provider recreates the resource for
(``FORCE_NEW``, from the providers' schemas), a changed ``triggers`` (pulumi-command always replaces then), a change
under ``replaceOnChanges``, or the replacement of something listed in its ``replaceWith``. Changes under
``ignoreChanges`` never reach the provider and are left out.

The summary says what a reviewer needs before anything runs: the Proxmox nodes whose host prep runs again (and so may
reboot), the VMs replaced or destroyed, the GPU nodes drained through rollout slots (a new driver step or MIG
geometry) and in how many rounds, the ConfigMaps recreated, and which node-agent steps run again because what they
run changed (their bundle's fingerprint in the command, ``render/agent_bundle.py``), in plain text: a step's stdin
is secret, so its script change would otherwise show only as a changed ``create``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
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


def _owner(change: Change, suffixes: Sequence[str], prefix: str) -> str | None:
    """The worker or Proxmox node a step belongs to, from its name ``<prefix><owner><suffix>``."""
    for suffix in suffixes:
        if change.name.endswith(suffix) and change.name.startswith(prefix):
            return change.name.removesuffix(suffix).removeprefix(prefix)
    return None


def summary(changes: Sequence[Change], max_unavailable: int = 1, prefix: str = "") -> dict[str, Any]:
    """What the changes disrupt (see the module docstring); ``prefix``: ``cluster_prefix`` of the plan."""
    touched = [c for c in changes if c.action in ("update", "replace")]
    hosts = sorted({o for c in touched if (o := _owner(c, ("-host-prep-prep",), prefix)) is not None})
    vms = sorted(c.name for c in changes if c.type.endswith("vmLegacy:VmLegacy") and c.action in ("replace", "remove"))
    drained = sorted({o for c in touched if (o := _owner(c, ("-bootstrap-driver", "-mig-begin"), prefix)) is not None})
    return {
        "added": sum(c.action == "add" for c in changes),
        "removed": sum(c.action == "remove" for c in changes),
        "updated": sum(c.action == "update" for c in changes),
        "replaced": sum(c.action == "replace" for c in changes),
        "hostPrepRuns": hosts,
        "vmsReplacedOrDestroyed": vms,
        "nodesRolled": drained,
        "rollingRounds": math.ceil(len(drained) / max_unavailable) if drained else 0,
        "configMapsRecreated": sorted(
            c.name for c in changes if c.type == "kubernetes:core/v1:ConfigMap" and c.action == "replace"
        ),
        "agentSteps": agent_steps(changes, prefix),
    }


def agent_steps(changes: Sequence[Change], prefix: str = "") -> dict[str, list[str]]:
    """``<step> <old>→<new>`` -> the resources (without ``prefix``) that run it again because its bundle changed."""
    out: dict[str, list[str]] = {}
    for c in changes:
        if c.bundle:
            out.setdefault(c.bundle, []).append(c.name.removeprefix(prefix))
    return {bundle: sorted(names) for bundle, names in sorted(out.items())}


def diff_document(changes: Sequence[Change], max_unavailable: int = 1, prefix: str = "") -> dict[str, Any]:
    """The diff as plain data (``--json``)."""
    return {"summary": summary(changes, max_unavailable, prefix), "changes": [asdict(c) for c in changes]}


def render_diff(
    changes: Sequence[Change], max_unavailable: int = 1, prefix: str = "", *, markdown: bool = False
) -> str:
    """The diff for a terminal, or for a pull-request comment (``markdown``)."""
    s = summary(changes, max_unavailable, prefix)
    rolled = (
        f"{len(s['nodesRolled'])} GPU node(s) drained and changed, {max_unavailable} at a time "
        f"({s['rollingRounds']} round(s)): {', '.join(s['nodesRolled'])}"
        if s["nodesRolled"]
        else "no GPU node drained"
    )
    lines = [
        f"{s['added']} to add, {s['updated']} to update, {s['replaced']} to replace, {s['removed']} to remove",
        f"Proxmox hosts whose host prep runs again (may reboot, per rebootPolicy): {_names(s['hostPrepRuns'])}",
        f"VMs replaced or destroyed: {_names(s['vmsReplacedOrDestroyed'])}",
        rolled,
        f"ConfigMaps recreated: {_names(s['configMapsRecreated'])}",
        *(
            [
                f"Node agent: {bundle} re-runs on {len(names)} machine(s) (what it runs changed): {', '.join(names)}"
                for bundle, names in s["agentSteps"].items()
            ]
            or ["Node agent: no step runs again for a change of what it runs"]
        ),
    ]
    symbol = {"add": "+", "remove": "-", "update": "~", "replace": "+-"}
    rows = [
        f"{symbol[c.action]:<2} {c.type} {c.name}"
        + (f"  ({', '.join(c.paths)})" if c.paths else "")
        + (f"  [agent {c.bundle}]" if c.bundle else "")
        for c in changes
    ]
    if not markdown:
        return "\n".join([*lines, "", *rows]) + "\n"
    head = ["### Offline plan diff", "", *(f"- {line}" for line in lines), ""]
    body = ["<details><summary>Resources</summary>", "", "```diff", *rows, "```", "", "</details>"]
    return "\n".join([*head, *body]) + "\n"


def _names(names: Sequence[str]) -> str:
    return ", ".join(names) or "none"
