"""DraDriver: the NVIDIA DRA driver for GPUs, for workers that allocate GPUs through ResourceClaims."""

from __future__ import annotations

from typing import Literal

import pulumi
from pydantic import Field

from proxmox_gpu_cluster.args import ComponentArgs, Input
from proxmox_gpu_cluster.core.operator_spec import DraSpec
from proxmox_gpu_cluster.core.spec_base import Name
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.helm import nvidia_release, privileged_namespace
from proxmox_gpu_cluster.node_agent import caller_dependencies
from proxmox_gpu_cluster.render.operator_values import dra_values


class DraDriverArgs(ComponentArgs):
    """The DRA driver's settings and where the NVIDIA driver is."""

    dra: DraSpec = Field(default_factory=DraSpec, description="Chart version and namespace of the DRA driver.")
    driver_mode: Literal["host", "operator"] = Field(
        description="Where the NVIDIA driver is: ``host`` (installed on the nodes) or ``operator`` (the operator's "
        "driver container)."
    )
    release_after: tuple[pulumi.Resource, ...] = Field(
        default=(),
        description="What the Helm release alone waits for (e.g. the GPU Operator: the driver and NFD labels come "
        "first) while the namespace is created meanwhile. The ordering of one child, which ``opts.depends_on`` "
        "cannot express: Pulumi registers a component's children only once the component's own dependencies exist.",
    )
    namespace: Input[Name] | None = Field(
        default=None,
        description="An existing namespace to install into (e.g. the operator's, when it is the same one: two "
        "components must never both create a Namespace); by default the component creates ``dra.namespace``.",
    )


class DraDriver(pulumi.ComponentResource):
    """Namespace and ``nvidia-dra-driver-gpu`` Helm release.

    Its kubelet plugin runs on nodes labelled ``nvidia.com/dra-kubelet-plugin=true`` (``GpuNodeLabels`` sets it
    on ``dra`` workers, together with ``nvidia.com/gpu.deploy.device-plugin=false``). The release waits for
    the GPU Operator when both are installed: the driver (host or container) and NFD labels come first.
    """

    namespace: pulumi.Output[str]
    """Namespace of the DRA driver."""
    release_status: pulumi.Output[str]
    """Helm release status."""

    def __init__(self, name: str, args: DraDriverArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the Kubernetes provider in ``opts.provider`` (the children inherit it); ``opts.depends_on``
        reaches the release (and, as with any component, delays the registration of every child: what only the
        release waits for goes in ``args.release_after``)."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:dra_driver:DraDriver", name, None, opts)
        dra = args.dra
        namespace: pulumi.Input[str]
        if args.namespace is None:
            # The kubelet plugin is a privileged host daemon.
            ns = privileged_namespace(f"{name}-namespace", dra.namespace, pulumi.ResourceOptions(parent=self))
            namespace = ns.metadata.apply(lambda m: (m.name if m is not None else None) or "")
        else:
            namespace = args.namespace
        release = nvidia_release(
            f"{name}-release",
            chart="nvidia-dra-driver-gpu",
            version=dra.chart_version,
            namespace=namespace,
            values=dra_values(args.driver_mode),
            timeout=600,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*caller_dependencies(opts), *args.release_after]),
        )
        self.namespace = pulumi.Output.from_input(namespace)
        self.release_status = release.status.apply(lambda s: (s.status if s is not None else None) or "")
        self.register_outputs({"namespace": self.namespace, "releaseStatus": self.release_status})
