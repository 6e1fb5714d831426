"""What the nodes' own credentials may do beyond Kubernetes' defaults, so the node steps (components/agent) need no
admin kubeconfig on the machine. Pure data: the component (gpu/node_access.py) registers it, the fake API server in
the tests authorizes with it.

A node (user ``system:node:<name>``, group ``system:nodes``) may by default, through the Node authorizer and the
NodeRestriction admission plugin (kubernetes plugin/pkg/auth/authorizer/node/node_authorizer.go,
plugin/pkg/admission/noderestriction/admission.go): read and patch its own Node (cordon, annotations, labels outside
kubernetes.io; not its taints), list its own pods (field selector spec.nodeName) and evict them. It may read no
other Node (AuthorizeNodeWithSelectors, on from Kubernetes 1.32), delete no Node, and write Leases only in
kube-node-lease under its own name. The grants below add, for the group ``system:nodes``:

- in the slot namespace: list, create and update ConfigMaps (the rollout slots: read as one list, taken by a create
  or a replace at the version read; no delete: a release writes an empty holder);
- cluster-wide: ``get`` Nodes (whether an expired slot's holder is still cordoned for it) and ``delete`` Nodes (the
  retirement deletes its own Node; NodeRestriction refuses a node any other Node's name).
"""

from __future__ import annotations

from typing import Any

NODES_GROUP = "system:nodes"
MANAGED = {"app.kubernetes.io/managed-by": "proxmox-gpu-cluster"}
ROLE_NAME = "proxmox-gpu-cluster-node-steps"

SLOT_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "create", "update"]},
)
"""What nodes may do in the slot namespace."""
NODE_RULES: tuple[dict[str, Any], ...] = ({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "delete"]},)
"""What nodes may do cluster-wide."""


def cluster_role_name(namespace: str) -> str:
    """The ClusterRole (and its binding) of the clusters whose slots live in ``namespace``: one per namespace, so
    two clusters that share a Kubernetes cluster (and use different slot namespaces) do not share it."""
    return f"{ROLE_NAME}:{namespace}"


def subjects() -> list[dict[str, str]]:
    return [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": NODES_GROUP}]


def objects(namespace: str) -> list[dict[str, Any]]:
    """The Kubernetes objects, as manifests (what the component registers, field for field)."""
    meta = {"labels": dict(MANAGED)}
    role_ref = {"apiGroup": "rbac.authorization.k8s.io"}
    cluster_name = cluster_role_name(namespace)
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, **meta}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": ROLE_NAME, "namespace": namespace, **meta}, "rules": [dict(r) for r in SLOT_RULES]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": ROLE_NAME, "namespace": namespace, **meta},
         "roleRef": {**role_ref, "kind": "Role", "name": ROLE_NAME}, "subjects": subjects()},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": cluster_name, **meta}, "rules": [dict(r) for r in NODE_RULES]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": cluster_name, **meta},
         "roleRef": {**role_ref, "kind": "ClusterRole", "name": cluster_name}, "subjects": subjects()},
    ]  # fmt: skip
