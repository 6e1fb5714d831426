"""Cross-field rules about machines and addresses: static IPs, boot images, Proxmox node options, namespaces. Pure.

Part of the rules ``components.validation.cross_check`` runs; each function returns problems.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from proxmox_gpu_cluster.core.errors import Problem
from proxmox_gpu_cluster.core.net_checks import endpoint_host

if TYPE_CHECKING:
    # Types only: the spec module runs the cross-field validation, which imports this module.
    from proxmox_gpu_cluster.core.spec import ClusterSpec

RESERVED_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
"""Namespaces every cluster has: the stack creates (and on destroy would delete) the ones it installs into."""


def host_problems(spec: ClusterSpec) -> list[Problem]:
    """Every problem this module knows about."""
    return [*_addresses(spec), *_images(spec), *_proxmox_nodes(spec), *_namespaces(spec), *_slot_namespace(spec)]


SLOT_NAMESPACE_RISK = (
    "the stack creates the rollout slots' namespace, owns it (a destroy deletes it) and lets every node "
    "(group system:nodes) write every ConfigMap in it"
)
"""Why the slot namespace must be the stack's own."""


def reserved_slot_namespace(name: str) -> str | None:
    """Why ``name`` cannot be the rollout slots' namespace on any cluster, or None."""
    if name in RESERVED_NAMESPACES:
        return f"{name} exists in every Kubernetes cluster, and {SLOT_NAMESPACE_RISK}; use a namespace of its own"
    return None


def _slot_namespace(spec: ClusterSpec) -> list[Problem]:
    """The slot namespace is the stack's alone: not one every cluster has, not one the spec uses for something else
    (granting the nodes its ConfigMaps would hand them the operator's or KubeVirt's configuration)."""
    ns = spec.kubernetes.drain.slot_namespace
    at = "kubernetes.drain.slotNamespace"
    why = reserved_slot_namespace(ns)
    if why is not None:
        return [Problem(at, why)]
    op = spec.gpu_operator
    others = [("gpuOperator.namespace", op.namespace), ("gpuOperator.dra.namespace", op.dra.namespace),
              ("kubevirt.namespace", spec.kubevirt.namespace),
              ("gpuOperator.monitoring.namespace", op.monitoring.namespace),
              ("gpuOperator.monitoring.dashboard.namespace", op.monitoring.dashboard.namespace)]  # fmt: skip
    others += [(f"quotas[{i}].namespace", q.namespace) for i, q in enumerate(spec.quotas)]
    used = next((path for path, name in others if name == ns), None)
    if used is None:
        return []
    return [Problem(at, f"{ns} is also {used}, and {SLOT_NAMESPACE_RISK}; use a namespace of its own")]


def _same_host(host: str) -> str:
    """A host as compared here: an IP address in canonical form, a DNS name in lower case without a final dot."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower().rstrip(".")


def _addresses(spec: ClusterSpec) -> list[Problem]:
    """A Proxmox node's address belongs to that node; a static address belongs to one worker, and never to a
    Proxmox node, the Proxmox API host or the Kubernetes API server."""
    taken: dict[str, str] = {}
    out: list[Problem] = []
    for i, node in enumerate(spec.proxmox.nodes):
        this = f"proxmox.nodes[{i}] ({node.name})"
        first = taken.setdefault(_same_host(node.ssh_address), this)
        if first != this:
            out.append(Problem(f"proxmox.nodes[{i}].sshAddress", f"{node.ssh_address} is already used by {first}"))
    api_host = urlsplit(spec.proxmox.endpoint).hostname or ""
    taken.setdefault(_same_host(api_host), "the Proxmox API endpoint (proxmox.endpoint)")
    taken.setdefault(_same_host(endpoint_host(spec.kubernetes.api_endpoint)), "the Kubernetes API endpoint")
    for i, worker in enumerate(spec.workers):
        address = worker.network.static_address
        if address is None:
            continue
        owner = taken.get(_same_host(address))
        if owner is not None:
            out.append(Problem(f"workers[{i}].network.ipv4", f"{address} is already used by {owner}"))
        else:
            taken[address] = f"workers[{i}] ({worker.name})"
    return out


def _images(spec: ClusterSpec) -> list[Problem]:
    vmids = {w.vmid: i for i, w in enumerate(spec.workers)}
    out: list[Problem] = []
    for i, worker in enumerate(spec.workers):
        template = worker.image.template_vmid
        if template is None:
            continue
        at = f"workers[{i}].image.templateVmid"
        if template == worker.vmid:
            out.append(Problem(at, f"{template} is this worker's own vmid; a VM cannot be cloned from itself"))
        elif template in vmids:
            out.append(Problem(at, f"{template} is the vmid of workers[{vmids[template]}], not a template"))
    return out


def _proxmox_nodes(spec: ClusterSpec) -> list[Problem]:
    """Options that only host prep applies, and what KubeVirt worker VMs need from their node."""
    out: list[Problem] = []
    index = {n.name: i for i, n in enumerate(spec.proxmox.nodes)}
    for i, node in enumerate(spec.proxmox.nodes):
        at = f"proxmox.nodes[{i}]"
        if not node.host_prep:
            if node.acs_override:
                out.append(
                    Problem(f"{at}.acsOverride", "only host prep applies the override; set hostPrep: true (or drop it)")
                )
            if node.iommu_passthrough:
                out.append(
                    Problem(f"{at}.iommuPassthrough", "only host prep adds iommu=pt; set hostPrep: true (or drop it)")
                )
            if node.nested_virtualization:
                out.append(
                    Problem(f"{at}.nestedVirtualization", "host prep's verify step checks it; set hostPrep: true")
                )
            if node.reboot_policy != "when-idle":
                out.append(Problem(f"{at}.rebootPolicy", "only host prep reboots a node; set hostPrep: true"))
    for i, worker in enumerate(spec.workers):
        n_i = index.get(worker.node)
        if worker.workload == "container" or n_i is None:
            continue
        node = spec.proxmox.nodes[n_i]
        if node.host_prep and not node.nested_virtualization:
            out.append(
                Problem(
                    f"workers[{i}].workload",
                    f"{worker.workload} workers run VMs themselves: set proxmox.nodes[{n_i}].nestedVirtualization: "
                    "true so host verify checks the node's kvm module",
                )
            )
    return out


def _namespaces(spec: ClusterSpec) -> list[Problem]:
    """The stack creates the operator's and the DRA driver's namespaces (one Namespace when they are the same)."""
    op = spec.gpu_operator
    created = [("gpuOperator.namespace", op.namespace, op.enabled)]
    created.append(("gpuOperator.dra.namespace", op.dra.namespace, any(w.dra for w in spec.workers)))
    return [
        Problem(path, f"{name} exists in every cluster; the stack creates and owns this namespace, so pick another")
        for path, name, used in created
        if used and name in RESERVED_NAMESPACES
    ]
