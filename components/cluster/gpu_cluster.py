"""GpuCluster: the whole cluster of a spec as one component, composed from the components of each layer."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pulumi
from pydantic import Field, model_validator

from proxmox_gpu_cluster.args import ComponentArgs
from proxmox_gpu_cluster.cluster import adapters
from proxmox_gpu_cluster.cluster.builders import (
    build_capacity_gates,
    build_guests,
    build_mig_rollouts,
    build_mig_settles,
    build_retirements,
)
from proxmox_gpu_cluster.cluster.providers import Providers, Secrets, default_providers, needed_secrets, ssh_key
from proxmox_gpu_cluster.cluster.proxmox_layer import build_proxmox
from proxmox_gpu_cluster.core.capacity import capacity_output
from proxmox_gpu_cluster.core.cluster_nodes import gpu_nodes
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.names import StackScope
from proxmox_gpu_cluster.core.shared_estate import ClusterClaim, estate_conflicts
from proxmox_gpu_cluster.core.spec import ClusterSpec
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.gpu.dra_driver import DraDriver, DraDriverArgs
from proxmox_gpu_cluster.gpu.gpu_monitoring import GpuMonitoring, GpuMonitoringArgs
from proxmox_gpu_cluster.gpu.gpu_node import GpuNodeLabels, GpuNodeLabelsArgs
from proxmox_gpu_cluster.gpu.gpu_operator import GpuOperator, GpuOperatorArgs
from proxmox_gpu_cluster.gpu.gpu_quota import GpuQuotas, GpuQuotasArgs
from proxmox_gpu_cluster.gpu.kubevirt_devices import KubeVirtGpuDevices, KubeVirtGpuDevicesArgs
from proxmox_gpu_cluster.gpu.node_access import NodeStepAccess, NodeStepAccessArgs
from proxmox_gpu_cluster.gpu.priority_classes import GpuPriorityClasses, GpuPriorityClassesArgs
from proxmox_gpu_cluster.gpu.smoke_test import GpuSmokeTest, GpuSmokeTestArgs
from proxmox_gpu_cluster.render.disruption import host_reboot, host_roll
from proxmox_gpu_cluster.render.kubevirt import permitted_host_devices


def warn_experimental(spec: ClusterSpec) -> None:
    """KubeVirt workers that are themselves Proxmox VMs run VMs nested, through a virtual IOMMU; NVIDIA documents
    VM-workload nodes as bare metal only, so every preview says so."""
    nested = [w.name for w in spec.workers if w.workload != "container"]
    if nested:
        pulumi.log.warn(
            f"experimental: KubeVirt workers {', '.join(nested)} are Proxmox VMs (nested virtualization, vIOMMU); "
            "NVIDIA supports vm-passthrough and vm-vgpu nodes on bare metal only (kubevirt.nodes)"
        )


class GpuClusterArgs(ComponentArgs):
    """What a ``GpuCluster`` is built from: the validated spec and its secrets, and how it names things."""

    spec: ClusterSpec = Field(description="The cluster spec (``load_spec``, or ``load()`` from a stack's config).")
    secrets: Secrets = Field(description="The secrets the spec needs, each a secret Output (``load()`` reads them).")
    providers: Providers | None = Field(
        default=None, description="The caller's explicit providers; by default created from the spec and secrets."
    )
    aliases_from_stack_root: bool = Field(
        default=False,
        description="The stack created these resources at its root, without the ``<name>-`` prefix, before this "
        "component existed (this repository's stacks did until 2026-11): every direct child then carries an alias "
        "to that old URN and its children inherit it, so Pulumi moves them instead of replacing them. Leave it off "
        "in a new program.",
    )
    stack_scoped_names: bool = Field(
        default=False,
        description="The names on Proxmox (PCI mappings, snippets, images, host prep's drop-in) carry only the "
        "stack's scope, as this repository's stacks created them before 2026-11-24; otherwise they also carry the "
        "cluster's name, so several clusters of one program never share one.",
    )

    @model_validator(mode="after")
    def _secrets_the_spec_needs(self) -> GpuClusterArgs:
        missing = [
            Problem(f"secrets.{field}", f"required: {why}")
            for field, why in needed_secrets(self.spec).items()
            if getattr(self.secrets, field) is None
        ]
        if missing:
            raise SpecViolations(missing)
        return self


_PROGRAM: list[Any] = [None, []]
"""The program run (its resource monitor: one per run, and per mock) and its clusters so far."""


def _claim_estate(name: str, spec: ClusterSpec, scope: StackScope) -> None:
    """Refuse a cluster that would own what another cluster of this program owns (``core/shared_estate.py``)."""
    run = pulumi.runtime.settings.SETTINGS.monitor
    if _PROGRAM[0] is not run:
        _PROGRAM[:] = [run, []]
    claim = ClusterClaim(name, scope, spec)
    lines = [line for other in _PROGRAM[1] for line in estate_conflicts(other, claim)]
    if lines:
        raise InvalidComponentArgs(f"GpuCluster({name})", [Problem("", line) for line in lines])
    _PROGRAM[1].append(claim)


def _alias_from_root(cluster: pulumi.Resource, prefix: str) -> pulumi.ResourceTransformation:
    """A transformation giving each direct child of ``cluster`` an alias to its old name at the stack root."""

    def transform(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult | None:
        if args.opts.parent is not cluster or not args.name.startswith(prefix):
            return None
        alias = pulumi.Alias(name=args.name.removeprefix(prefix), parent=pulumi.ROOT_STACK_RESOURCE)
        return pulumi.ResourceTransformationResult(
            args.props, pulumi.ResourceOptions.merge(args.opts, pulumi.ResourceOptions(aliases=[alias]))
        )

    return transform


class GpuCluster(pulumi.ComponentResource):
    """The whole cluster of a ``ClusterSpec`` as one component: providers (unless given), the Proxmox layer, the
    guest bootstraps, node labels, the GPU Operator and everything on top, all children named ``<name>-...``.

    Callers that compose further wait on ``operator`` (``depends_on=[cluster.operator]``) or use the outputs.
    """

    workers: pulumi.Output[dict[str, dict[str, Any]]]
    """Worker name -> ``{vmId, ipAddress, nodeName}``."""
    capacity: pulumi.Output[dict[str, dict[str, Any]]]
    """Node -> ``{proxmoxNode, gpus, workload, resources}``: what each node will advertise."""
    iommu_checks: pulumi.Output[dict[str, str]]
    """Proxmox node -> which IOMMU isolation check applies (``plan`` or ``host-verify``)."""
    host_reboots: pulumi.Output[dict[str, str]]
    """Proxmox node -> whether host prep may reboot it (``no``, ``when-idle``, ``yes``)."""
    rolling_changes: pulumi.Output[dict[str, Any] | None]
    """How a change that takes joined nodes out of service rolls: ``maxUnavailable``, ``nodes``, ``rounds``, the
    order of the steps (None when nodes join elsewhere)."""
    node_labels: pulumi.Output[dict[str, dict[str, str]]]
    """Node -> the labels the cluster sets on it (empty when nothing labels nodes)."""
    kubevirt_permitted_host_devices: pulumi.Output[dict[str, Any] | None]
    """What the KubeVirt CR permits (None without KubeVirt)."""
    driver_versions: pulumi.Output[dict[str, str]]
    """Worker -> the driver build it runs (host driver mode; read by each node's verify step)."""
    node_access: NodeStepAccess
    """The slot namespace and the node steps' RBAC; every worker's steps wait for it."""
    operator: GpuOperator | None
    """The GPU Operator release component (None when ``gpuOperator.enabled`` is false); a resource to wait on."""
    providers: Providers
    """The providers every child uses."""

    def __init__(self, name: str, args: GpuClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """A second cluster of the program that would own what another owns (a GPU, a VM id, a Kubernetes node,
        a cluster-wide object) is refused naming both (``core/shared_estate.py``)."""
        spec, secrets, providers = args.spec, args.secrets, args.providers
        if args.aliases_from_stack_root:
            opts = pulumi.ResourceOptions.merge(
                opts, pulumi.ResourceOptions(transformations=[_alias_from_root(self, f"{name}-")])
            )
        scope = StackScope(pulumi.get_project(), pulumi.get_stack(), "" if args.stack_scoped_names else name)
        _claim_estate(name, spec, scope)
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:cluster:GpuCluster", name, None, opts)
        self.spec = spec
        # With the agent no connection (nor the Proxmox provider) gets the key, so no step's state holds it.
        secrets = replace(secrets, ssh_private_key=ssh_key(spec, secrets, name))
        self.providers = providers or default_providers(name, spec, secrets, parent=self)
        child = pulumi.ResourceOptions(parent=self)
        layer = build_proxmox(
            spec,
            prefix=name,
            parent=self,
            proxmox=self.providers.proxmox,
            host_command=self.providers.command,
            ssh_private_key=secrets.ssh_private_key,
            scope=scope,
        )
        self.proxmox = layer
        k8s = self.providers.kubernetes
        on_k8s = pulumi.ResourceOptions(parent=self, provider=k8s)  # the GPU components' children inherit it

        def after(*resources: pulumi.Resource) -> pulumi.ResourceOptions:
            return pulumi.ResourceOptions(parent=self, provider=k8s, depends_on=list(resources))

        # What the node steps may do as the node itself (no admin credential on the machines): every worker's
        # steps wait for it, and are deleted (the retirement's drain) before it.
        self.node_access = NodeStepAccess(
            f"{name}-node-access", NodeStepAccessArgs(slot_namespace=spec.kubernetes.drain.slot_namespace), on_k8s
        )
        guests = pulumi.ResourceOptions(parent=self, depends_on=[self.node_access])
        self.bootstraps = build_guests(
            name,
            spec,
            layer,
            secrets,
            self.providers.command,
            kubernetes_provider=self.providers.kubernetes,
            opts=guests,
        )
        op = spec.gpu_operator
        gpu_stack: list[pulumi.Resource] = []
        labels = None
        stack = adapters.gpu_stack(spec)
        capacity = stack.capacity()  # the plan's capacity table: what the gates check and the output says
        self.mig_rollouts = build_mig_rollouts(
            name, spec, stack, self.bootstraps, secrets=secrets, provider=self.providers.command, opts=child
        )
        if op.enabled or stack.uses_dra or any(n.taint for n in stack.nodes):
            # Each node's labels wait for that node's bootstrap (joined and verified) and, for a new MIG geometry,
            # its drain; not for the others. They are applied again when it starts over on a new VM (which joins
            # as a new Node object).
            ready = {n: [b, *([self.mig_rollouts[n].begin] if n in self.mig_rollouts else [])]
                     for n, b in self.bootstraps.items()}  # fmt: skip
            labels = GpuNodeLabels(
                f"{name}-gpu-nodes",
                GpuNodeLabelsArgs(
                    stack=stack,
                    node_ready=ready,
                    replace_with={n: [b.final_step] for n, b in self.bootstraps.items()},
                ),
                on_k8s,
            )
            gpu_stack.append(labels)
        self.retirements = build_retirements(
            name, spec, layer=layer, bootstraps=self.bootstraps, labels=labels, secrets=secrets,
            provider=self.providers.command, opts=child,
        )  # fmt: skip
        self.operator = None
        if op.enabled:
            self.operator = operator = GpuOperator(
                f"{name}-gpu-operator",
                GpuOperatorArgs(
                    stack=stack, release_after=tuple(gpu_stack), vgpu_registry_password=secrets.vgpu_registry_password
                ),
                on_k8s,
            )
            gpu_stack.append(operator)
            if op.monitoring.prometheus or op.monitoring.dashboard.enabled:
                GpuMonitoring(
                    f"{name}-gpu-monitoring",
                    GpuMonitoringArgs(
                        monitoring=op.monitoring, operator_namespace=operator.namespace, nodes=stack.nodes
                    ),
                    on_k8s,
                )
            gates = build_capacity_gates(
                name, spec, stack, capacity, self.bootstraps, after=[operator.release], labels=labels, secrets=secrets,
                provider=self.providers.command, opts=child,
            )  # fmt: skip
            if op.smoke_test.enabled:
                GpuSmokeTest(
                    f"{name}-gpu-smoke-test",
                    GpuSmokeTestArgs(
                        test=op.smoke_test,
                        resource=adapters.smoke_test_resource(spec) or "nvidia.com/gpu",  # validation: never None
                        rerun_key=adapters.smoke_test_rerun_key(spec, stack),
                        namespace=operator.namespace,
                        capacity=tuple(capacity),
                    ),
                    after(operator, *gates.values()),
                )
        # Restart (if due) and wait, once each node's label changed and the release (its mig-parted ConfigMap) is in.
        self.mig_settles = build_mig_settles(
            name, spec, stack, self.bootstraps, self.mig_rollouts, labels=labels,
            release=self.operator.release if self.operator else None, layer=layer, secrets=secrets,
            provider=self.providers.command, opts=child,
        )  # fmt: skip
        if stack.uses_dra:
            # One creator per Namespace: with the operator's namespace, the DRA driver installs into it.
            shared = self.operator.namespace if self.operator and op.dra.namespace == op.namespace else None
            DraDriver(
                f"{name}-dra-driver",
                DraDriverArgs(dra=op.dra, driver_mode=op.driver_mode, namespace=shared, release_after=tuple(gpu_stack)),
                on_k8s,
            )
        if spec.kubevirt.enabled:
            warn_experimental(spec)
            if spec.kubevirt.patch_kubevirt:
                kubevirt = KubeVirtGpuDevicesArgs(kubevirt=spec.kubevirt, nodes=stack.nodes)
                KubeVirtGpuDevices(f"{name}-kubevirt-gpus", kubevirt, on_k8s)
        classes = None
        if spec.priority_classes:
            classes = GpuPriorityClasses(
                f"{name}-gpu-priority-classes", GpuPriorityClassesArgs(classes=spec.priority_classes), on_k8s
            )
        if spec.quotas:
            GpuQuotas(
                f"{name}-gpu-quotas",
                GpuQuotasArgs(
                    quotas=spec.quotas,
                    capacity=tuple(capacity),
                    priority_classes=tuple(c.name for c in spec.priority_classes),
                ),
                after(*([classes] if classes else [])),
            )
        self.capacity_rows = capacity
        self.workers = pulumi.Output.from_input(
            {n: {"vmId": vm.vm_id, "ipAddress": vm.ip_address, "nodeName": vm.node_name} for n, vm in layer.vms.items()}
        )
        self.capacity = pulumi.Output.from_input(capacity_output(self.capacity_rows))
        self.iommu_checks = pulumi.Output.from_input(layer.iommu_checks)
        host_driver = [w.name for w in spec.workers if op.driver_mode == "host" and w.workload == "container"]
        versions = {n: self.bootstraps[n].driver_version for n in host_driver if n in self.bootstraps}
        self.driver_versions = pulumi.Output.all(**versions) if versions else pulumi.Output.from_input({})
        # Whether host prep may reboot each Proxmox node (no, when-idle, yes), so a preview says it too.
        self.host_reboots = pulumi.Output.from_input(
            {n.name: host_reboot(spec, n).may_reboot for n in spec.proxmox.nodes}
        )
        self.rolling_changes = pulumi.Output.from_input(host_roll(spec))
        self.node_labels = labels.labels if labels is not None else pulumi.Output.from_input({})
        kv = spec.kubevirt
        self.kubevirt_permitted_host_devices = pulumi.Output.from_input(
            permitted_host_devices(stack.nodes) if kv.enabled else None
        )
        self.register_outputs(
            {
                "workers": self.workers,
                "capacity": self.capacity,
                "iommuChecks": self.iommu_checks,
                "driverVersions": self.driver_versions,
                "hostReboots": self.host_reboots,
                "rollingChanges": self.rolling_changes,
                "nodeLabels": self.node_labels,
                "kubevirtPermittedHostDevices": self.kubevirt_permitted_host_devices,
            }
        )


def export(cluster: GpuCluster) -> None:
    """Stack outputs: the workers (VM id, IP, node name), what each node will advertise, which IOMMU isolation
    check applies per Proxmox node and whether host prep may reboot it, and the KubeVirt devices."""
    pulumi.export("workers", cluster.workers)
    pulumi.export("iommuChecks", cluster.iommu_checks)
    pulumi.export("hostReboots", cluster.host_reboots)
    pulumi.export("rollingChanges", cluster.rolling_changes)
    if cluster.spec.gpu_operator.driver_mode == "host":
        pulumi.export("driverVersions", cluster.driver_versions)
    kv = cluster.spec.kubevirt
    if kv.enabled:
        # What the KubeVirt CR permits; where HCO owns that CR, what to put into the HyperConverged CR instead.
        pulumi.export("kubevirtPermittedHostDevices", cluster.kubevirt_permitted_host_devices)
        if not kv.patch_kubevirt:
            pulumi.export(
                "hyperConvergedPermittedHostDevices",
                permitted_host_devices(gpu_nodes(cluster.spec), hyperconverged=True),
            )
    pulumi.export("capacity", cluster.capacity)
