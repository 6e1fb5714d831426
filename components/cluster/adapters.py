"""Adapters from the cluster spec to each component's arguments: the one place where ``ClusterSpec`` is taken apart.

A component takes only what it uses, so a reader finds any behaviour in two hops: spec -> adapter (here) ->
component. Pure (no resources are created here).
"""

from __future__ import annotations

from collections.abc import Mapping

import pulumi

from proxmox_gpu_cluster.core.capacity import smoke_test_resource
from proxmox_gpu_cluster.core.cluster_nodes import MonitoringTargets, gpu_nodes, monitoring_targets
from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec, bootstrap_spec
from proxmox_gpu_cluster.core.inventory import worker_gpus
from proxmox_gpu_cluster.core.names import short_hash
from proxmox_gpu_cluster.core.spec import ClusterSpec, Worker
from proxmox_gpu_cluster.proxmox.worker_vm import WorkerVmArgs
from proxmox_gpu_cluster.render.gpu_stack import GpuStack

__all__ = [
    "GuestBootstrapSpec",
    "MonitoringTargets",
    "bootstrap",
    "gpu_stack",
    "monitoring",
    "smoke_test_resource",
    "worker_vm",
]


def gpu_stack(spec: ClusterSpec) -> GpuStack:
    """The operator settings and every GPU node of the spec, for ``GpuNodeLabels`` and ``GpuOperator``."""
    return GpuStack(operator=spec.gpu_operator, nodes=tuple(gpu_nodes(spec)), vgpu_manager=spec.kubevirt.vgpu_manager)


def monitoring(spec: ClusterSpec) -> MonitoringTargets:
    """The nodes ``GpuMonitoring`` expects an exporter on, and what their GPUs report."""
    return monitoring_targets(gpu_nodes(spec))


def bootstrap(spec: ClusterSpec, worker: Worker) -> GuestBootstrapSpec:
    """What ``GuestBootstrap`` needs to make ``worker`` a GPU node."""
    return bootstrap_spec(spec, worker)


def worker_vm(
    spec: ClusterSpec,
    worker: Worker,
    *,
    mappings: Mapping[str, pulumi.Input[str]],
    vendor_data_file_id: pulumi.Input[str],
    image_file_id: pulumi.Input[str] | None,
    ssh_private_key: pulumi.Input[str] | None,
) -> WorkerVmArgs:
    """What ``GpuWorkerVm`` needs of the spec for ``worker``, wired to its mappings and boot files; the node agent
    is installed on the worker's node by the layer (in the VM's ``opts.depends_on``)."""
    return WorkerVmArgs(
        worker=worker,
        gpu_models=tuple(g.model.key for g in worker_gpus(spec, worker)),
        ssh_public_keys=spec.guest.ssh_public_keys,
        mappings=mappings,
        vendor_data_file_id=vendor_data_file_id,
        image_file_id=image_file_id,
        password_auth=spec.proxmox.auth_mode == "password",
        node_ssh_address=spec.node(worker.node).ssh_address,
        node_ssh_user=spec.proxmox.ssh_user,
        ssh_private_key=ssh_private_key,
        host_agent_installed=True,
    )


def smoke_test_rerun_key(spec: ClusterSpec, stack: GpuStack) -> str:
    """What the smoke-test Job depends on: the driver build, the sharing ConfigMaps (time-slicing, MIG geometry).
    A change of any of them re-runs the Job."""
    op = spec.gpu_operator
    return short_hash(
        "|".join([op.driver_mode, op.driver_branch, op.driver_version or "", stack.device_plugin.name, stack.mig.name]),
        12,
    )
