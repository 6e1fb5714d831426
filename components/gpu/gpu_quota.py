"""GpuQuotas: a ResourceQuota on GPU extended resources per namespace (optionally per PriorityClass)."""

from __future__ import annotations

from functools import cached_property

import pulumi
import pulumi_kubernetes as kubernetes
from pydantic import Field, model_validator

from proxmox_gpu_cluster.args import ComponentArgs
from proxmox_gpu_cluster.core.capacity import WorkerCapacity, advertised_total, quota_hard
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.scheduling_spec import PriorityClassName, Quota
from proxmox_gpu_cluster.core.spec_base import field_path
from proxmox_gpu_cluster.core.validation_scheduling import (
    quota_capacity_problems,
    quota_capacity_warnings,
    quota_problems,
)
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import caller_dependencies


def quota_object_name(quota: Quota) -> str:
    """``gpu-quota``, or ``gpu-quota-<class>`` for a quota that counts only one PriorityClass's pods."""
    return "gpu-quota" if quota.priority_class is None else f"gpu-quota-{quota.priority_class}"


class GpuQuotasArgs(ComponentArgs):
    """The quotas, and what they are judged against: what the nodes advertise and the PriorityClasses that
    exist (the rules the stack file's ``quotas`` get)."""

    quotas: tuple[Quota, ...] = Field(min_length=1, description="One ResourceQuota per entry.")
    capacity: tuple[WorkerCapacity, ...] = Field(
        min_length=1,
        description="What the GPU nodes advertise, a row per node (``GpuStack.capacity()``): a quota on a "
        "resource no node advertises is refused, one above the total is logged as a warning.",
    )
    priority_classes: tuple[PriorityClassName, ...] = Field(
        default=(),
        description="Names of the PriorityClasses a scoped quota may count (e.g. those of ``GpuPriorityClasses``; "
        "give that component in ``opts.depends_on`` so they exist first).",
    )

    @model_validator(mode="after")
    def _rules(self) -> GpuQuotasArgs:
        problems = [
            *quota_problems(self.quotas),
            *quota_capacity_problems(
                self.quotas, self.advertised, self.priority_classes, classes_at="priority_classes"
            ),
        ]
        if problems:
            raise SpecViolations(Problem(field_path(type(self), p.path), p.message) for p in problems)
        return self

    @cached_property
    def advertised(self) -> dict[str, int]:
        """Resource -> how many all nodes together advertise."""
        return advertised_total(self.capacity)

    @property
    def warnings(self) -> list[str]:
        """Quotas above what all nodes together advertise (legal, but a sign of a typo)."""
        return quota_capacity_warnings(self.quotas, self.advertised)


class GpuQuotas(pulumi.ComponentResource):
    """One ResourceQuota per entry, in the entry's namespace; a quota above what the nodes advertise is logged
    as a warning on the component."""

    namespaces: pulumi.Output[list[str]]
    """Namespaces that got a quota."""

    def __init__(self, name: str, args: GpuQuotasArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the Kubernetes provider in ``opts.provider`` (the children inherit it); ``opts.depends_on``
        (e.g. the ``GpuPriorityClasses`` the scoped quotas name) reaches every ResourceQuota."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:gpu_quota:GpuQuotas", name, None, opts)
        for warning in args.warnings:
            pulumi.log.warn(warning, resource=self)
        child = pulumi.ResourceOptions(parent=self, depends_on=caller_dependencies(opts))
        for quota in args.quotas:
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
                opts=child,
            )
        self.namespaces = pulumi.Output.from_input(sorted({q.namespace for q in args.quotas}))
        self.register_outputs({"namespaces": self.namespaces})
