"""NodeStepAccess: the slot namespace and the RBAC that lets the node steps act as the node itself (kubelet's own
credential) instead of carrying the admin kubeconfig to every machine (render/node_rbac.py says what and why)."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as kubernetes
from pydantic import Field, field_validator

from proxmox_gpu_cluster.args import ComponentArgs
from proxmox_gpu_cluster.core.spec_base import Name
from proxmox_gpu_cluster.core.validation_hosts import reserved_slot_namespace
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import caller_dependencies
from proxmox_gpu_cluster.render import node_rbac


def _meta(name: str, namespace: pulumi.Input[str] | None = None) -> kubernetes.meta.v1.ObjectMetaArgs:
    return kubernetes.meta.v1.ObjectMetaArgs(name=name, namespace=namespace, labels=dict(node_rbac.MANAGED))


def _rules(rules: tuple[dict[str, list[str]], ...]) -> list[kubernetes.rbac.v1.PolicyRuleArgs]:
    return [
        kubernetes.rbac.v1.PolicyRuleArgs(api_groups=r["apiGroups"], resources=r["resources"], verbs=r["verbs"])
        for r in rules
    ]


def _subjects() -> list[kubernetes.rbac.v1.SubjectArgs]:
    return [kubernetes.rbac.v1.SubjectArgs(kind=s["kind"], api_group=s["apiGroup"], name=s["name"])
            for s in node_rbac.subjects()]  # fmt: skip


class NodeStepAccessArgs(ComponentArgs):
    """Where the rollout slots live."""

    slot_namespace: Name = Field(
        description="Namespace of the rollout slots (``kubernetes.drain.slotNamespace``); the component creates it, "
        "owns it and lets every node write its ConfigMaps, so never one every cluster has (``kube-system``...)."
    )

    @field_validator("slot_namespace")
    @classmethod
    def _the_stacks_own(cls, value: str) -> str:
        why = reserved_slot_namespace(value)
        if why is not None:
            raise ValueError(why)
        return value


class NodeStepAccess(pulumi.ComponentResource):
    """The rollout slots' Namespace, a Role and RoleBinding there (ConfigMaps) and a ClusterRole and binding (get
    Nodes, delete a node's own Node), all for the group ``system:nodes``. Node steps that change a joined node
    (driver, verify, MIG, retirement) wait for it: pass it in their ``opts.depends_on``."""

    namespace: pulumi.Output[str]
    """The slot namespace, once it exists."""

    def __init__(self, name: str, args: NodeStepAccessArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the Kubernetes provider in ``opts.provider`` (the children inherit it); ``opts.depends_on``
        reaches the Namespace and the cluster-scoped objects."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:node_access:NodeStepAccess", name, None, opts)
        slot_namespace = args.slot_namespace
        child = pulumi.ResourceOptions(parent=self)
        first = pulumi.ResourceOptions(parent=self, depends_on=caller_dependencies(opts))
        ns = kubernetes.core.v1.Namespace(
            f"{name}-namespace", kubernetes.core.v1.NamespaceInitArgs(metadata=_meta(slot_namespace)), opts=first
        )
        self.namespace = ns.metadata.apply(lambda m: (m.name if m is not None else None) or slot_namespace)
        role, cluster_role = node_rbac.ROLE_NAME, node_rbac.cluster_role_name(slot_namespace)
        rbac = kubernetes.rbac.v1
        rbac.Role(
            f"{name}-role",
            rbac.RoleInitArgs(metadata=_meta(role, self.namespace), rules=_rules(node_rbac.SLOT_RULES)),
            opts=child,
        )
        rbac.RoleBinding(
            f"{name}-role-binding",
            rbac.RoleBindingInitArgs(
                metadata=_meta(role, self.namespace),
                role_ref=rbac.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role", name=role),
                subjects=_subjects(),
            ),
            opts=child,
        )
        rbac.ClusterRole(
            f"{name}-cluster-role",
            rbac.ClusterRoleInitArgs(metadata=_meta(cluster_role), rules=_rules(node_rbac.NODE_RULES)),
            opts=first,
        )
        rbac.ClusterRoleBinding(
            f"{name}-cluster-role-binding",
            rbac.ClusterRoleBindingInitArgs(
                metadata=_meta(cluster_role),
                role_ref=rbac.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=cluster_role),
                subjects=_subjects(),
            ),
            opts=first,
        )
        self.register_outputs({"namespace": self.namespace})
