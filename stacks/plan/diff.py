"""What changing a stack file (or the code) does: two offline plans compared resource by resource. Pure (plan
documents in, plain data and text out).

Each resource is added, removed, updated or replaced, with every changed input as ``path: old → new``
(``plan/values.py``; secrets only as changed or not). Replacement is what the engine would decide from what a plan
knows: a changed input the provider recreates the resource for (``FORCE_NEW``, read from the providers' sources), a
change under ``replaceOnChanges`` (pulumi-command's ``triggers`` are one), or the replacement of something listed in
its ``replaceWith``. Changes under ``ignoreChanges`` never reach the provider and are left out. A removal or
replacement the engine refuses (``protect``), an update the API refuses and the rows a refused spec change would fail
(``plan/classes.py``: a datastore move, a smaller disk, a lower or skipped Kubernetes minor on joined workers) are
flagged in ``Change.fails``.

What the changes disrupt and how they are shown: ``plan/report.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxmox_gpu_cluster.core.input_safety import escape_controls
from proxmox_gpu_cluster.render.agent_bundle import STEP_PATH
from proxmox_gpu_cluster.stacks.plan.classes import refused_rows
from proxmox_gpu_cluster.stacks.plan.context import context_of, spec_changes
from proxmox_gpu_cluster.stacks.plan.engine import dependent_replacements, effective, engine_urns, protection
from proxmox_gpu_cluster.stacks.plan.values import MISSING, reason_note, secret_line, value_lines

# Input paths (Pulumi property-path syntax) whose change makes the provider replace the resource. Sources read:
# - bpg/terraform-provider-proxmox v0.111.1 (what pulumi-proxmoxve bridges): proxmoxtf/resource/vm/vm.go (VM:
#   ForceNew on amd_sev, every clone.* field, initialization.{user,vendor,network,meta}_data_file_id and type;
#   CustomizeDiff: vm_id unless set to the VM's own id, node_name unless migrate, efi_disk.type, tpm_state.version),
#   vm/disk/schema.go (disk file_id); proxmoxtf/resource/file.go (a snippet file: ForceNew on all but overwrite and
#   timeouts); fwprovider/nodes/resource_download_file.go (RequiresReplace on content type, name, datastore, node,
#   url, checksum, decompression). fwprovider/cluster/hardwaremapping/resource_pci.go has no RequiresReplace at all:
#   a PCI mapping's new name is sent as an update of a mapping that does not exist (see FAILS).
# - pulumi/pulumi-kubernetes v4.32.0: provider/pkg/provider/diff.go (forceNew per group/version/kind: a Job's
#   completions, parallelism, selector and template; a ResourceQuota's scopes; a (Cluster)RoleBinding's roleRef;
#   a ConfigMap's data and binaryData unless enableConfigMapMutable, which this project's provider leaves off) and
#   provider.go Diff (metadata.name and .namespace for every kind; a *Patch resource only those);
#   helm_release.go (a Release: name and namespace).
# - pulumi/pulumi-command v1.2.1: provider/pkg/provider/common/inputs.go, remote/copy.go (``triggers`` carries
#   provider:"replaceOnChanges", published as "replaceOnChanges": true in provider/cmd/pulumi-resource-command/
#   schema.json for every Command and CopyToRemote); a changed create, update or delete command is an update
#   (Update runs ``update``, else ``create``, again; a new ``delete`` is only stored for later).
_VM = ("amdSev", "clone", "initialization.userDataFileId", "initialization.vendorDataFileId",
       "initialization.networkDataFileId", "initialization.metaDataFileId", "initialization.type",
       "disks[*].fileId", "efiDisk.type", "tpmState.version", "vmId", "nodeName")  # fmt: skip
FORCE_NEW: Mapping[str, tuple[str, ...]] = {
    "proxmoxve:index/vmLegacy:VmLegacy": _VM,
    "proxmoxve:index/fileLegacy:FileLegacy": ("contentType", "datastoreId", "fileModificationDate", "fileMode",
                                              "fileSize", "fileTag", "nodeName", "sourceFile", "sourceRaw"),
    "proxmoxve:download/file:File": ("contentType", "fileName", "datastoreId", "nodeName", "url", "checksum",
                                     "decompressionAlgorithm"),
    "kubernetes:batch/v1:Job": ("spec.completions", "spec.parallelism", "spec.selector", "spec.template"),
    "kubernetes:core/v1:ConfigMap": ("data", "binaryData"),
    "kubernetes:core/v1:Secret": ("type", "data", "stringData"),
    "kubernetes:core/v1:ResourceQuota": ("spec.scopes",),
    "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding": ("roleRef",),
    "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding": ("roleRef",),
    "kubernetes:helm.sh/v3:Release": ("name", "namespace"),
    "kubernetes:helm.sh/v4:Release": ("name", "namespace"),
    "command:remote:Command": ("triggers",),
    "command:local:Command": ("triggers",),
    "command:remote:CopyToRemote": ("triggers",),
}  # fmt: skip
"""Type -> input paths whose change makes the provider replace the resource (plus ``_KUBE_IDENTITY`` for every
Kubernetes object but a Helm release)."""
_KUBE_IDENTITY = ("metadata.name", "metadata.namespace")

FAILS: Mapping[str, Mapping[str, str]] = {
    # kubernetes pkg/apis/scheduling/validation/validation.go (ValidatePriorityClassUpdate): value and
    # preemptionPolicy may not change, and pulumi-kubernetes does not list them as forceNew (diff.go above), so the
    # provider patches and the API server refuses.
    "kubernetes:scheduling.k8s.io/v1:PriorityClass": {
        "value": "Kubernetes refuses to change a PriorityClass's value (immutable); rename it to replace it",
        "preemptionPolicy": "Kubernetes refuses to change a PriorityClass's preemptionPolicy (immutable)",
    },
    "proxmoxve:hardware/mapping/pci:Pci": {
        "name": "the provider updates the mapping by its new name, which Proxmox does not have (no replace)",
    },
}
"""Type -> input path -> why an update of it fails at ``pulumi up`` although the plan shows an update."""


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
    values: tuple[str, ...] = ()
    """Display lines, one or more per changed path: ``path: old → new``, a unified diff of long text, or for a
    secret ``path: changed (secret)`` with the non-secret reason. Escaped, bounded, secrets never shown."""
    replace_reasons: tuple[str, ...] = ()
    """Why a ``replace``: the paths that force it (provider rule or replaceOnChanges), or ``replaceWith <name>``."""
    delete_first: bool = False
    """A replace that deletes the old resource before creating the new one (deleteBeforeReplace, or
    pulumi-kubernetes keeping the same explicit name): there is a window with neither."""
    protected: bool = False
    """A remove or replace of a protected resource: the engine refuses it, ``pulumi up`` fails."""
    unprotect: str = ""
    """With ``protected``: the command that lifts the protection (shell-quoted)."""
    retained: bool = False
    """A removal with retainOnDelete: Pulumi only forgets it, the real resource stays."""
    fails: tuple[str, ...] = ()
    """Why this change will fail at ``pulumi up`` (protected, an immutable field the provider updates)."""


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


Part = str | int


def changed_values(
    before: Any, after: Any, parts: tuple[Part, ...] = ()
) -> Iterator[tuple[tuple[Part, ...], Any, Any]]:
    """Each place two input values differ: (path parts, old, new); a key present on one side only has
    ``MISSING`` on the other; lists of different lengths differ as a whole."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        for key in sorted({*before, *after}):
            yield from changed_values(before.get(key, MISSING), after.get(key, MISSING), (*parts, str(key)))
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            yield from changed_values(b, a, (*parts, i))
    elif before != after:
        yield parts, before, after


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_]+")  # sdk/go/common/resource/properties_path.go: requiresQuote


def path_text(parts: Sequence[Part]) -> str:
    """``a.b[2].c`` as Pulumi writes property paths (``(all)`` for the whole value); a key that is not a plain name
    is quoted, ``metadata.labels["nvidia.com/gpu.present"]``, so no dot in a key reads as a level."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            text += f".{part}" if text else part
        else:
            text += f"[{escape_controls(json.dumps(part, ensure_ascii=False))}]"
    return text or "(all)"


def input_paths(before: Any, after: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths (``a.b[2].c``) where two input values differ."""
    for parts, _, _ in changed_values(before, after):
        if not prefix:
            yield path_text(parts)
        elif parts:
            text = path_text(parts)
            yield prefix + (text if text.startswith("[") else f".{text}")
        else:
            yield prefix


_TOKEN = re.compile(r'\[\s*"((?:[^"\\]|\\.)*)"\s*\]|\[(\*|\d+)\]|\.?([^.\[\]]+)')


def property_path(pattern: str) -> tuple[Part | None, ...]:
    """A Pulumi property path (``a.b``, ``a[0]``, ``a[*].b``, ``a["x.y"]``) as parts; None matches any element."""
    parts: list[Part | None] = []
    for quoted, index, plain in _TOKEN.findall(pattern):
        if index:
            parts.append(None if index == "*" else int(index))
        else:
            parts.append(json.loads(f'"{quoted}"') if quoted else plain)
    return tuple(parts)


def _matches(path: Sequence[Part], pattern: str, *, overlap: bool) -> bool:
    """Whether ``path`` is at or under ``pattern`` (``overlap``: or above it, i.e. a change of a whole value that
    contains the pattern, as a list that changed length contains its elements)."""
    want = property_path(pattern)
    if len(path) < len(want) and not overlap:
        return False
    return all((w is None and isinstance(p, int)) or w == p for p, w in zip(path, want, strict=False))


def _forced(type_: str, inputs: Mapping[str, Any], provider: Mapping[str, Any]) -> tuple[str, ...]:
    rules = [*FORCE_NEW.get(type_, ())]
    mutable = _true(provider.get("enableConfigMapMutable")) and not _true(inputs.get("immutable"))
    if type_ == "kubernetes:core/v1:ConfigMap" and mutable:  # diff.go: unless the ConfigMap itself is immutable
        rules = []
    if type_.startswith("kubernetes:") and ":helm.sh/" not in type_:
        rules = [*_KUBE_IDENTITY] if type_.endswith("Patch") else [*_KUBE_IDENTITY, *rules]
    if type_ == "proxmoxve:index/vmLegacy:VmLegacy" and inputs.get("migrate") is True:
        rules.remove("nodeName")  # vm.go: node_name is ForceNew only without migrate
    return tuple(rules)


def _true(value: Any) -> bool:
    return value is True or value == "true"  # provider inputs arrive as strings (JSON-encoded by the SDK)


def _updated(
    urn: str, old: Mapping[str, Any], new: Mapping[str, Any], provider: Mapping[str, Any], context: str = ""
) -> Change | None:
    """The update or replace of one resource in both plans, None when no input that reaches the provider changed;
    ``context``: the spec changes behind it, the reason a changed secret shows when nothing else of it changed."""
    options, type_ = new.get("options", {}), new["type"]
    ignored = options.get("ignoreChanges", [])
    found = [
        (parts, b, a)
        for parts, b, a in changed_values(old["inputs"], new["inputs"])
        if not any(_matches(parts, p, overlap=False) for p in ignored)
    ]
    if not found:
        return None
    paths = tuple(path_text(parts) for parts, _, _ in found)
    forced = [*_forced(type_, new["inputs"], provider), *options.get("replaceOnChanges", [])]
    reasons = tuple(path_text(parts) for parts, _, _ in found if any(_matches(parts, f, overlap=True) for f in forced))
    bundle = _bundle_change(old, new)
    secrets = [path_text(parts) for parts, b, a in found if secret_line("", b, a) is not None]
    note = reason_note(paths, secrets, bundle) or context
    values: list[str] = []
    for parts, b, a in found:
        lines = value_lines(path_text(parts), b, a)
        values += [f"{lines[0]} ({note})" if note and path_text(parts) in secrets else lines[0], *lines[1:]]
    fails = tuple(
        f"will fail: {why}"
        for key, why in FAILS.get(type_, {}).items()
        if not reasons and any(_matches(parts, key, overlap=True) for parts, _, _ in found)
    )
    action = "replace" if reasons else "update"
    return Change(urn, type_, new["name"], action, paths, bundle, tuple(values), reasons, fails=fails)


def _delete_first(change: Change, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """deleteBeforeReplace, or pulumi-kubernetes' rule (provider.go Diff): an object replaced under the same
    explicit name in the same namespace must be deleted first (two objects cannot share a name)."""
    if new.get("options", {}).get("deleteBeforeReplace"):
        return True
    if not change.type.startswith("kubernetes:") or ":helm.sh/" in change.type:
        return False
    meta_old, meta_new = old["inputs"].get("metadata") or {}, new["inputs"].get("metadata") or {}
    name = meta_new.get("name")
    return bool(name) and name == meta_old.get("name") and meta_new.get("namespace") == meta_old.get("namespace")


def _replaced_with(
    changes: dict[str, Change], old: Mapping[str, Mapping[str, Any]], new: Mapping[str, Mapping[str, Any]]
) -> None:
    """A resource whose replaceWith target is replaced is replaced too (repeat until nothing more follows)."""
    grew = True
    while grew:
        grew = False
        for urn, r in new.items():
            targets = [t for t in r.get("options", {}).get("replaceWith", []) if t in changes]
            replaced = [changes[t].name for t in targets if changes[t].action == "replace"]
            current = changes.get(urn)
            if urn in old and replaced and (current is None or current.action != "replace"):
                base = current or Change(urn, r["type"], r["name"], "replace")
                why = tuple(f"replaceWith {n}" for n in replaced)
                changes[urn] = replace(base, action="replace", replace_reasons=(*base.replace_reasons, *why), fails=())
                grew = True


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[Change]:
    """The changes from plan document ``before`` to ``after`` (``plan_document`` output), in ``after``'s order,
    removals last."""
    old = {r["urn"]: r for r in before["resources"]}
    new = {r["urn"]: r for r in after["resources"]}
    changes: dict[str, Change] = {}
    spec = spec_changes(before, after)
    for urn, r in new.items():
        provider = new.get(r.get("provider") or "", {}).get("inputs", {})
        if urn not in old:
            changes[urn] = Change(urn, r["type"], r["name"], "add")
        elif (change := _updated(urn, old[urn], r, provider, context_of(r["name"], spec))) is not None:
            changes[urn] = change
    _replaced_with(changes, old, new)
    for urn, change in changes.items():
        if change.action == "replace" and _delete_first(change, old[urn], new[urn]):
            changes[urn] = replace(change, delete_first=True)
    # The engine deletes first what depends on a delete-first replacement, when that would replace it anyway.
    firsts = [u for u, c in changes.items() if c.delete_first]
    dependents = dependent_replacements(before, firsts, _forced_of(old), _covered) if firsts else {}
    for urn, reasons in dependents.items():
        if urn in new:
            r = new[urn]
            base = changes.get(urn) or Change(urn, r["type"], r["name"], "replace")
            why = (*base.replace_reasons, *reasons)
            changes[urn] = replace(base, action="replace", delete_first=True, replace_reasons=why, fails=())
    if dependents:
        _replaced_with(changes, old, new)  # what names a dependent in its replaceWith goes too
    removed = [Change(u, r["type"], r["name"], "remove") for u, r in old.items() if u not in new]
    protect_old, protect_new = effective(before, "protect"), effective(after, "protect")
    retain, state_urns = effective(before, "retainOnDelete"), engine_urns(before)
    out = []
    for change in [*(changes[u] for u in new if u in changes), *removed]:
        retained = change.action == "remove" and retain.get(change.urn, False)
        first = change.delete_first or (
            change.action == "replace" and _delete_first(change, old[change.urn], new[change.urn])
        )  # also for what replaceWith pulled in last
        flagged = replace(change, retained=retained, delete_first=first)
        dependent = change.urn in dependents
        out.append(protection(flagged, protect_old, protect_new, dependent, state_urns.get(change.urn, "")))
    # A spec change with no supported path (plan/classes.py: only a diff knows the old value) fails these rows.
    refused = refused_rows(before, after, cluster_prefix(after))
    return [replace(c, fails=(*c.fails, *refused[c.name])) if c.name in refused else c for c in out]


def _forced_of(resources: Mapping[str, Mapping[str, Any]]) -> Callable[[Mapping[str, Any]], list[str]]:
    """A resource's replace-forcing paths as its provider and options say (for ``dependent_replacements``)."""

    def forced(r: Mapping[str, Any]) -> list[str]:
        provider = resources.get(r.get("provider") or "", {}).get("inputs", {})
        return [*_forced(r["type"], r["inputs"], provider), *r.get("options", {}).get("replaceOnChanges", [])]

    return forced


def _covered(path: str, ignored: Sequence[str]) -> bool:
    parts = [p if p is not None else 0 for p in property_path(path)]
    return any(_matches(parts, pattern, overlap=False) for pattern in ignored)


def cluster_prefix(document: Mapping[str, Any]) -> str:
    """The name prefix of a GpuCluster's children (``<name>-``), empty when the program has none."""
    names = [r["name"] for r in document["resources"] if r["type"] == "proxmox-gpu-cluster:cluster:GpuCluster"]
    return f"{names[0]}-" if len(names) == 1 else ""


SYMBOL = {"add": "+", "remove": "-", "update": "~", "replace": "+-"}


def change_rows(change: Change) -> list[str]:
    """The lines one change shows in the resource list of a diff (plain text; the markdown puts them in a
    ``diff`` code block): a head line, then indented its values, why it is replaced and what makes it fail."""
    head = (
        f"{SYMBOL[change.action]:<2} {change.type} {change.name}"
        + (f"  ({', '.join(change.paths)})" if change.paths else "")
        + (f"  [agent {change.bundle}]" if change.bundle else "")
    )
    rows = [head, *(f"      {line}" for line in change.values)]
    if change.action == "replace":
        order = (
            "delete first: the old one is gone before the new one exists"
            if change.delete_first
            else "create first, then delete the old one"
        )
        rows.append(f"      replace ({order}) because of: {', '.join(change.replace_reasons) or 'the provider'}")
    if change.retained:
        rows.append("      retainOnDelete: only dropped from the Pulumi state; the resource itself stays")
    rows += [f"      {why}" for why in change.fails]
    return rows
