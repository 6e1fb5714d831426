"""GpuOperator: the operator namespace, its sharing ConfigMaps and the gpu-operator Helm release."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as kubernetes
from pydantic import Field, model_validator

from proxmox_gpu_cluster.args import ComponentArgs, Input
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.gpu.gpu_node import stack_problems
from proxmox_gpu_cluster.helm import nvidia_release, privileged_namespace
from proxmox_gpu_cluster.node_agent import caller_dependencies
from proxmox_gpu_cluster.render.dcgm import metrics_config_data, metrics_config_name
from proxmox_gpu_cluster.render.gpu_stack import GpuStack
from proxmox_gpu_cluster.render.kubevirt import docker_config_json


class GpuOperatorArgs(ComponentArgs):
    """The stack the operator serves and the secret its vGPU Manager image needs."""

    stack: GpuStack = Field(
        description="The operator settings and the nodes it serves (the object ``GpuNodeLabels`` takes); the "
        "driver branch must support every GPU model of its container nodes."
    )
    release_after: tuple[pulumi.Resource, ...] = Field(
        default=(),
        description="What the Helm release alone waits for (e.g. ``GpuNodeLabels``: the nodes carry their config "
        "labels before the operator reads them) while the namespace and ConfigMaps are created meanwhile. The "
        "ordering of one child, which ``opts.depends_on`` cannot express: Pulumi registers a component's children "
        "only once the component's own dependencies exist.",
    )
    vgpu_registry_password: Input[str] | None = Field(
        default=None,
        description="Password of the vGPU Manager's registry, required when the stack has one (it becomes the "
        "image pull secret and stays a Pulumi secret).",
    )

    @model_validator(mode="after")
    def _stack(self) -> GpuOperatorArgs:
        problems = stack_problems(self.stack)
        if not problems and self.stack.vgpu_manager is not None and self.vgpu_registry_password is None:
            problems.append(Problem("vgpu_registry_password", "the vGPU Manager's pull secret needs the password"))
        if problems:
            raise SpecViolations(problems)
        return self


class GpuOperator(pulumi.ComponentResource):
    """Installs the NVIDIA GPU Operator for the nodes of a ``GpuStack``, with its sharing ConfigMaps.

    A ``helm.v3.Release`` rather than ``helm.v4.Chart``: the chart upgrades its CRDs from a pre-upgrade Helm
    hook (``operator.upgradeCRD``), and only a real Helm release runs hooks.
    """

    namespace: pulumi.Output[str]
    """Namespace the operator runs in."""
    device_plugin_config: pulumi.Output[str]
    """Name of the device-plugin ConfigMap (content-addressed)."""
    mig_config: pulumi.Output[str]
    """Name of the custom mig-parted ConfigMap, or "" when only the operator's built-in configs are used."""
    dcgm_metrics_config: pulumi.Output[str]
    """Name of the DCGM exporter metrics ConfigMap (content-addressed), or "" without the exporter."""
    release: kubernetes.helm.v3.Release
    """The Helm release itself: what per-node steps wait for (cheaper for the SDK than the whole component)."""
    release_status: pulumi.Output[str]
    """Helm release status."""

    def __init__(self, name: str, args: GpuOperatorArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the Kubernetes provider in ``opts.provider`` (the children inherit it); ``opts.depends_on``
        reaches the release (and, as with any component, delays the registration of every child: what only the
        release waits for goes in ``args.release_after``)."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:gpu_operator:GpuOperator", name, None, opts)
        stack, vgpu_registry_password = args.stack, args.vgpu_registry_password
        op = stack.operator
        child = pulumi.ResourceOptions(parent=self)
        # Driver, toolkit and device-plugin pods are privileged host-level daemons.
        ns = privileged_namespace(f"{name}-namespace", op.namespace, child)
        release_needs: list[pulumi.Resource] = [*caller_dependencies(opts), *args.release_after]
        manager = stack.vgpu_manager
        if manager is not None and vgpu_registry_password is not None:
            config_json = pulumi.Output.secret(vgpu_registry_password).apply(
                lambda password: docker_config_json(manager.registry, manager.registry_username, password)
            )
            release_needs.append(
                kubernetes.core.v1.Secret(
                    f"{name}-vgpu-pull-secret",
                    kubernetes.core.v1.SecretInitArgs(
                        metadata=kubernetes.meta.v1.ObjectMetaArgs(
                            name=manager.pull_secret, namespace=ns.metadata.name
                        ),
                        type="kubernetes.io/dockerconfigjson",
                        string_data={".dockerconfigjson": config_json},
                    ),
                    opts=child,
                )
            )
        dp = stack.device_plugin

        def config_map(role: str, cm_name: str, data: dict[str, str]) -> kubernetes.core.v1.ConfigMap:
            return kubernetes.core.v1.ConfigMap(
                f"{name}-{role}",
                kubernetes.core.v1.ConfigMapInitArgs(
                    metadata=kubernetes.meta.v1.ObjectMetaArgs(name=cm_name, namespace=ns.metadata.name), data=data
                ),
                opts=child,
            )

        dp_map = config_map("device-plugin-config", dp.name, dp.data)
        mig = stack.mig
        mig_name: pulumi.Output[str] = pulumi.Output.from_input("")
        if mig.custom:
            mig_map = config_map("mig-config", mig.name, mig.data)
            mig_name = mig_map.metadata.apply(lambda m: (m.name if m is not None else None) or "")
        dcgm_name: pulumi.Output[str] = pulumi.Output.from_input("")
        if op.dcgm:
            metrics = metrics_config_data(op.monitoring)
            dcgm_map = config_map("dcgm-metrics", metrics_config_name(metrics), metrics)
            dcgm_name = dcgm_map.metadata.apply(lambda m: (m.name if m is not None else None) or "")
        dp_name = dp_map.metadata.apply(lambda m: (m.name if m is not None else None) or "")
        values = pulumi.Output.all(dp_name, mig_name, dcgm_name).apply(
            lambda names: stack.values(
                device_plugin_config=names[0],
                mig_config=names[1] or None,
                dcgm_metrics_config=names[2] or None,
            )
        )
        # atomic rolls a failed upgrade back; the operator's validator pods take minutes on first install.
        release = nvidia_release(
            f"{name}-release",
            chart="gpu-operator",
            version=op.chart_version,
            namespace=ns.metadata.name,
            values=values,
            timeout=900,
            opts=pulumi.ResourceOptions(parent=self, depends_on=release_needs),
        )
        self.namespace = ns.metadata.apply(lambda m: (m.name if m is not None else None) or "")
        self.device_plugin_config = dp_name
        self.mig_config = mig_name
        self.dcgm_metrics_config = dcgm_name
        self.release = release
        self.release_status = release.status.apply(lambda s: (s.status if s is not None else None) or "")
        self.register_outputs(
            {
                "namespace": self.namespace,
                "devicePluginConfig": self.device_plugin_config,
                "migConfig": self.mig_config,
                "dcgmMetricsConfig": self.dcgm_metrics_config,
                "releaseStatus": self.release_status,
            }
        )
