"""GpuNodeLabels: labels and taints on GPU worker nodes, applied before the operator release."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_kubernetes as kubernetes
from pydantic import Field, model_validator

from proxmox_gpu_cluster.args import ComponentArgs
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import caller_dependencies
from proxmox_gpu_cluster.render.gpu_stack import GpuStack


def stack_problems(stack: GpuStack, base: str = "stack") -> list[Problem]:
    """``GpuStack.problems`` below ``base`` (the args field holding the stack)."""
    return [Problem(f"{base}.{p.path}" if p.path else base, p.message) for p in stack.problems()]


class GpuNodeLabelsArgs(ComponentArgs):
    """The stack whose nodes get labels, and per-node ordering that ``opts`` cannot express."""

    stack: GpuStack = Field(description="The operator settings and the GPU nodes (the object ``GpuOperator`` takes).")
    node_ready: Mapping[str, Sequence[pulumi.Resource]] = Field(
        default_factory=dict,
        description="Node name -> what that node's patch waits for (e.g. its ``GuestBootstrap``); other nodes do "
        "not wait for it. Per node, so not ``opts.depends_on`` (which every patch waits for).",
    )
    replace_with: Mapping[str, Sequence[pulumi.Resource]] = Field(
        default_factory=dict,
        description="Node name -> resources whose replacement makes that node's patch start over (a replaced VM "
        "joins as a new Node object, which needs its labels and taint again: pass the bootstrap's ``final_step``).",
    )

    @model_validator(mode="after")
    def _nodes(self) -> GpuNodeLabelsArgs:
        problems = stack_problems(self.stack)
        if not problems:
            names = {n.name for n in self.stack.nodes}
            for field, given in (("node_ready", self.node_ready), ("replace_with", self.replace_with)):
                problems += [
                    Problem(f"{field}.{node}", f"not a node of the stack ({', '.join(sorted(names))})")
                    for node in given
                    if node not in names
                ]
        if problems:
            raise SpecViolations(problems)
        return self


class GpuNodeLabels(pulumi.ComponentResource):
    """A NodePatch per GPU node of a ``GpuStack`` with the operator's config labels and the optional GPU taint.

    Works for any existing node by name (bare metal, or VMs provisioned elsewhere). For VMs this stack boots, pass
    each node's ``GuestBootstrap`` in ``node_ready`` (node name -> resources): that node's patch waits for it,
    other nodes do not. ``replace_with`` (node name -> resources) makes a node's patch start over when they are
    replaced: a replaced VM joins as a new Node object, which needs its labels and taint again (pass the
    bootstrap's ``final_step``).
    """

    nodes: pulumi.Output[list[str]]
    """Names of the patched nodes."""
    labels: pulumi.Output[dict[str, dict[str, str]]]
    """Node name -> the labels its patch sets."""
    patches: dict[str, kubernetes.core.v1.NodePatch]
    """Node name -> its patch, for whatever must be ordered around it (a node's retirement waits for it)."""

    def __init__(self, name: str, args: GpuNodeLabelsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the Kubernetes provider in ``opts.provider`` (the patches inherit it); ``opts.depends_on``
        reaches every patch."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:gpu_node:GpuNodeLabels", name, None, opts)
        stack, node_ready, replace_with = args.stack, args.node_ready, args.replace_with
        everyone = caller_dependencies(opts)
        names: list[str] = []
        applied: dict[str, dict[str, str]] = {}
        self.patches = {}

        def patch(node: str, labels: dict[str, str], taint: bool, ready: Sequence[pulumi.Resource]) -> None:
            taints = (
                [kubernetes.core.v1.TaintPatchArgs(key="nvidia.com/gpu", value="true", effect="NoSchedule")]
                if taint
                else None
            )
            self.patches[node] = kubernetes.core.v1.NodePatch(
                f"{name}-{node}",
                kubernetes.core.v1.NodePatchArgs(
                    metadata=kubernetes.meta.v1.ObjectMetaPatchArgs(
                        name=node,
                        labels=labels,
                        # The operator writes nvidia.com/mig.config=all-disabled on unlabelled MIG-capable nodes;
                        # force our field ownership instead of failing on the SSA conflict.
                        annotations={"pulumi.com/patchForce": "true"},
                    ),
                    spec=kubernetes.core.v1.NodeSpecPatchArgs(taints=taints) if taints else None,
                ),
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=[*everyone, *ready],
                    replace_with=list(replace_with.get(node, ())),
                ),
            )
            names.append(node)
            applied[node] = labels

        for node in stack.nodes:
            patch(node.name, stack.labels[node.name], node.taint, node_ready.get(node.name, ()))
        self.nodes = pulumi.Output.from_input(names)
        self.labels = pulumi.Output.from_input(applied)
        self.register_outputs({"nodes": self.nodes, "labels": self.labels})
