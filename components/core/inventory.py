"""Resolve a worker's GPU claims against the Proxmox nodes' inventory and the catalog. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.nodes import NodeGpu

if TYPE_CHECKING:
    # Types only: the spec module runs the cross-field validation, which imports this module.
    from proxmox_gpu_cluster.core.spec import ClusterSpec, GpuAssignment, HostGpu, MigConfig, Worker


@dataclass(frozen=True)
class WorkerGpu(NodeGpu):
    """One GPU of a worker VM: a node GPU that is also a physical GPU of a Proxmox node."""

    host: HostGpu
    """The physical GPU in the Proxmox node."""


def effective_mig(worker: Worker, claim: GpuAssignment) -> MigConfig | None:
    """The MIG config that applies to ``claim``: its own, or the worker-wide one."""
    return claim.mig if claim.mig is not None else worker.mig


def find_host_gpu(spec: ClusterSpec, node: str, ref: str) -> HostGpu | None:
    """The GPU called ``ref`` on Proxmox node ``node``, or None."""
    for n in spec.proxmox.nodes:
        if n.name == node:
            return next((g for g in n.gpus if g.name == ref), None)
    return None


def worker_gpus(spec: ClusterSpec, worker: Worker) -> list[WorkerGpu]:
    """Resolve every GPU claim of ``worker``; claims that do not resolve are left out (validation reports them)."""
    out: list[WorkerGpu] = []
    for i, claim in enumerate(worker.gpus):
        host = find_host_gpu(spec, worker.node, claim.ref)
        if host is None:
            continue
        mig = effective_mig(worker, claim) if worker.sharing == "mig" else None
        out.append(WorkerGpu(index=i, host=host, model=CATALOG[host.model], mig_config=mig))
    return out
