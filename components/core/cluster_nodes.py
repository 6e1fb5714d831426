"""The cluster spec's nodes as the GPU stack sees them (workers, then bare-metal KubeVirt nodes), and what the
monitoring needs to know about them. Pure; the component adapters (``proxmox_gpu_cluster.cluster.adapters``) and
the capacity table build on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.inventory import worker_gpus
from proxmox_gpu_cluster.core.nodes import GpuNode, NodeGpu

if TYPE_CHECKING:
    # Types only: the spec module runs the cross-field validation, which imports this module.
    from proxmox_gpu_cluster.core.spec import ClusterSpec, KubeVirtNode, Worker


def worker_node(spec: ClusterSpec, worker: Worker) -> GpuNode:
    """A worker VM as the GPU stack sees it: its claimed GPUs resolved against its Proxmox node."""
    return GpuNode(
        name=worker.name,
        gpus=tuple(worker_gpus(spec, worker)),
        workload=worker.workload,
        sharing=worker.sharing,
        time_slicing=worker.time_slicing,
        vgpu_type=worker.vgpu_type,
        dra=worker.dra,
        taint=worker.taint,
        proxmox_node=worker.node,
    )


def kubevirt_node(node: KubeVirtNode) -> GpuNode:
    """An existing (bare-metal) KubeVirt node of ``kubevirt.nodes``."""
    gpus = tuple(NodeGpu(index=i, model=CATALOG[key], mig_config=None) for i, key in enumerate(node.model_keys))
    return GpuNode(name=node.name, gpus=gpus, workload=node.workload, vgpu_type=node.vgpu_type, taint=node.taint)


def gpu_nodes(spec: ClusterSpec) -> list[GpuNode]:
    """Every GPU node of the spec: the workers in spec order, then the bare-metal KubeVirt nodes."""
    return [worker_node(spec, w) for w in spec.workers] + [kubevirt_node(n) for n in spec.kubevirt.nodes]


@dataclass(frozen=True)
class MonitoringTargets:
    """What the alert rules and the dashboard need to know about the cluster's GPU nodes."""

    exporter_nodes: tuple[str, ...]
    """Nodes that run dcgm-exporter: those with container workloads (VM workloads bind GPUs to vfio-pci)."""
    row_remapping: bool
    """Whether any of those nodes has a GPU that remaps memory rows."""
    mig: bool
    """Whether any of those nodes partitions a GPU with MIG."""


def monitoring_targets(nodes: Sequence[GpuNode]) -> MonitoringTargets:
    """Which of ``nodes`` are monitored (container workloads) and what their GPUs can report."""
    containers = [n for n in nodes if n.workload == "container"]
    gpus = [g for n in containers for g in n.gpus]
    return MonitoringTargets(
        exporter_nodes=tuple(n.name for n in containers),
        row_remapping=any(g.model.row_remapping for g in gpus),
        mig=any(g.mig_geometry for g in gpus),
    )
