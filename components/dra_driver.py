"""DraDriver: the NVIDIA DRA driver for GPUs, for workers that allocate GPUs through ResourceClaims."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as kubernetes

from components.gpu_operator import CHART_REPO
from components.operator_values import dra_values
from components.spec import ClusterSpec


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
        spec: ClusterSpec,
        *,
        provider: kubernetes.Provider,
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("proxmox-gpu-cluster:dra_driver:DraDriver", name, None, opts)
        dra = spec.gpu_operator.dra
        ns = kubernetes.core.v1.Namespace(
            f"{name}-namespace",
            kubernetes.core.v1.NamespaceInitArgs(
                metadata=kubernetes.meta.v1.ObjectMetaArgs(
                    name=dra.namespace,
                    # The kubelet plugin is a privileged host daemon.
                    labels={"pod-security.kubernetes.io/enforce": "privileged"},
                )
            ),
            opts=pulumi.ResourceOptions(parent=self, provider=provider),
        )
        release = kubernetes.helm.v3.Release(
            f"{name}-release",
            kubernetes.helm.v3.ReleaseArgs(
                name="nvidia-dra-driver-gpu",
                chart="nvidia-dra-driver-gpu",
                version=dra.chart_version,
                repository_opts=kubernetes.helm.v3.RepositoryOptsArgs(repo=CHART_REPO),
                namespace=ns.metadata.name,
                values=dra_values(spec),
                atomic=True,
                cleanup_on_fail=True,
                timeout=600,
                max_history=10,
            ),
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=list(depends_on)),
        )
        self.namespace = ns.metadata.apply(lambda m: m.name or "")
        self.release_status = release.status.apply(lambda s: s.status or "")
        self.register_outputs({"namespace": self.namespace, "releaseStatus": self.release_status})
