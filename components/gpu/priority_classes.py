"""GpuPriorityClasses: the PriorityClasses GPU workloads select, so important work can preempt the rest."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.core.scheduling_spec import PriorityClassSpec


class GpuPriorityClasses(pulumi.ComponentResource):
    """One cluster-scoped PriorityClass per entry, named as given.

    Kubernetes refuses changes to a PriorityClass's ``value`` (the field is immutable), so a new value replaces
    the object; pods keep the priority they were admitted with.
    """

    names: pulumi.Output[list[str]]
    """Names of the PriorityClasses, once they exist."""

    def __init__(
        self,
        name: str,
        classes: Sequence[PriorityClassSpec],
        *,
        provider: kubernetes.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("proxmox-gpu-cluster:priority_classes:GpuPriorityClasses", name, None, opts)
        created = [
            kubernetes.scheduling.v1.PriorityClass(
                f"{name}-{c.name}",
                kubernetes.scheduling.v1.PriorityClassInitArgs(
                    metadata=kubernetes.meta.v1.ObjectMetaArgs(
                        name=c.name, labels={"app.kubernetes.io/managed-by": "proxmox-gpu-cluster"}
                    ),
                    value=c.value,
                    preemption_policy=c.preemption_policy,
                    global_default=c.global_default,
                    description=c.description or None,
                ),
                opts=pulumi.ResourceOptions(parent=self, provider=provider),
            )
            for c in classes
        ]
        self.names = pulumi.Output.all(*[pc.metadata.apply(lambda m: m.name) for pc in created]).apply(list)
        self.register_outputs({"names": self.names})
