"""GpuQuotas: a ResourceQuota on GPU extended resources per namespace of the spec."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as kubernetes

from components.capacity import quota_hard, quota_warnings
from components.spec import ClusterSpec


class GpuQuotas(pulumi.ComponentResource):
    """One ``gpu-quota`` ResourceQuota in each namespace the spec lists; warns when a quota exceeds capacity."""

    namespaces: pulumi.Output[list[str]]
    """Namespaces that got a quota."""

    def __init__(
        self,
        name: str,
        spec: ClusterSpec,
        *,
        provider: kubernetes.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("proxmox-gpu-cluster:gpu_quota:GpuQuotas", name, None, opts)
        for warning in quota_warnings(spec):
            pulumi.log.warn(warning, resource=self)
        for quota in spec.quotas:
            kubernetes.core.v1.ResourceQuota(
                f"{name}-{quota.namespace}",
                kubernetes.core.v1.ResourceQuotaInitArgs(
                    metadata=kubernetes.meta.v1.ObjectMetaArgs(name="gpu-quota", namespace=quota.namespace),
                    spec=kubernetes.core.v1.ResourceQuotaSpecArgs(hard=quota_hard(quota.resources)),
                ),
                opts=pulumi.ResourceOptions(parent=self, provider=provider),
            )
        self.namespaces = pulumi.Output.from_input([q.namespace for q in spec.quotas])
        self.register_outputs({"namespaces": self.namespaces})
