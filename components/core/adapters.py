"""Adapters from the cluster spec to the arguments of the GPU-stack components. Pure.

A component takes only what it uses; these functions derive those arguments from a validated ``ClusterSpec``, so
a reader finds any behaviour in two hops: spec -> adapter -> component.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxmox_gpu_cluster.core.inventory import worker_gpus
from proxmox_gpu_cluster.core.spec import ClusterSpec


@dataclass(frozen=True)
class MonitoringTargets:
    """What the alert rules and the dashboard need to know about the cluster's GPU nodes."""

    exporter_nodes: tuple[str, ...]
    """Nodes that run dcgm-exporter: workers with container workloads (VM workloads bind GPUs to vfio-pci)."""
    row_remapping: bool
    """Whether any of those nodes has a GPU that remaps memory rows."""
    mig: bool
    """Whether any of those nodes partitions a GPU with MIG."""


def monitoring_targets(spec: ClusterSpec) -> MonitoringTargets:
    """The monitored nodes of ``spec`` and what their GPUs can report."""
    containers = [w for w in spec.workers if w.workload == "container"]
    gpus = [g for w in containers for g in worker_gpus(spec, w)]
    return MonitoringTargets(
        exporter_nodes=tuple(w.name for w in containers),
        row_remapping=any(g.model.row_remapping for g in gpus),
        mig=any(g.mig_geometry for g in gpus),
    )
