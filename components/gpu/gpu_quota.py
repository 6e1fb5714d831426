"""GpuQuotas: a ResourceQuota on GPU extended resources per namespace (optionally per PriorityClass)."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.core.capacity import quota_hard
from proxmox_gpu_cluster.core.scheduling_spec import Quota


def quota_object_name(quota: Quota) -> str:
    """``gpu-quota``, or ``gpu-quota-<class>`` for a quota that counts only one PriorityClass's pods."""
    return "gpu-quota" if quota.priority_class is None else f"gpu-quota-{quota.priority_class}"


class GpuQuotas(pulumi.ComponentResource):
    """One ResourceQuota per entry, in the entry's namespace; logs the given warnings (e.g. a quota above what
    the cluster advertises) on the component."""

    namespaces: pulumi.Output[list[str]]
    """Namespaces that got a quota."""

    def __init__(
        self,
        name: str,
        quotas: Sequence[Quota],
        *,
        provider: kubernetes.Provider,
        warnings: Sequence[str] = (),
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """``depends_on``: e.g. the PriorityClasses the scoped quotas name."""
        super().__init__("proxmox-gpu-cluster:gpu_quota:GpuQuotas", name, None, opts)
        for warning in warnings:
            pulumi.log.warn(warning, resource=self)
        for quota in quotas:
            scope = None
            if quota.priority_class is not None:
                scope = kubernetes.core.v1.ScopeSelectorArgs(
                    match_expressions=[
                        kubernetes.core.v1.ScopedResourceSelectorRequirementArgs(
                            scope_name="PriorityClass", operator="In", values=[quota.priority_class]
                        )
                    ]
                )
            # A namespace is a DNS label (no dots), so "<namespace>.<class>" never equals another quota's name.
            suffix = quota.namespace if quota.priority_class is None else f"{quota.namespace}.{quota.priority_class}"
            kubernetes.core.v1.ResourceQuota(
                f"{name}-{suffix}",
                kubernetes.core.v1.ResourceQuotaInitArgs(
                    metadata=kubernetes.meta.v1.ObjectMetaArgs(
                        name=quota_object_name(quota), namespace=quota.namespace
                    ),
                    spec=kubernetes.core.v1.ResourceQuotaSpecArgs(
                        hard=quota_hard(quota.resources), scope_selector=scope
                    ),
                ),
                opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=list(depends_on)),
            )
        self.namespaces = pulumi.Output.from_input(sorted({q.namespace for q in quotas}))
        self.register_outputs({"namespaces": self.namespaces})
