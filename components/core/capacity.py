"""What each worker node will advertise to the Kubernetes scheduler. Pure.

The rules follow the NVIDIA device plugins: whole GPUs are ``nvidia.com/gpu``; time-slicing multiplies the
count by ``replicas`` (``<name>.shared`` with renameByDefault); MIG instances are ``nvidia.com/mig-<profile>``
under the mixed strategy and ``nvidia.com/gpu`` under single; the sandbox device plugin advertises
passthrough GPUs by their pci.ids name and vGPUs as ``nvidia.com/NVIDIA_<type>``. DRA nodes advertise no
extended resources: their GPUs are ResourceSlice devices of the DeviceClasses ``gpu.nvidia.com`` (whole GPUs)
and ``mig.nvidia.com`` (MIG instances), listed separately as ``devices``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proxmox_gpu_cluster.core.catalog import CATALOG, GpuModel, MigProfile
from proxmox_gpu_cluster.core.cluster_nodes import gpu_nodes, worker_node
from proxmox_gpu_cluster.core.nodes import GpuNode
from proxmox_gpu_cluster.core.validation_scheduling import quota_capacity_warnings

if TYPE_CHECKING:
    # Types only: the spec module runs the cross-field validation, which imports this module.
    from proxmox_gpu_cluster.core.spec import ClusterSpec, Worker

GPU = "nvidia.com/gpu"
DRA_GPU = "gpu.nvidia.com"
DRA_MIG = "mig.nvidia.com"


@dataclass(frozen=True)
class WorkerCapacity:
    """One row of the capacity table."""

    worker: str
    """Kubernetes node name (the VM name of a worker)."""
    node: str
    """Proxmox node; ``BARE_METAL`` ("") for an existing KubeVirt node."""
    gpus: dict[str, int]
    """GPU model -> count passed through."""
    workload: str
    """container, vm-passthrough or vm-vgpu."""
    sharing: str
    """none, time-slicing or mig."""
    resources: dict[str, int]
    """Extended resource -> quantity the node advertises."""
    devices: dict[str, int] = field(default_factory=dict)
    """DRA DeviceClass -> devices the node publishes (DRA nodes only)."""


def node_capacity(node: GpuNode, mig_strategy: str) -> WorkerCapacity:
    """The capacity row of one GPU node; ``mig_strategy`` is the operator's (single advertises MIG devices as
    ``nvidia.com/gpu``)."""
    resources: Counter[str] = Counter()
    devices: Counter[str] = Counter()
    if node.dra and node.workload == "container":
        for g in node.gpus:
            geometry = g.mig_geometry
            devices[DRA_MIG if geometry else DRA_GPU] += sum(geometry.values()) if geometry else 1
    elif node.workload != "container":
        resources.update(vm_resources(node.workload, node.models, node.vgpu_type))
    else:
        for g in node.gpus:
            geometry = g.mig_geometry
            if not geometry:  # no MIG, or all-disabled: a whole GPU
                resources[GPU] += 1
                continue
            for profile, count in geometry.items():
                suffix = MigProfile.suffix_of(profile)
                resources[GPU if mig_strategy == "single" else f"nvidia.com/mig-{suffix}"] += count
        ts = node.time_slicing
        if ts is not None and node.sharing in ("time-slicing", "mig"):
            suffix = ".shared" if ts.rename_by_default else ""
            resources = Counter({f"{name}{suffix}": n * ts.replicas for name, n in resources.items()})
    models = Counter(m.key for m in node.models)
    return WorkerCapacity(
        worker=node.name,
        node=node.proxmox_node,
        gpus={k: models[k] for k in CATALOG if k in models},
        workload=node.workload,
        sharing=node.sharing,
        resources=dict(sorted(resources.items())),
        devices=dict(sorted(devices.items())),
    )


def worker_capacity(spec: ClusterSpec, worker: Worker) -> WorkerCapacity:
    """The capacity row of one worker of a valid spec."""
    return node_capacity(worker_node(spec, worker), spec.gpu_operator.mig_strategy)


def vgpu_resource(vgpu_type: str) -> str:
    """The extended resource the sandbox device plugin advertises for a vGPU type."""
    return f"nvidia.com/NVIDIA_{vgpu_type}"


def vm_resources(workload: str, models: Sequence[GpuModel], vgpu_type: str | None) -> Counter[str]:
    """What a KubeVirt node with GPUs of ``models`` advertises: each GPU whole (vm-passthrough), or as many
    ``vgpu_type`` vGPUs as its framebuffer holds (vm-vgpu; time-sliced vGPU types split the memory evenly)."""
    out: Counter[str] = Counter()
    if workload == "vm-passthrough":
        out.update(model.sandbox_resource_name for model in models)
    elif workload == "vm-vgpu" and vgpu_type is not None:
        size_gb = int(vgpu_type.rsplit("-", 1)[1][:-1])
        for model in models:
            out[vgpu_resource(vgpu_type)] += model.memory_mib // 1024 // size_gb
    return out


BARE_METAL = ""
"""``WorkerCapacity.node`` of a node the stack does not provision (no Proxmox node)."""


def capacity_table(spec: ClusterSpec) -> list[WorkerCapacity]:
    """A row per worker in spec order, then one per bare-metal KubeVirt node."""
    return [node_capacity(n, spec.gpu_operator.mig_strategy) for n in gpu_nodes(spec)]


def cluster_capacity(spec: ClusterSpec) -> dict[str, int]:
    """Total of every resource across all workers."""
    return advertised_total(capacity_table(spec))


def advertised_total(rows: Sequence[WorkerCapacity]) -> dict[str, int]:
    """Total of every resource the nodes of ``rows`` advertise."""
    total: Counter[str] = Counter()
    for row in rows:
        total.update(row.resources)
    return dict(sorted(total.items()))


def smoke_test_resource(spec: ClusterSpec) -> str | None:
    """The resource the smoke-test Job requests: a whole GPU if any container node advertises one, otherwise
    the shared or MIG resource with the most units (the likeliest to be free); None when there is none."""
    return smoke_test_resource_of(capacity_table(spec))


def container_resources(rows: Sequence[WorkerCapacity]) -> Counter[str]:
    """What the container nodes of ``rows`` advertise together (what a pod can request)."""
    total: Counter[str] = Counter()
    for row in rows:
        if row.workload == "container":
            total.update(row.resources)
    return total


def smoke_test_resource_of(rows: Sequence[WorkerCapacity]) -> str | None:
    """``smoke_test_resource`` for the nodes of ``rows``."""
    total = container_resources(rows)
    for preferred in (GPU, f"{GPU}.shared"):
        if total[preferred]:
            return preferred
    return min(total, key=lambda name: (-total[name], name)) if total else None


def quota_hard(resources: dict[str, int]) -> dict[str, str]:
    """ResourceQuota ``spec.hard`` for extended resources: Kubernetes allows only the ``requests.`` form."""
    return {f"requests.{name}": str(count) for name, count in sorted(resources.items())}


def quota_warnings(spec: ClusterSpec) -> list[str]:
    """Quotas larger than what the whole cluster advertises (legal, but a sign of a typo)."""
    return quota_capacity_warnings(spec.quotas, cluster_capacity(spec))


def capacity_output(rows: Sequence[WorkerCapacity]) -> dict[str, dict[str, Any]]:
    """The capacity table as a stack output (``capacity``): node -> proxmoxNode, gpus, workload, sharing,
    resources and DRA devices. The offline plan prints a program's table from it."""
    return {
        row.worker: {
            "proxmoxNode": row.node,
            "gpus": row.gpus,
            "workload": row.workload,
            "sharing": row.sharing,
            "resources": row.resources,
            "devices": row.devices,
        }
        for row in rows
    }


def capacity_from_output(output: Any) -> list[WorkerCapacity]:
    """Rows back from a ``capacity`` output written by ``capacity_output`` (entries of another shape are skipped)."""
    rows: list[WorkerCapacity] = []
    for name, row in (output or {}).items() if isinstance(output, dict) else ():
        if not isinstance(row, dict) or not isinstance(row.get("resources"), dict):
            continue
        rows.append(
            WorkerCapacity(
                worker=str(name),
                node=str(row.get("proxmoxNode") or BARE_METAL),
                gpus={str(k): int(v) for k, v in (row.get("gpus") or {}).items()},
                workload=str(row.get("workload") or "container"),
                sharing=str(row.get("sharing") or "none"),
                resources={str(k): int(v) for k, v in row["resources"].items()},
                devices={str(k): int(v) for k, v in (row.get("devices") or {}).items()},
            )
        )
    return rows
