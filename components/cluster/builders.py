"""The per-worker parts of a GpuCluster, each built from the spec through its adapter: guest bootstraps, MIG
rollouts, capacity gates and retirements. Every worker's parts wait only for that worker's own resources."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.cluster import adapters
from proxmox_gpu_cluster.cluster.providers import Secrets
from proxmox_gpu_cluster.cluster.proxmox_layer import ProxmoxLayer
from proxmox_gpu_cluster.core.capacity import WorkerCapacity
from proxmox_gpu_cluster.core.guest_spec import hardware_key
from proxmox_gpu_cluster.core.spec import ClusterSpec, Worker
from proxmox_gpu_cluster.gpu.gpu_node import GpuNodeLabels
from proxmox_gpu_cluster.guest.capacity_gate import (
    GateTarget,
    NodeCapacityGate,
    NodeCapacityGates,
    NodeCapacityGatesArgs,
)
from proxmox_gpu_cluster.guest.guest_bootstrap import GuestBootstrap, GuestBootstrapArgs, VmRestartArgs
from proxmox_gpu_cluster.guest.mig_rollout import MigDrain, MigDrainArgs, MigSettle, MigSettleArgs, MigVm
from proxmox_gpu_cluster.proxmox.worker_retirement import WorkerRetirement, WorkerRetirementArgs
from proxmox_gpu_cluster.render.gpu_stack import GpuStack

MIG_LABEL = "nvidia.com/mig.config"
OPERATOR_MIG_CONFIG = "default-mig-parted-config"
"""The operator's own mig-parted ConfigMap, mounted when the release names none (gpu-operator v26.7.0
controllers/object_controls.go, MigPartedDefaultConfigMapName)."""


def build_guests(
    prefix: str,
    spec: ClusterSpec,
    layer: ProxmoxLayer,
    secrets: Secrets,
    provider: command.Provider,
    *,
    kubernetes_provider: pulumi.ProviderResource,
    opts: pulumi.ResourceOptions,
) -> dict[str, GuestBootstrap]:
    """One bootstrap chain per worker VM, connecting to the VM's address; workers never wait for each other."""
    bootstraps: dict[str, GuestBootstrap] = {}
    for worker in spec.workers:
        vm = layer.vms.get(worker.name)
        if vm is None:
            continue
        bootstraps[worker.name] = GuestBootstrap(
            f"{prefix}-{worker.name}-bootstrap",
            GuestBootstrapArgs(
                bootstrap=adapters.bootstrap(spec, worker),
                host=vm.ip_address,
                user=worker.ssh_user,
                ssh_private_key=secrets.ssh_private_key,
                # None (no kubeadmJoinToken): each join gets its own token (GuestBootstrap's join-token step).
                join_token=secrets.join_token,
                ca_cert_hash=secrets.ca_cert_hash,
                replace_with=(vm.vm,),
                vm_restart=VmRestartArgs(
                    vmid=worker.vmid,
                    host=spec.node(worker.node).ssh_address,
                    ssh_user=spec.proxmox.ssh_user,
                    hardware=hardware_key(worker),
                    after=(layer.host_agents[worker.node],),
                ),
            ),
            # The Kubernetes one stores a minted join token's Secret.
            pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(providers=[provider, kubernetes_provider])),
        )
    return bootstraps


def _mig_step_args(spec: ClusterSpec, worker: Worker, geometry: str, bootstrap: GuestBootstrap) -> dict[str, Any]:
    op = spec.gpu_operator
    return {
        "bootstrap": adapters.bootstrap(spec, worker),
        "mig_config": geometry,
        "operator_namespace": op.namespace,
        "timeout_seconds": op.capacity_gate_seconds or 600,
        "host": bootstrap.host,
        "user": worker.ssh_user,
        "replace_with": (bootstrap.final_step,),
    }


def _mig_workers(
    spec: ClusterSpec, stack: GpuStack, bootstraps: dict[str, GuestBootstrap]
) -> list[tuple[Worker, str, GuestBootstrap]]:
    """Joined workers with a MIG geometry, when the operator's mig-manager applies it (kubeadm joins, where the
    rollout settings apply)."""
    if not spec.gpu_operator.enabled or spec.kubernetes.join_method != "kubeadm":
        return []
    out = []
    for worker in spec.workers:
        bootstrap, geometry = bootstraps.get(worker.name), stack.labels.get(worker.name, {}).get(MIG_LABEL)
        if bootstrap is not None and geometry is not None:
            out.append((worker, geometry, bootstrap))
    return out


def build_mig_rollouts(
    prefix: str,
    spec: ClusterSpec,
    stack: GpuStack,
    bootstraps: dict[str, GuestBootstrap],
    *,
    secrets: Secrets,
    provider: command.Provider,
    opts: pulumi.ResourceOptions,
) -> dict[str, MigDrain]:
    """Per joined worker with a MIG geometry: the drain before its label changes (``build_mig_settles`` makes
    the rest once the label patches exist)."""
    return {
        worker.name: MigDrain(
            f"{prefix}-{worker.name}-mig",
            MigDrainArgs(**_mig_step_args(spec, worker, geometry, bootstrap), ssh_private_key=secrets.ssh_private_key),
            pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(provider=provider, depends_on=[bootstrap])),
        )
        for worker, geometry, bootstrap in _mig_workers(spec, stack, bootstraps)
    }


def build_mig_settles(
    prefix: str,
    spec: ClusterSpec,
    stack: GpuStack,
    bootstraps: dict[str, GuestBootstrap],
    drains: dict[str, MigDrain],
    *,
    labels: GpuNodeLabels | None,
    release: pulumi.Resource | None,
    layer: ProxmoxLayer,
    secrets: Secrets,
    provider: command.Provider,
    opts: pulumi.ResourceOptions,
) -> dict[str, MigSettle]:
    """Per drained worker, once its label changed and the operator's release is in: the VM restart (if a MIG mode
    is due; it runs on the worker's Proxmox node, after the node agent there) and the wait for mig-manager; the steps
    keep the drain's name as their prefix (see MigSettle). The label goes first (on a first install the operator
    would otherwise label the node all-disabled); a new custom geometry's ConfigMap reaches mig-manager only with
    the release, so the steps wait for it and for a mig-manager that reads that ConfigMap."""
    config_map = stack.mig.name if stack.mig.custom else OPERATOR_MIG_CONFIG
    out: dict[str, MigSettle] = {}
    for worker, geometry, bootstrap in _mig_workers(spec, stack, bootstraps):
        patch = labels.patches.get(worker.name) if labels is not None else None
        vm = MigVm(
            vmid=worker.vmid,
            host=spec.node(worker.node).ssh_address,
            ssh_user=spec.proxmox.ssh_user,
            guest_user=worker.ssh_user,
        )
        after = [drains[worker.name], *([patch] if patch is not None else []), layer.host_agents[worker.node]]
        after += [release] if release is not None else []
        out[worker.name] = MigSettle(
            f"{prefix}-{worker.name}-mig-settle",
            MigSettleArgs(
                **_mig_step_args(spec, worker, geometry, bootstrap),
                ssh_private_key=secrets.ssh_private_key,
                vm=vm,
                mig_config_map=config_map,
                child_prefix=f"{prefix}-{worker.name}-mig",  # the drain's name
            ),
            pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(provider=provider, depends_on=after)),
        )
    return out


def build_capacity_gates(
    prefix: str,
    spec: ClusterSpec,
    stack: GpuStack,
    capacity: list[WorkerCapacity],
    bootstraps: dict[str, GuestBootstrap],
    *,
    after: list[pulumi.Resource],
    labels: GpuNodeLabels | None,
    secrets: Secrets,
    provider: command.Provider,
    opts: pulumi.ResourceOptions,
) -> dict[str, NodeCapacityGate]:
    """Per joined worker whose row advertises extended resources: once the operator and the node's labels are in,
    wait until the node advertises them (kubeadm-joined nodes, where kubelet's credential is known)."""
    seconds = spec.gpu_operator.capacity_gate_seconds
    if seconds == 0 or spec.kubernetes.join_method != "kubeadm":
        return {}
    rows = {row.worker: row for row in capacity}
    targets: dict[str, GateTarget] = {}
    for worker in spec.workers:
        bootstrap, row = bootstraps.get(worker.name), rows.get(worker.name)
        if bootstrap is None or row is None or not row.resources:
            continue
        patch = labels.patches.get(worker.name) if labels is not None else None
        targets[worker.name] = GateTarget(
            resources=row.resources,
            host=bootstrap.host,
            user=worker.ssh_user,
            device_plugin_config=stack.device_plugin.node_config.get(worker.name) if not worker.dra else None,
            ready=(*([patch] if patch is not None else []), bootstrap.agent),
            replace_with=(bootstrap.final_step,),
            agent_installed=True,
        )
    if not targets:
        return {}
    group = NodeCapacityGates(
        f"{prefix}-capacity-gates",
        NodeCapacityGatesArgs(
            targets=targets,
            ssh_private_key=secrets.ssh_private_key,
            timeout_seconds=seconds,
            child_prefix=prefix,
            # Until 2026-11 the gates were direct children of the cluster component.
            child_aliases=(pulumi.Alias(parent=opts.parent),) if opts.parent is not None else (),
        ),
        pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(provider=provider, depends_on=after)),
    )
    return group.gates


def build_retirements(
    prefix: str,
    spec: ClusterSpec,
    *,
    layer: ProxmoxLayer,
    bootstraps: dict[str, GuestBootstrap],
    labels: GpuNodeLabels | None,
    secrets: Secrets,
    provider: command.Provider,
    opts: pulumi.ResourceOptions,
) -> dict[str, WorkerRetirement]:
    """Per worker VM: before the VM is removed or replaced, its node is drained, reset and deleted.

    It waits for the node's bootstrap and label patch, so on removal it is deleted (drains) before them; it is
    protected with the VM, so removing a protected worker fails before anything is drained.
    """
    out: dict[str, WorkerRetirement] = {}
    for worker in spec.workers:
        vm = layer.vms.get(worker.name)
        if vm is None:
            continue
        after: list[pulumi.Resource] = [bootstraps[worker.name]]
        if labels is not None and worker.name in labels.patches:
            after.append(labels.patches[worker.name])
        out[worker.name] = WorkerRetirement(
            f"{prefix}-{worker.name}-retirement",
            WorkerRetirementArgs(
                node_name=worker.name,
                vmid=worker.vmid,
                host=spec.node(worker.node).ssh_address,
                ssh_user=spec.proxmox.ssh_user,
                guest_user=worker.ssh_user,
                ssh_private_key=secrets.ssh_private_key,
                api_endpoint=spec.kubernetes.api_endpoint,
                drain=spec.kubernetes.drain,
                kubeadm_reset=spec.kubernetes.join_method == "kubeadm",
                replace_with=(vm.vm,),
                host_agent_installed=True,
            ),
            pulumi.ResourceOptions.merge(
                opts,
                pulumi.ResourceOptions(
                    provider=provider, protect=worker.protect, depends_on=[*after, layer.host_agents[worker.node]]
                ),
            ),
        )
    return out
