"""MIG geometry checks: can a set of GPU instances actually be placed on one GPU?

Summing slices is not enough: ``4g.20gb + 4g.20gb`` fits 8 memory slices on paper but both instances can only
start at slice 0. So this searches real placements over the memory-slice grid, using the start positions
NVIDIA's MIG User Guide lists per profile. Pure functions; nothing here imports Pulumi.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from proxmox_gpu_cluster.core.catalog import GpuModel, MigProfile
from proxmox_gpu_cluster.core.quoting import shown

if TYPE_CHECKING:  # nodes.py imports this module
    from proxmox_gpu_cluster.core.nodes import GpuNode


def place(model: GpuModel, geometry: Mapping[str, int]) -> dict[str, list[int]] | None:
    """Find start slices for every instance of ``geometry`` on one ``model`` GPU.

    Returns profile -> sorted start slices, or None when no placement exists. Raises ValueError for a profile
    the model does not have (callers report unknown profiles before asking for a placement).
    """
    if model.mig is None:
        raise ValueError(f"{model.key} does not support MIG")
    instances: list[MigProfile] = []
    for name, count in geometry.items():
        profile = model.mig.profile(name)
        if profile is None:
            raise ValueError(f"{model.key} has no MIG profile {shown(name)}")
        instances.extend([profile] * count)
    if sum(p.compute_slices for p in instances) > model.mig.compute_slices:
        return None
    # Largest first: big instances have the fewest legal starts, so the search fails fast.
    instances.sort(key=lambda p: (-p.memory_slices, len(p.starts), p.name))
    used = [False] * model.mig.memory_slices
    chosen: list[tuple[str, int]] = []

    def search(i: int) -> bool:
        if i == len(instances):
            return True
        profile = instances[i]
        # Identical instances are interchangeable: start after the previous one to skip permutations.
        floor = chosen[-1][1] + 1 if chosen and instances[i - 1] is profile else 0
        for start in profile.starts:
            end = start + profile.memory_slices
            if start < floor or end > len(used) or any(used[start:end]):
                continue
            used[start:end] = [True] * profile.memory_slices
            chosen.append((profile.name, start))
            if search(i + 1):
                return True
            chosen.pop()
            used[start:end] = [False] * profile.memory_slices
        return False

    if not search(0):
        return None
    result: dict[str, list[int]] = {}
    for name, start in chosen:
        result.setdefault(name, []).append(start)
    return {name: sorted(starts) for name, starts in sorted(result.items())}


def mig_config_problems(model: GpuModel, config: str | Mapping[str, int]) -> list[str]:
    """Everything wrong with a MIG config (a mig-parted name or a geometry) on ``model``: the one rule set for
    workers and existing GPU nodes alike."""
    if isinstance(config, str):
        named = model.named_mig_configs()
        if config not in named:
            return [f"no MIG config {shown(config)} for {model.key} (known: {', '.join(named)})"]
        return []
    if not config:
        return ["empty MIG geometry; use all-disabled to turn MIG off"]
    return geometry_problems(model, config)


def geometry_problems(model: GpuModel, geometry: Mapping[str, int]) -> list[str]:
    """Everything wrong with ``geometry`` on ``model``, as messages; empty when it can be applied."""
    if model.mig is None:
        return [f"{model.key} does not support MIG"]
    problems: list[str] = []
    for name, count in geometry.items():
        profile = model.mig.profile(name)
        if profile is None:
            known = ", ".join(model.mig.profile_names)
            problems.append(f"{model.key} has no MIG profile {shown(name)} (known: {known})")
        elif count < 1:
            problems.append(f"{name}: instance count must be at least 1, got {count}")
        elif count > profile.max_instances:
            problems.append(f"{name}: at most {profile.max_instances} per {model.key}, got {count}")
    if problems:
        return problems
    media = sum(c for n, c in geometry.items() if n.endswith("+me"))
    if media > 1:
        problems.append(f"only one +me (media extension) instance fits a GPU, got {media}")
    elif place(model, geometry) is None:
        wanted = " + ".join(f"{c} x {n}" for n, c in geometry.items())
        problems.append(
            f"{wanted} cannot be placed on one {model.key} "
            f"({model.mig.compute_slices} compute / {model.mig.memory_slices} memory slices)"
        )
    return problems


def mig_modes(node: GpuNode) -> tuple[str, ...]:
    """The MIG mode each MIG-capable GPU of a container node must run, as ``INDEX=1|0`` (the steps' ``--mig-mode``):
    what mig-manager's config for the node's ``nvidia.com/mig.config`` says (render/sharing.py ``mig_config``): on
    where the GPU gets MIG devices, off everywhere else (``all-disabled``)."""
    if node.workload != "container":
        return ()
    gpus = [g for g in node.gpus if g.model.mig_capable]
    mig = node.sharing == "mig" and any(g.mig_config is not None for g in gpus)
    return tuple(f"{g.index}={int(mig and bool(g.mig_geometry))}" for g in gpus)
