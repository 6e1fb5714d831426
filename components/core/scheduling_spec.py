"""Spec models of GPU scheduling policy: ResourceQuotas and PriorityClasses. Pure."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.quoting import LINE_BREAKERS
from proxmox_gpu_cluster.core.spec_base import EXTENDED_RESOURCE, Int, Name, SpecModel

MAX_QUOTA = 1_000_000
"""Upper bound of a quota value (extended resources count devices, not bytes)."""
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
PriorityClassName = Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)]
"""A PriorityClass name: a DNS subdomain (RFC 1123: lower-case labels joined by dots, at most 253 characters), the
rule Kubernetes applies to it (pkg/apis/scheduling/validation ``ValidatePriorityClass``: ``ValidateObjectMeta``
with ``NameIsDNSSubdomain``), so ``high.gpu`` is a valid name."""
# Values above one billion are reserved for the system classes (scheduling/v1 PriorityClass, `value`).
MAX_USER_PRIORITY = 1_000_000_000
MIN_PRIORITY = -2_147_483_648


class PriorityClassSpec(SpecModel):
    """A PriorityClass GPU workloads name in ``priorityClassName``; higher values may preempt lower ones."""

    name: PriorityClassName = Field(description="Name of the PriorityClass (a DNS subdomain; ``system-`` is reserved).")
    value: Int = Field(
        ge=MIN_PRIORITY, le=MAX_USER_PRIORITY, description="Priority; above 1000000000 is reserved for the system."
    )
    preemption_policy: Literal["PreemptLowerPriority", "Never"] = Field(
        default="PreemptLowerPriority",
        description="Never: the pod waits for capacity instead of evicting lower-priority pods.",
    )
    description: Annotated[str, Field(max_length=1024, pattern=f"^[^{LINE_BREAKERS}]*$")] = Field(
        default="", description="What the class is for (shown by kubectl describe)."
    )
    global_default: bool = Field(
        default=False, description="Pods without a priorityClassName get this class (at most one in a cluster)."
    )

    @model_validator(mode="after")
    def _not_reserved(self) -> PriorityClassSpec:
        if self.name.startswith("system-"):
            raise SpecViolations([Problem("name", f"{self.name}: the system- prefix is reserved for Kubernetes")])
        return self


class Quota(SpecModel):
    """A ResourceQuota on GPU resources in one namespace, optionally only for pods of one PriorityClass."""

    namespace: Name = Field(description="Namespace the quota applies to.")
    resources: dict[
        Annotated[str, Field(pattern=EXTENDED_RESOURCE, max_length=253)], Annotated[Int, Field(ge=0, le=MAX_QUOTA)]
    ] = Field(min_length=1, description="Extended resource -> maximum requested, e.g. ``nvidia.com/gpu: 4``.")
    # 243: the ResourceQuota is named gpu-quota-<class>, at most 253 characters.
    priority_class: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=243)] | None = Field(
        default=None,
        description="Count only pods of this PriorityClass (a scopeSelector); it must be one of priorityClasses.",
    )

    @model_validator(mode="after")
    def _no_prefix(self) -> Quota:
        # Kubernetes only allows `requests.` quotas for extended resources; we add the prefix ourselves.
        prefixed = [r for r in self.resources if r.startswith(("requests.", "limits."))]
        if prefixed:
            raise SpecViolations(
                Problem(
                    f"resources.{r}",
                    f"write the resource name only ({r.split('.', 1)[1]}); the requests. prefix is added for you",
                )
                for r in prefixed
            )
        return self
