"""Two clusters of one program on a shared estate: what they may share and what only one of them may own. Pure.

Several clusters (two teams, or dev and prod in one program) may use the same Proxmox nodes and the same
Kubernetes cluster. What is host-wide is composed, not overwritten: host prep keeps one drop-in per owner and binds
the union of their GPUs (``scripts/host_prep.sh``); names on Proxmox carry each cluster's scope (``names.py``). What
exists once per Proxmox datacenter or per Kubernetes cluster can have one owner only, and a second one is refused
here, before anything registers, naming both: a GPU passed through, a VM id, a Kubernetes node, the rollout slots'
namespace, the GPU Operator, the KubeVirt CR's devices, a PriorityClass, a quota, the monitoring objects.

Two clusters share a Proxmox datacenter when their ``proxmox.endpoint`` names the same scheme, host and port however
it is spelled (case, trailing slash, default port), and a Kubernetes cluster when their ``kubernetes.apiEndpoint``
does. Two stacks are separate programs: their names on Proxmox differ by scope and
host prep composes their drop-ins, but only ``pulumi up`` (the Kubernetes API refusing a second create) can tell
that two stacks claim one Kubernetes object.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from proxmox_gpu_cluster.core.names import StackScope

if TYPE_CHECKING:
    from proxmox_gpu_cluster.core.spec import ClusterSpec


@dataclass(frozen=True)
class ClusterClaim:
    """One cluster of a program: its name, the scope of its names on Proxmox, its spec."""

    name: str
    scope: StackScope
    spec: ClusterSpec


DEFAULT_PORTS = {"http": 80, "https": 443}
"""The port a URL without one means (RFC 3986 section 6.2.3: an explicit default port is the same URL)."""


def _same_host(host: str) -> str:
    """A host as compared here: an IP address in canonical form, a DNS name in lower case without a final dot
    (RFC 4343: DNS names compare case-insensitively)."""
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return host.lower().rstrip(".")


def same_proxmox(endpoint: str) -> tuple[str, str, int]:
    """A validated ``proxmox.endpoint`` as compared between clusters: scheme, host and port, so that
    ``https://PVE1.example:443`` and ``https://pve1.example/`` are one datacenter (RFC 3986 section 6.2.2-6.2.3:
    scheme and host are case-insensitive, an empty path is ``/``, a default port may be left out)."""
    parts = urlsplit(endpoint.strip())
    scheme = parts.scheme.lower()
    return scheme, _same_host(parts.hostname or ""), parts.port or DEFAULT_PORTS.get(scheme, 0)


def same_kubernetes(api_endpoint: str) -> tuple[str, str]:
    """A validated ``kubernetes.apiEndpoint`` (``host:port``, ``[IPv6]:port``) as compared between clusters."""
    host, _, port = api_endpoint.rpartition(":")
    return _same_host(host), port.lstrip("0") or "0"


def _proxmox_claims(spec: ClusterSpec) -> dict[str, str]:
    """What exists once per Proxmox datacenter -> how a message names it."""
    claims = {f"vmid {w.vmid}": f"VM id {w.vmid}" for w in spec.workers}
    for node in spec.proxmox.nodes:
        for _, gpu in node.passthrough_gpus:
            claims[f"gpu {node.name} {gpu.pci_path}"] = f"the GPU at {gpu.pci_path} of Proxmox node {node.name}"
    return claims


def _kubernetes_claims(spec: ClusterSpec) -> dict[str, str]:
    """What exists once per Kubernetes cluster -> how a message names it."""
    claims: dict[str, str] = {}
    for name in [w.name for w in spec.workers] + [n.name for n in spec.kubevirt.nodes]:
        claims[f"node {name}"] = f"Kubernetes node {name}"
    if spec.kubernetes.join_method == "kubeadm" and spec.workers:
        ns = spec.kubernetes.drain.slot_namespace
        claims[f"slots {ns}"] = f"the rollout slots' namespace {ns} (kubernetes.drain.slotNamespace)"
    op = spec.gpu_operator
    if op.enabled:
        claims["operator"] = "the GPU Operator (gpuOperator.enabled)"
        if op.monitoring.prometheus or op.monitoring.dashboard.enabled:
            claims["monitoring"] = "the GPU monitoring objects (gpuOperator.monitoring)"
    if spec.kubevirt.enabled and spec.kubevirt.patch_kubevirt:
        kv = spec.kubevirt
        claims["kubevirt"] = f"the permitted host devices of KubeVirt CR {kv.namespace}/{kv.name}"
    for c in spec.priority_classes:
        claims[f"priority {c.name}"] = f"PriorityClass {c.name}"
    for q in spec.quotas:
        claims[f"quota {q.namespace}"] = f"the GPU quota of namespace {q.namespace}"
    return claims


def estate_conflicts(first: ClusterClaim, second: ClusterClaim) -> list[str]:
    """Why ``second`` cannot join a program that already has ``first`` (empty: it can), one line per conflict."""
    a, b = first.spec, second.spec
    who = f"GpuCluster {second.name!r} and GpuCluster {first.name!r}"
    lines = []
    if first.scope.token == second.scope.token:
        lines.append(
            f"{who} would name their PCI mappings, snippets and images alike ({first.scope.describe()}): give at "
            "most one of them stack_scoped_names=True"
        )
    shared: list[str] = []
    if same_proxmox(a.proxmox.endpoint) == same_proxmox(b.proxmox.endpoint):
        mine = _proxmox_claims(a)
        shared += [what for key, what in _proxmox_claims(b).items() if key in mine]
    if same_kubernetes(a.kubernetes.api_endpoint) == same_kubernetes(b.kubernetes.api_endpoint):
        mine = _kubernetes_claims(a)
        shared += [what for key, what in _kubernetes_claims(b).items() if key in mine]
    lines += [f"{who} both claim {what}; only one cluster may own it" for what in shared]
    return lines
