"""Compose the stack: explicit providers from the spec and secrets, then the components for each layer.

Default providers are disabled in Pulumi.yaml, so every resource below names one of these providers.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_kubernetes as kubernetes
import pulumi_proxmoxve as proxmoxve

from components.adapters import monitoring_targets
from components.capacity import WorkerCapacity, capacity_table, quota_warnings
from components.disruption import host_reboot
from components.dra_driver import DraDriver
from components.gpu_monitoring import GpuMonitoring
from components.gpu_node import GpuNodeLabels
from components.gpu_operator import GpuOperator
from components.gpu_quota import GpuQuotas
from components.guest_bootstrap import GuestBootstrap
from components.guest_spec import bootstrap_spec
from components.kubevirt import permitted_host_devices
from components.kubevirt_devices import KubeVirtGpuDevices
from components.operator_values import uses_dra
from components.priority_classes import GpuPriorityClasses
from components.smoke_test import GpuSmokeTest
from components.spec import ClusterSpec
from components.worker_retirement import WorkerRetirement
from stacks.config import Secrets
from stacks.proxmox_layer import ProxmoxLayer, build_proxmox


@dataclass(frozen=True)
class Providers:
    """The explicit providers every resource uses."""

    proxmox: proxmoxve.Provider
    kubernetes: kubernetes.Provider
    command: command.Provider


@dataclass(frozen=True)
class Cluster:
    """What ``build`` created, for ``export`` and for programs that compose further."""

    spec: ClusterSpec
    providers: Providers
    capacity: list[WorkerCapacity]
    proxmox: ProxmoxLayer
    bootstraps: dict[str, GuestBootstrap]
    """Worker name -> its guest bootstrap."""
    retirements: dict[str, WorkerRetirement]
    """Worker name -> what drains and removes its node before its VM goes."""


def proxmox_provider(spec: ClusterSpec, secrets: Secrets) -> proxmoxve.Provider:
    """The Proxmox provider: API token by default, user + password in password mode.

    Its SSH settings serve the provider's own file uploads (cloud-init snippets), which the Proxmox API cannot
    do; nodes are listed explicitly so the provider does not have to guess their addresses.
    """
    px = spec.proxmox
    token_mode = px.auth_mode == "token"
    return proxmoxve.Provider(
        "proxmox",
        proxmoxve.ProviderArgs(
            endpoint=px.endpoint,
            insecure=not px.tls_verify,
            api_token=secrets.proxmox_api_token if token_mode else None,
            username=None if token_mode else px.username,
            password=None if token_mode else secrets.proxmox_password,
            ssh=proxmoxve.ProviderSshArgs(
                username=px.ssh_user,
                private_key=secrets.ssh_private_key,
                nodes=[proxmoxve.ProviderSshNodeArgs(name=n.name, address=n.ssh_address) for n in px.nodes],
            ),
        ),
    )


def build_guests(
    spec: ClusterSpec, layer: ProxmoxLayer, secrets: Secrets, provider: command.Provider
) -> dict[str, GuestBootstrap]:
    """One bootstrap chain per worker VM, connecting to the VM's address; workers never wait for each other."""
    bootstraps: dict[str, GuestBootstrap] = {}
    for worker in spec.workers:
        vm = layer.vms.get(worker.name)
        if vm is None:
            continue
        bootstraps[worker.name] = GuestBootstrap(
            f"{worker.name}-bootstrap",
            bootstrap_spec(spec, worker),
            provider=provider,
            host=vm.ip_address,
            user=worker.ssh_user,
            ssh_private_key=secrets.ssh_private_key,
            join_token=secrets.join_token,
            ca_cert_hash=secrets.ca_cert_hash,
            replace_with=[vm.vm],
        )
    return bootstraps


def build_retirements(
    spec: ClusterSpec,
    *,
    layer: ProxmoxLayer,
    bootstraps: dict[str, GuestBootstrap],
    labels: GpuNodeLabels | None,
    secrets: Secrets,
    provider: command.Provider,
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
            f"{worker.name}-retirement",
            node_name=worker.name,
            vmid=worker.vmid,
            host=spec.node(worker.node).ssh_address,
            ssh_user=spec.proxmox.ssh_user,
            ssh_private_key=secrets.ssh_private_key,
            kubeconfig=secrets.kubeconfig,
            api_endpoint=spec.kubernetes.api_endpoint,
            drain=spec.kubernetes.drain,
            kubeadm_reset=spec.kubernetes.join_method == "kubeadm",
            provider=provider,
            protect=worker.protect,
            replace_with=[vm.vm],
            depends_on=after,
        )
    return out


def warn_experimental(spec: ClusterSpec) -> None:
    """KubeVirt workers that are themselves Proxmox VMs run VMs nested, through a virtual IOMMU; NVIDIA documents
    VM-workload nodes as bare metal only, so every preview says so."""
    nested = [w.name for w in spec.workers if w.workload != "container"]
    if nested:
        pulumi.log.warn(
            f"experimental: KubeVirt workers {', '.join(nested)} are Proxmox VMs (nested virtualization, vIOMMU); "
            "NVIDIA supports vm-passthrough and vm-vgpu nodes on bare metal only (kubevirt.nodes)"
        )


def build(spec: ClusterSpec, secrets: Secrets) -> Cluster:
    """Create every resource of the stack described by ``spec``."""
    providers = Providers(
        proxmox=proxmox_provider(spec, secrets),
        kubernetes=kubernetes.Provider("kubernetes", kubernetes.ProviderArgs(kubeconfig=secrets.kubeconfig)),
        command=command.Provider("command"),
    )
    layer = build_proxmox(
        spec, proxmox=providers.proxmox, host_command=providers.command, ssh_private_key=secrets.ssh_private_key
    )
    bootstraps = build_guests(spec, layer, secrets, providers.command)
    k8s = providers.kubernetes
    op = spec.gpu_operator
    gpu_stack: list[pulumi.Resource] = []
    labels = None
    tainted = any(w.taint for w in spec.workers) or any(n.taint for n in spec.kubevirt.nodes)
    if op.enabled or uses_dra(spec) or tainted:
        # Each node's labels wait for that node's bootstrap (joined and verified), not for the others, and are
        # applied again when it starts over on a new VM (which joins as a new Node object).
        labels = GpuNodeLabels(
            "gpu-nodes",
            spec,
            list(spec.workers),
            provider=k8s,
            node_ready={n: [b] for n, b in bootstraps.items()},
            replace_with={n: [b.final_step] for n, b in bootstraps.items()},
            kubevirt_nodes=spec.kubevirt.nodes,
        )
        gpu_stack.append(labels)
    retirements = build_retirements(
        spec, layer=layer, bootstraps=bootstraps, labels=labels, secrets=secrets, provider=providers.command
    )
    operator = None
    if op.enabled:
        operator = GpuOperator(
            "gpu-operator",
            spec,
            provider=k8s,
            vgpu_registry_password=secrets.vgpu_registry_password,
            depends_on=gpu_stack,
        )
        gpu_stack.append(operator)
        if op.monitoring.prometheus or op.monitoring.dashboard.enabled:
            targets = monitoring_targets(spec)
            GpuMonitoring(
                "gpu-monitoring",
                op.monitoring,
                provider=k8s,
                operator_namespace=operator.namespace,
                exporter_nodes=targets.exporter_nodes,
                row_remapping=targets.row_remapping,
                mig=targets.mig,
            )
        if op.smoke_test.enabled:
            GpuSmokeTest("gpu-smoke-test", spec, provider=k8s, namespace=operator.namespace, depends_on=[operator])
    if uses_dra(spec):
        # One creator per Namespace: with the operator's namespace, the DRA driver installs into it.
        shared = operator.namespace if operator is not None and op.dra.namespace == op.namespace else None
        DraDriver("dra-driver", spec, provider=k8s, namespace=shared, depends_on=gpu_stack)
    if spec.kubevirt.enabled:
        warn_experimental(spec)
        if spec.kubevirt.patch_kubevirt:
            KubeVirtGpuDevices("kubevirt-gpus", spec, provider=k8s)
    classes = None
    if spec.priority_classes:
        classes = GpuPriorityClasses("gpu-priority-classes", spec.priority_classes, provider=k8s)
    if spec.quotas:
        GpuQuotas(
            "gpu-quotas",
            spec.quotas,
            provider=k8s,
            warnings=quota_warnings(spec),
            depends_on=[classes] if classes else [],
        )
    return Cluster(
        spec=spec,
        providers=providers,
        capacity=capacity_table(spec),
        proxmox=layer,
        bootstraps=bootstraps,
        retirements=retirements,
    )


def export(cluster: Cluster) -> None:
    """Stack outputs: the workers (VM id, IP, node name), what each node will advertise, and which IOMMU
    isolation check applies per Proxmox node."""
    pulumi.export(
        "workers",
        {
            name: {"vmId": vm.vm_id, "ipAddress": vm.ip_address, "nodeName": vm.node_name}
            for name, vm in cluster.proxmox.vms.items()
        },
    )
    pulumi.export("iommuChecks", cluster.proxmox.iommu_checks)
    # Whether host prep may reboot each Proxmox node (no, when-idle, yes), so a preview says it too.
    pulumi.export("hostReboots", {n.name: host_reboot(cluster.spec, n).may_reboot for n in cluster.spec.proxmox.nodes})
    kv = cluster.spec.kubevirt
    if kv.enabled:
        # What the KubeVirt CR permits; where HCO owns that CR, what to put into the HyperConverged CR instead.
        pulumi.export("kubevirtPermittedHostDevices", permitted_host_devices(cluster.spec))
        if not kv.patch_kubevirt:
            hco = permitted_host_devices(cluster.spec, hyperconverged=True)
            pulumi.export("hyperConvergedPermittedHostDevices", hco)
    pulumi.export(
        "capacity",
        {
            row.worker: {
                "proxmoxNode": row.node,
                "gpus": row.gpus,
                "workload": row.workload,
                "resources": row.resources,
            }
            for row in cluster.capacity
        },
    )
