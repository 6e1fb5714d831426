"""GPU nodes as the Kubernetes layer sees them, whoever provisioned them. Pure.

``GpuNode`` is what the GPU stack (labels, sharing ConfigMaps, operator values, capacity, KubeVirt devices) is
computed from: a Proxmox worker of the cluster spec becomes one (``proxmox_gpu_cluster.core.cluster_nodes``), and an
existing node, bare metal or someone else's VM, is described with ``ExistingGpuNode``: GPUs by model and count.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Literal, get_args

from pydantic import Field, model_validator

from proxmox_gpu_cluster.core.catalog import CATALOG, GpuModel
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.mig import mig_config_problems
from proxmox_gpu_cluster.core.spec_base import (
    DNS_LABEL,
    VGPU_TYPE,
    GpuModelKey,
    Int,
    MigConfig,
    Name,
    SpecModel,
    VgpuType,
)
from proxmox_gpu_cluster.core.worker_spec import TimeSlicing

Workload = Literal["container", "vm-passthrough", "vm-vgpu"]
Sharing = Literal["none", "time-slicing", "mig"]


@dataclass(frozen=True)
class NodeGpu:
    """One GPU of a node."""

    index: int
    """Position on the node (the order the guest or host enumerates it in)."""
    model: GpuModel
    """Its catalog entry."""
    mig_config: MigConfig | None
    """The MIG config that applies; None unless the node's sharing is mig."""

    @property
    def mig_geometry(self) -> dict[str, int] | None:
        """Profile -> count for this GPU, or None when MIG is off or the config is unknown for the model."""
        if self.mig_config is None:
            return None
        if isinstance(self.mig_config, dict):
            return dict(self.mig_config)
        return self.model.named_mig_configs().get(self.mig_config)


@dataclass(frozen=True)
class GpuNode:
    """A Kubernetes node with NVIDIA GPUs and how its GPUs are offered."""

    name: str
    """Kubernetes node name."""
    gpus: tuple[NodeGpu, ...]
    """Its GPUs, in order."""
    workload: Workload = "container"
    """containers, or KubeVirt VMs with whole GPUs or vGPUs."""
    sharing: Sharing = "none"
    """How containers share the GPUs."""
    time_slicing: TimeSlicing | None = None
    """Device-plugin time-slicing, with sharing time-slicing (or on top of MIG)."""
    vgpu_type: str | None = None
    """vGPU type of a vm-vgpu node."""
    dra: bool = False
    """GPUs are allocated by the NVIDIA DRA driver instead of the device plugin."""
    taint: bool = False
    """Taint the node nvidia.com/gpu=true:NoSchedule."""
    proxmox_node: str = ""
    """The Proxmox node of a worker VM; "" for a node provisioned elsewhere."""

    @property
    def models(self) -> tuple[GpuModel, ...]:
        """One catalog entry per GPU."""
        return tuple(g.model for g in self.gpus)


class ExistingGpuNode(SpecModel):
    """An existing Kubernetes node (bare metal, or a VM provisioned elsewhere) for the GPU-stack components."""

    name: Name = Field(description="Kubernetes node name.")
    gpus: dict[GpuModelKey, Annotated[Int, Field(ge=1, le=64)]] = Field(
        min_length=1, description="GPU model -> how many the node has, e.g. ``{A10: 2}``."
    )
    workload: Workload = Field(default="container", description="What the node runs: containers or KubeVirt VMs.")
    sharing: Sharing = Field(default="none", description="How containers share the node's GPUs.")
    time_slicing: TimeSlicing | None = Field(default=None, description="Settings when sharing is time-slicing.")
    mig: MigConfig | None = Field(default=None, description="MIG config of every GPU when sharing is mig.")
    vgpu_type: VgpuType | None = Field(default=None, description="vGPU type for vm-vgpu, e.g. ``A10-24Q``.")
    dra: bool = Field(default=False, description="Allocate the GPUs with the NVIDIA DRA driver.")
    taint: bool = Field(default=False, description="Taint the node nvidia.com/gpu=true:NoSchedule.")

    @model_validator(mode="after")
    def _consistent(self) -> ExistingGpuNode:
        problems: list[Problem] = []
        if self.sharing == "mig" and self.mig is None:
            problems.append(Problem("mig", "sharing mig needs a MIG config (a name like all-1g.5gb or a geometry)"))
        elif self.mig is not None and self.sharing != "mig":
            problems.append(Problem("mig", f"only applies when sharing is mig (sharing is {self.sharing})"))
        # The rules every GPU node keeps (placement, known profiles, workload), on the node as the stack sees it.
        problems += gpu_node_problems(self.resolve(), mig_at=lambda _: "mig", camel=True)
        if problems:
            raise SpecViolations(problems)
        return self

    def resolve(self) -> GpuNode:
        """The node as the GPU stack sees it."""
        keys = [key for key, count in self.gpus.items() for _ in range(count)]
        mig = self.mig if self.sharing == "mig" else None
        return GpuNode(
            name=self.name,
            gpus=tuple(NodeGpu(index=i, model=CATALOG[k], mig_config=mig) for i, k in enumerate(keys)),
            workload=self.workload,
            sharing=self.sharing,
            time_slicing=self.time_slicing,
            vgpu_type=self.vgpu_type,
            dra=self.dra,
            taint=self.taint,
        )


_CAMEL = {"time_slicing": "timeSlicing", "vgpu_type": "vgpuType"}
_WORKLOADS: tuple[str, ...] = get_args(Workload)
_SHARING: tuple[str, ...] = get_args(Sharing)


def gpu_node_problems(
    node: GpuNode, *, mig_at: Callable[[int], str] | None = None, camel: bool = False
) -> list[Problem]:
    """What makes ``node`` unusable, whoever built it (``ExistingGpuNode``, or a ``GpuNode`` by hand): its shape
    first (a hand-built node is not validated by pydantic), then the sharing, MIG and workload rules. Paths are
    below the node, in field names (``camel``: as a stack file spells them); ``mig_at(i)`` is where the MIG config
    of GPU ``i`` comes from (default ``gpus[i].mig_config``)."""
    shape = _shape_problems(node)
    if shape:
        return shape

    def at(name: str) -> str:
        return _CAMEL.get(name, name) if camel else name

    mig_path = mig_at or (lambda i: f"gpus[{i}].mig_config")
    out: list[Problem] = []
    if node.time_slicing is not None and node.sharing == "none":
        out.append(Problem(at("time_slicing"), "only applies when sharing is time-slicing or mig"))
    if node.sharing == "time-slicing" and node.time_slicing is None:
        out.append(Problem(at("time_slicing"), "sharing time-slicing needs timeSlicing.replicas"))
    for i, gpu in enumerate(node.gpus):
        if node.sharing != "mig":
            if gpu.mig_config is not None:
                out.append(Problem(mig_path(i), f"only applies when sharing is mig (sharing is {node.sharing})"))
        elif not gpu.model.mig_capable:
            out.append(Problem(mig_path(i), f"{gpu.model.key} does not support MIG"))
        elif gpu.mig_config is None:
            out.append(Problem(mig_path(i), "sharing mig needs a MIG config (a name like all-1g.5gb or a geometry)"))
        else:  # the rules a worker's GPUs get (placement, known profiles)
            out += [Problem(mig_path(i), m) for m in mig_config_problems(gpu.model, gpu.mig_config)]
    if node.workload != "container" and (node.sharing != "none" or node.dra):
        out.append(Problem("workload", f"{node.workload} nodes hand whole GPUs to VMs: no sharing, no DRA"))
    if (node.workload == "vm-vgpu") != (node.vgpu_type is not None):
        out.append(Problem(at("vgpu_type"), "set exactly when workload is vm-vgpu"))
    return out


def _shape_problems(node: GpuNode) -> list[Problem]:
    """The types and values pydantic checks on an ``ExistingGpuNode``, for a ``GpuNode`` built by hand."""
    out: list[Problem] = []
    if not isinstance(node.name, str) or not re.fullmatch(DNS_LABEL, node.name):
        out.append(Problem("name", f"expected a Kubernetes node name (a lower-case DNS label), got {node.name!r:.80}"))
    if node.workload not in _WORKLOADS:
        out.append(Problem("workload", f"expected one of {', '.join(_WORKLOADS)}, got {node.workload!r:.40}"))
    if node.sharing not in _SHARING:
        out.append(Problem("sharing", f"expected one of {', '.join(_SHARING)}, got {node.sharing!r:.40}"))
    if node.time_slicing is not None and not isinstance(node.time_slicing, TimeSlicing):
        out.append(Problem("time_slicing", f"expected a TimeSlicing, got {type(node.time_slicing).__name__}"))
    if node.vgpu_type is not None and not (isinstance(node.vgpu_type, str) and re.fullmatch(VGPU_TYPE, node.vgpu_type)):
        out.append(Problem("vgpu_type", f"expected a vGPU type like A10-24Q, got {node.vgpu_type!r:.40}"))
    out += [
        Problem(flag, "expected True or False") for flag in ("dra", "taint") if type(getattr(node, flag)) is not bool
    ]
    if not isinstance(node.proxmox_node, str):
        out.append(
            Problem("proxmox_node", f"expected a Proxmox node name or '', got {type(node.proxmox_node).__name__}")
        )
    if not isinstance(node.gpus, tuple) or not node.gpus:
        out.append(Problem("gpus", "expected a non-empty tuple of NodeGpu"))
        return out
    for i, gpu in enumerate(node.gpus):
        if not isinstance(gpu, NodeGpu):
            out.append(Problem(f"gpus[{i}]", f"expected a NodeGpu, got {type(gpu).__name__}"))
        elif not isinstance(gpu.model, GpuModel):
            known = ", ".join(CATALOG)
            out.append(
                Problem(f"gpus[{i}].model", f"expected a catalog entry (catalog.CATALOG[key]; known: {known}), "
                        f"got {gpu.model!r:.40}")
            )  # fmt: skip
        elif type(gpu.index) is not int or gpu.index != i:
            # mig-parted addresses a node's GPUs by this index: it is the GPU's position, as the node enumerates them.
            out.append(
                Problem(f"gpus[{i}].index", f"expected {i} (the GPU's position on the node), got {gpu.index!r:.20}")
            )
        elif gpu.mig_config is not None and not _mig_config_shape(gpu.mig_config):
            out.append(Problem(f"gpus[{i}].mig_config", "expected a MIG config name or a {profile: count} geometry"))
    return out


def _mig_config_shape(config: object) -> bool:
    """A config name, or a geometry of profile names and whole counts (not booleans)."""
    if isinstance(config, str):
        return True
    return isinstance(config, dict) and all(isinstance(k, str) and type(v) is int for k, v in config.items())
