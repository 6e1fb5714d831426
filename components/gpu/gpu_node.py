"""GpuNodeLabels: labels and taints on GPU worker nodes, applied before the operator release."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.render.gpu_stack import GpuStack


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

    def __init__(
        self,
        name: str,
        stack: GpuStack,
        *,
        provider: kubernetes.Provider,
        node_ready: Mapping[str, Sequence[pulumi.Resource]] | None = None,
        replace_with: Mapping[str, Sequence[pulumi.Resource]] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("proxmox-gpu-cluster:gpu_node:GpuNodeLabels", name, None, opts)
        problems = stack.problems()
        if problems:
            raise InvalidComponentArgs(name, problems)
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
                    provider=provider,
                    depends_on=list(ready),
                    replace_with=list((replace_with or {}).get(node, ())),
                ),
            )
            names.append(node)
            applied[node] = labels

        for node in stack.nodes:
            patch(node.name, stack.labels[node.name], node.taint, (node_ready or {}).get(node.name, ()))
        self.nodes = pulumi.Output.from_input(names)
        self.labels = pulumi.Output.from_input(applied)
        self.register_outputs({"nodes": self.nodes, "labels": self.labels})
