"""GpuPriorityClasses: the PriorityClasses GPU workloads select, so important work can preempt the rest."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as kubernetes
from pydantic import Field, model_validator

from proxmox_gpu_cluster.args import ComponentArgs
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.scheduling_spec import PriorityClassSpec
from proxmox_gpu_cluster.core.spec_base import field_path
from proxmox_gpu_cluster.core.validation_scheduling import priority_class_problems
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import caller_dependencies


class GpuPriorityClassesArgs(ComponentArgs):
    """The PriorityClasses to create, checked by the rules the stack file's ``priorityClasses`` get."""

    classes: tuple[PriorityClassSpec, ...] = Field(
        min_length=1, description="The classes, each named as given (unique; at most one global default)."
    )

    @model_validator(mode="after")
    def _rules(self) -> GpuPriorityClassesArgs:
        problems = priority_class_problems(self.classes, base="classes")
        if problems:
            raise SpecViolations(Problem(field_path(type(self), p.path), p.message) for p in problems)
        return self


class GpuPriorityClasses(pulumi.ComponentResource):
    """One cluster-scoped PriorityClass per entry, named as given.

    Kubernetes refuses changes to a PriorityClass's ``value`` (the field is immutable), so a new value replaces
    the object; pods keep the priority they were admitted with.
    """

    names: pulumi.Output[list[str]]
    """Names of the PriorityClasses, once they exist."""

    def __init__(self, name: str, args: GpuPriorityClassesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the Kubernetes provider in ``opts.provider`` (the children inherit it); ``opts.depends_on``
        reaches every PriorityClass."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:priority_classes:GpuPriorityClasses", name, None, opts)
        child = pulumi.ResourceOptions(parent=self, depends_on=caller_dependencies(opts))
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
                opts=child,
            )
            for c in args.classes
        ]
        self.names = pulumi.Output.all(*[pc.metadata.apply(lambda m: m.name) for pc in created]).apply(list)
        self.register_outputs({"names": self.names})
