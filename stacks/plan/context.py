"""Why a resource changed, in the stack file's words: the cluster spec's changed fields, by the machine they belong
to. Pure (plan documents in, text out).

A diff can show a secret input only as ``changed (secret)``. When nothing else of that resource changed (a step's
``connection`` after a host got a new address), the reader still needs the cause: the spec fields that changed for
the resource's machine (``proxmox.nodes[pve-b].sshAddress: 10.20.0.12 → 10.20.0.22``), or, when none did, the
cluster-wide ones. Plan documents carry each cluster's validated spec (``specs``, no secrets: those are config keys
of their own); a document of an older revision without it gives no context, never a wrong one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from proxmox_gpu_cluster.core.input_safety import escape_controls

SHOWN = 3
"""Spec changes named beside one resource; more are counted."""


def spec_view(specs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """``specs`` (namespace, ClusterSpec) as plan-document data: namespace -> the spec as the stack file spells it."""
    return {namespace: spec.model_dump(mode="json", by_alias=True) for namespace, spec in specs}


def _walk(before: Any, after: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    """(path, old, new) where two spec values differ; list items with a ``name`` pair by it (``nodes[pve-b]``)."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        for key in sorted({*before, *after}):
            yield from _walk(before.get(key), after.get(key), f"{path}.{key}" if path else str(key))
    elif isinstance(before, list) and isinstance(after, list) and _named(before) and _named(after):
        old, new = {i["name"]: i for i in before}, {i["name"]: i for i in after}
        for name in [*old, *(n for n in new if n not in old)]:
            yield from _walk(old.get(name), new.get(name), f"{path}[{name}]")
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            yield from _walk(b, a, f"{path}[{i}]")
    elif before != after:
        yield path, before, after


def _named(items: list[Any]) -> bool:
    names = [i.get("name") for i in items if isinstance(i, Mapping)]
    return len(names) == len(items) and all(isinstance(n, str) for n in names) and len(set(names)) == len(names)


def _short(value: Any) -> str:
    """A spec value on one line: a string as written, anything else as JSON; escaped, cut after 60 characters."""
    if value is None:
        return "(none)"
    text = escape_controls(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True))
    return text if len(text) <= 60 else text[:57] + "..."


def spec_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, list[str]]:
    """Machine name -> its changed spec fields as ``path: old → new`` (a worker's include its Proxmox node's);
    ``""`` -> the cluster-wide ones. Empty when either document has no ``specs``."""
    old, new = before.get("specs"), after.get("specs")
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return {}
    out: dict[str, list[str]] = {}
    host_of: dict[str, str] = {}
    for namespace in sorted({*old, *new}):
        spec_old, spec_new = old.get(namespace) or {}, new.get(namespace) or {}
        for worker in [*spec_old.get("workers", []), *spec_new.get("workers", [])]:
            if isinstance(worker, Mapping) and isinstance(worker.get("name"), str):
                host_of[worker["name"]] = str(worker.get("node"))
        for path, b, a in _walk(spec_old, spec_new, ""):
            owner = _owner(path)
            where = f"{namespace}:cluster." if len(old) > 1 or len(new) > 1 else "cluster."
            out.setdefault(owner, []).append(f"{where}{path}: {_short(b)} → {_short(a)}")
    for worker, host in host_of.items():
        if host in out and worker != host:
            out.setdefault(worker, [])
            out[worker] += [line for line in out[host] if line not in out[worker]]
    return out


def _owner(path: str) -> str:
    """The machine a spec path belongs to (``proxmox.nodes[pve-b]...``, ``workers[gpu-a]...``), else ``""``."""
    for head in ("proxmox.nodes[", "workers["):
        if path.startswith(head):
            return path[len(head) :].split("]", 1)[0]
    return ""


def context_of(name: str, changes: Mapping[str, Sequence[str]]) -> str:
    """The spec changes behind resource ``name`` (``<cluster>-<machine>-<role>``): its machine's, else the
    cluster-wide ones; empty when the spec did not change."""
    padded = f"-{name}-"
    machines = [m for m in changes if m and (f"-{m}-" in padded)]
    lines = list(changes[max(machines, key=len)]) if machines else list(changes.get("", []))
    if not lines:
        return ""
    more = f" and {len(lines) - SHOWN} more" if len(lines) > SHOWN else ""
    return "with the stack file's " + "; ".join(lines[:SHOWN]) + more
