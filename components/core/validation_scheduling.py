"""The rules on quotas and PriorityClasses, shared by the cluster spec's validation and the component args
(``GpuQuotasArgs``, ``GpuPriorityClassesArgs``): one rule, whichever door the values come through. Pure.

Paths are written as the stack file spells them, below ``base`` (``quotas``, ``priorityClasses``); component args
turn them into Python field names (``spec_base.field_path``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from proxmox_gpu_cluster.core.errors import Problem

if TYPE_CHECKING:
    from proxmox_gpu_cluster.core.scheduling_spec import PriorityClassSpec, Quota

T = TypeVar("T")


def dupes(items: Iterable[T], path: str, what: str) -> list[Problem]:
    """A problem at ``path.format(i=...)`` for every item equal to an earlier one."""
    seen: dict[T, int] = {}
    out: list[Problem] = []
    for i, item in enumerate(items):
        if item in seen:
            first = path.format(i=seen[item]).rsplit(".", 1)[0]
            out.append(Problem(path.format(i=i), f"{what} {item!r} is already used by {first}"))
        else:
            seen[item] = i
    return out


def priority_class_problems(classes: Sequence[PriorityClassSpec], base: str = "priorityClasses") -> list[Problem]:
    """Names used twice, more than one global default."""
    out = dupes((c.name for c in classes), base + "[{i}].name", "PriorityClass name")
    defaults = [i for i, c in enumerate(classes) if c.global_default]
    out += [
        Problem(f"{base}[{i}].globalDefault", f"{base}[{defaults[0]}] is already the default") for i in defaults[1:]
    ]
    return out


def quota_problems(quotas: Sequence[Quota], base: str = "quotas") -> list[Problem]:
    """Two quotas for one namespace (and PriorityClass): Kubernetes would enforce both, the smaller wins."""
    scoped = (q.namespace + (f" (PriorityClass {q.priority_class})" if q.priority_class else "") for q in quotas)
    return dupes(scoped, base + "[{i}].namespace", "namespace")


def quota_capacity_problems(
    quotas: Sequence[Quota],
    advertised: Mapping[str, int],
    classes: Collection[str],
    base: str = "quotas",
    classes_at: str = "priorityClasses",
) -> list[Problem]:
    """A quota on a resource no node advertises (a typo, or a MIG profile nobody configured), or scoped to a
    PriorityClass that is not one of ``classes`` (named ``classes_at`` in the message)."""
    out: list[Problem] = []
    for q_i, quota in enumerate(quotas):
        for resource in quota.resources:
            if resource not in advertised:
                known = ", ".join(sorted(advertised)) or "nothing"
                out.append(
                    Problem(
                        f"{base}[{q_i}].resources.{resource}", f"no worker advertises {resource} (advertised: {known})"
                    )
                )
        if quota.priority_class is not None and quota.priority_class not in classes:
            out.append(
                Problem(
                    f"{base}[{q_i}].priorityClass",
                    f"{quota.priority_class} is not one of {classes_at} ({', '.join(sorted(classes)) or 'none'})",
                )
            )
    return out


def quota_capacity_warnings(quotas: Sequence[Quota], advertised: Mapping[str, int], base: str = "quotas") -> list[str]:
    """Quotas larger than what all nodes together advertise (legal, but a sign of a typo)."""
    return [
        f"{base}[{i}] ({q.namespace}): {name} {count} exceeds the cluster's capacity of {advertised.get(name, 0)}"
        for i, q in enumerate(quotas)
        for name, count in sorted(q.resources.items())
        if count > advertised.get(name, 0)
    ]
