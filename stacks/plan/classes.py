"""Each changed spec field of a diff with its change class (``core/change_classes.py``), the drains the classes
announce, and the changes ``pulumi up`` has no supported path for. Pure (plan documents in, plain data out).

The two plan documents carry each cluster's validated spec (``specs``, ``plan/context.py``); this module walks
them beside the spec models (the models ``docs/spec.md`` is generated from), so each changed value is named by its
path in the stack file and by its field, ``Worker.cores``, the key of the one table. A document without ``specs``
(an older revision's) yields no field changes, and then nothing is filtered or refused from them.

Refusals are made here because only a diff knows the old value: the offline plan of one spec cannot tell a new
``kubernetes.version`` from an old one, and the program under ``pulumi up`` registers its resources without the
previous inputs. A refused change marks the rows of the resources that would fail (``plan.diff.diff`` adds the
reason to their ``fails``, so the summary says WILL FAIL) and is listed with its procedure.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from proxmox_gpu_cluster.core.change_classes import FieldClass, field_class
from proxmox_gpu_cluster.core.input_safety import escape_controls
from proxmox_gpu_cluster.core.spec import ClusterSpec

ALL = "*"
"""In ``rolled_machines``: a cluster-wide change, every worker."""


@dataclass(frozen=True)
class FieldChange:
    """One changed spec value and what its field's class says about it."""

    path: str
    """As the stack file spells it, ``cluster.workers[gpu-a10-a].cores`` (``<namespace>:cluster.`` with several)."""
    field: str
    """The table's key, ``Worker.cores``; ``""`` for a value under no known field."""
    old: Any
    new: Any
    owner: str
    """The worker or Proxmox node the value belongs to; ``""`` for a cluster-wide one."""
    namespace: str
    refused: str = ""
    """Why ``pulumi up`` cannot carry it out, and what to do instead (one line); empty when it can."""

    @property
    def klass(self) -> FieldClass | None:
        """The field's class (an item removed from a list: the class of its removal)."""
        return field_class(self.field, removed=self.new is None and self.old is not None)

    @property
    def drains(self) -> bool:
        """Whether the steps drain joined nodes for it: its class's answer, but for a value unset where the class
        says that leaves the machines as they are."""
        klass = self.klass
        return klass is not None and klass.drains and not (klass.still_when_unset and self.new is None)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The spec model a field's value is (or holds a list or optional of), None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is dict:
        return None
    if origin in (typing.Union, types.UnionType, typing.Annotated, tuple, list):
        models = [m for arg in typing.get_args(annotation) if (m := _model_of(arg)) is not None]
        return models[0] if models else None
    return None


def _fields(model: type[BaseModel]) -> dict[str, tuple[str, type[BaseModel] | None]]:
    """Stack-file key -> (table key, the model its value is made of)."""
    return {
        (f.alias or name): (f"{model.__name__}.{f.alias or name}", _model_of(f.annotation))
        for name, f in model.model_fields.items()
    }


def _named(items: list[Any]) -> bool:
    names = [i.get("name") for i in items if isinstance(i, Mapping)]
    return len(names) == len(items) and all(isinstance(n, str) for n in names) and len(set(names)) == len(names)


def _walk(
    before: Any, after: Any, model: type[BaseModel], path: str, field: str
) -> Iterator[tuple[str, str, Any, Any]]:
    """(path, field, old, new) where two spec values of ``model`` differ. Items of a list of models pair by
    ``name`` (else by position when the lengths match): an item added or removed is a change of the list field."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        fields = _fields(model)
        for key in sorted({*before, *after}):
            sub_field, sub_model = fields.get(key, ("", None))
            sub = f"{path}.{key}" if path else str(key)
            b, a = before.get(key), after.get(key)
            if sub_model is None or b is None or a is None:
                if b != a:
                    yield sub, sub_field, b, a
            elif isinstance(b, list) and isinstance(a, list):
                yield from _walk_list(b, a, sub_model, sub, sub_field)
            else:
                yield from _walk(b, a, sub_model, sub, sub_field)
    elif before != after:
        yield path, field, before, after


def _walk_list(
    before: list[Any], after: list[Any], model: type[BaseModel], path: str, field: str
) -> Iterator[tuple[str, str, Any, Any]]:
    if _named(before) and _named(after):
        old, new = {i["name"]: i for i in before}, {i["name"]: i for i in after}
        for name in [*old, *(n for n in new if n not in old)]:
            b, a = old.get(name), new.get(name)
            if b is None or a is None:
                if b != a:
                    yield f"{path}[{name}]", field, b, a
            else:
                yield from _walk(b, a, model, f"{path}[{name}]", field)
    elif len(before) == len(after) and all(isinstance(i, Mapping) for i in [*before, *after]):
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            yield from _walk(b, a, model, f"{path}[{i}]", field)
    elif before != after:
        yield path, field, before, after


def _owner(path: str) -> str:
    """The machine a spec path (without its ``cluster.`` head) belongs to, else ``""``."""
    for head in ("proxmox.nodes[", "workers["):
        if path.startswith(head):
            return path[len(head) :].split("]", 1)[0]
    return ""


def _minor(version: Any) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in str(version).split(".")[:2])
    except ValueError:
        return ()


def _names(spec: Mapping[str, Any], key: str) -> set[str]:
    return {w["name"] for w in spec.get(key, []) if isinstance(w, Mapping) and isinstance(w.get("name"), str)}


def _refusal(field: str, old: Any, new: Any, spec_old: Mapping[str, Any], spec_new: Mapping[str, Any]) -> str:
    """Why the change cannot be carried out (with the procedure), or ``""``."""
    klass = field_class(field)
    if klass is None or old is None or new is None:
        return ""
    why = klass.refused_when or klass.what
    if field == "KubernetesSpec.version":
        joined = _names(spec_old, "workers") & _names(spec_new, "workers")
        kubeadm = (spec_old.get("kubernetes") or {}).get("joinMethod") == "kubeadm"
        # no worker joined under the old minor: new workers join at the new one; joined ones go up one minor
        # (guest_join.sh refuses the rest on the machine too)
        a, b = _minor(old), _minor(new)
        one_up = len(a) == len(b) == 2 and a[0] == b[0] and b[1] == a[1] + 1
        refused = a != b and not one_up and bool(joined) and kubeadm
    elif field == "Worker.diskGiB":
        refused = isinstance(old, int) and isinstance(new, int) and new < old
    else:
        refused = klass.change == "refused"
    return f"{why}; instead: {klass.procedure}" if refused else ""


def _renames(namespace: str, where: str, spec_old: Mapping[str, Any], spec_new: Mapping[str, Any]) -> list[FieldChange]:
    """A worker removed and one added with the same vmid on the same node: a rename (``Worker.name``)."""
    old = {(w.get("vmid"), w.get("node")): w.get("name") for w in spec_old.get("workers", []) if isinstance(w, Mapping)}
    out = []
    for w in spec_new.get("workers", []):
        was = old.get((w.get("vmid"), w.get("node"))) if isinstance(w, Mapping) else None
        if isinstance(was, str) and was != w.get("name") and w.get("name") not in _names(spec_old, "workers"):
            klass = field_class("Worker.name")
            assert klass is not None
            path = f"{where}workers[{w['name']}].name"
            why = f"{klass.what}; instead: {klass.procedure}"
            out.append(FieldChange(path, "Worker.name", was, w["name"], w["name"], namespace, why))
    return out


def field_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[FieldChange]:
    """Every changed spec value between two plan documents, with its field and refusal (empty without ``specs``)."""
    old, new = before.get("specs"), after.get("specs")
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return []
    out: list[FieldChange] = []
    for namespace in sorted({*old, *new}):
        spec_old, spec_new = old.get(namespace) or {}, new.get(namespace) or {}
        where = f"{namespace}:cluster." if len(old) > 1 or len(new) > 1 else "cluster."
        for path, field, b, a in _walk(spec_old, spec_new, ClusterSpec, "", "ClusterSpec"):
            why = _refusal(field, b, a, spec_old, spec_new)
            out.append(FieldChange(where + path, field, b, a, _owner(path), namespace, why))
        out += _renames(namespace, where, spec_old, spec_new)
    return out


def rolled_machines(before: Mapping[str, Any], after: Mapping[str, Any]) -> set[str] | None:
    """The workers a changed field of class ``rolled`` may drain (``ALL`` for a cluster-wide one; a Proxmox node's
    field: the workers on it); None when the documents carry no specs (nothing can be said)."""
    if not isinstance(before.get("specs"), Mapping) or not isinstance(after.get("specs"), Mapping):
        return None
    hosts: dict[str, set[str]] = {}
    for document in (before, after):
        for spec in document["specs"].values():
            for w in spec.get("workers", []):
                hosts.setdefault(str(w.get("node")), set()).add(str(w.get("name")))
    out: set[str] = set()
    for change in field_changes(before, after):
        if not change.drains:
            continue
        out |= {ALL} if not change.owner else {change.owner, *hosts.get(change.owner, set())}
    return out


def refused_rows(before: Mapping[str, Any], after: Mapping[str, Any], prefix: str = "") -> dict[str, list[str]]:
    """Resource name -> why it will fail at ``pulumi up`` because of a refused spec change: a worker's VM for a
    datastore move or a smaller disk, every joined worker's join step for a Kubernetes minor lower or more than one
    above the old one."""
    out: dict[str, list[str]] = {}
    specs = after.get("specs") or {}
    for change in field_changes(before, after):
        if not change.refused:
            continue
        line = f"will fail: {change.path} {_short(change.old)} → {_short(change.new)}: {change.refused}"
        if change.field in ("Worker.datastore", "Worker.diskGiB"):
            out.setdefault(f"{prefix}{change.owner}-vm", []).append(line)
        elif change.field == "KubernetesSpec.version":
            old_spec = (before.get("specs") or {}).get(change.namespace) or {}
            joined = _names(old_spec, "workers") & _names(specs.get(change.namespace) or {}, "workers")
            for worker in sorted(joined):
                out.setdefault(f"{prefix}{worker}-bootstrap-join", []).append(line)
    return out


def _short(value: Any) -> str:
    """A spec value on one line: a string as written, a named item of a list as ``(an item)``, anything else as
    JSON; escaped, cut after 60 characters."""
    if value is None:
        return "(none)"
    if isinstance(value, Mapping) and isinstance(value.get("name"), str):
        return "(an item)"  # an item added to or removed from a list: its path names it
    text = escape_controls(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True))
    return text if len(text) <= 60 else text[:57] + "..."


def class_document(changes: list[FieldChange]) -> list[dict[str, Any]]:
    """The field changes as plain data (the diff's ``--json`` summary)."""
    out = []
    for c in changes:
        klass = c.klass
        out.append(
            {
                "path": c.path,
                "field": c.field,
                "from": _short(c.old),
                "to": _short(c.new),
                "class": klass.change if klass else "unclassified",
                "supported": bool(klass and klass.supported) and not c.refused,
                "what": klass.what if klass else "",
                "procedure": klass.procedure if klass and (c.refused or not klass.supported) else "",
                "refused": c.refused,
            }
        )
    return out
