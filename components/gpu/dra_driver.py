"""DraDriver: the NVIDIA DRA driver for GPUs, for workers that allocate GPUs through ResourceClaims."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.core.operator_spec import DraSpec
from proxmox_gpu_cluster.helm import nvidia_release, privileged_namespace
from proxmox_gpu_cluster.render.operator_values import dra_values


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

    def __init__(
        self,
        name: str,
        dra: DraSpec,
        *,
        driver_mode: Literal["host", "operator"],
        provider: kubernetes.Provider,
        namespace: pulumi.Input[str] | None = None,
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """``namespace``: an existing namespace to install into (e.g. the operator's, when the spec names the same
        one: two components must never both create a Namespace); by default the component creates
        ``dra.namespace``. ``driver_mode``: where the NVIDIA driver is (``host``: installed on the nodes,
        ``operator``: the operator's driver container)."""
        super().__init__("proxmox-gpu-cluster:dra_driver:DraDriver", name, None, opts)
        if namespace is None:
            # The kubelet plugin is a privileged host daemon.
            ns = privileged_namespace(
                f"{name}-namespace", dra.namespace, pulumi.ResourceOptions(parent=self, provider=provider)
            )
            namespace = ns.metadata.apply(lambda m: m.name or "")
        release = nvidia_release(
            f"{name}-release",
            chart="nvidia-dra-driver-gpu",
            version=dra.chart_version,
            namespace=namespace,
            values=dra_values(driver_mode),
            timeout=600,
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=list(depends_on)),
        )
        self.namespace = pulumi.Output.from_input(namespace)
        self.release_status = release.status.apply(lambda s: s.status or "")
        self.register_outputs({"namespace": self.namespace, "releaseStatus": self.release_status})
