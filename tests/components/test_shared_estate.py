"""Two clusters of one program: what they share is allowed, what only one may own is refused naming both."""

from __future__ import annotations

import copy
from typing import Any

from proxmox_gpu_cluster.core.names import StackScope
from proxmox_gpu_cluster.core.shared_estate import ClusterClaim, estate_conflicts
from proxmox_gpu_cluster.core.spec import load_spec
from tests.support import base_spec, two_team_specs


def claim(name: str, raw: dict[str, Any], cluster: str | None = None) -> ClusterClaim:
    scope = StackScope("p", "s", name if cluster is None else cluster)
    return ClusterClaim(name, scope, load_spec(raw))


def test_disjoint_clusters_share_hosts_and_kubernetes() -> None:
    a, b = two_team_specs()
    assert estate_conflicts(claim("a", a), claim("b", b)) == []


def test_every_double_claim_is_named_with_both_clusters() -> None:
    a, b = two_team_specs()
    b["workers"][0].update(vmid=a["workers"][0]["vmid"], name=a["workers"][0]["name"])
    b["proxmox"]["nodes"] = copy.deepcopy(a["proxmox"]["nodes"])
    b["workers"][0]["gpus"] = ["a100-0"]
    b["gpuOperator"] = copy.deepcopy(a["gpuOperator"])
    b["kubernetes"]["drain"] = {}
    lines = estate_conflicts(claim("a", a), claim("b", b))
    assert all(line.startswith("GpuCluster 'b' and GpuCluster 'a' both claim ") for line in lines)
    text = "\n".join(lines)
    worker = a["workers"][0]
    assert f"VM id {worker['vmid']}" in text and f"Kubernetes node {worker['name']}" in text
    assert "the GPU at " in text and "the GPU Operator" in text and "rollout slots' namespace" in text


def test_other_datacenters_and_other_kubernetes_clusters_may_reuse_everything() -> None:
    a = base_spec()
    b = copy.deepcopy(a)
    b["proxmox"]["endpoint"] = "https://pve-other.lab.internal:8006/"
    b["kubernetes"]["apiEndpoint"] = "k8s-other.lab.internal:6443"
    assert estate_conflicts(claim("a", a), claim("b", b)) == []


def test_two_stack_scoped_clusters_would_share_names() -> None:
    a, b = two_team_specs()
    lines = estate_conflicts(claim("a", a, ""), claim("b", b, ""))
    assert lines == [
        "GpuCluster 'b' and GpuCluster 'a' would name their PCI mappings, snippets and images alike (stack 's' of "
        "project 'p'): give at most one of them stack_scoped_names=True"
    ]
