"""GPU nodes as the Kubernetes layer sees them, whoever provisioned them. Pure.

``GpuNode`` is what the GPU stack (labels, sharing ConfigMaps, operator values, capacity, KubeVirt devices) is
computed from: a Proxmox worker of the cluster spec becomes one (``proxmox_gpu_cluster.core.cluster_nodes``), and an
existing node, bare metal or someone else's VM, is described with ``ExistingGpuNode``: GPUs by model and count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, model_validator

from proxmox_gpu_cluster.core.catalog import CATALOG, GpuModel
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.mig import mig_config_problems
from proxmox_gpu_cluster.core.spec_base import GpuModelKey, Int, MigConfig, Name, SpecModel, VgpuType
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
        if self.time_slicing is not None and self.sharing == "none":
            problems.append(Problem("timeSlicing", "only applies when sharing is time-slicing or mig"))
        if self.sharing == "time-slicing" and self.time_slicing is None:
            problems.append(Problem("timeSlicing", "sharing time-slicing needs timeSlicing.replicas"))
        if self.sharing == "mig":
            if self.mig is None:
                problems.append(Problem("mig", "sharing mig needs a MIG config (a name like all-1g.5gb or a geometry)"))
            for key in self.gpus:
                model = CATALOG[key]
                if not model.mig_capable:
                    problems.append(Problem("mig", f"{key} does not support MIG"))
                elif self.mig is not None:  # the rules a worker's GPUs get (placement, known profiles)
                    problems.extend(Problem("mig", m) for m in mig_config_problems(model, self.mig))
        elif self.mig is not None:
            problems.append(Problem("mig", f"only applies when sharing is mig (sharing is {self.sharing})"))
        if self.workload != "container" and (self.sharing != "none" or self.dra):
            problems.append(Problem("workload", f"{self.workload} nodes hand whole GPUs to VMs: no sharing, no DRA"))
        if (self.workload == "vm-vgpu") != (self.vgpu_type is not None):
            problems.append(Problem("vgpuType", "set exactly when workload is vm-vgpu"))
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
