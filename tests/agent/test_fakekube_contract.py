"""The contract of the fake API server (tests/components/scripts/fakekube.py) with the real one: the same requests,
as the agent's kubectl sends them with a node's own credential, against both; the exit code, the API status reason
kubectl prints ("(Forbidden)", "(Conflict)", "(TooManyRequests)", ...) and the words the agent or its tests read
must agree. The fake stays for the harnesses that need hundreds of fast runs (fault injection, rollout simulations);
this keeps it honest to kube-apiserver (Node authorizer, NodeRestriction, RBAC, eviction with budgets)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.agent.agent import KUBECONFIG, cluster
from tests.components.scripts.fakekube import FakeCluster, Pod, kubelet_conf
from tests.kubeapi_real import RealCluster, real_cluster

__all__ = ["real_cluster"]

pytestmark = pytest.mark.slow

SLOT = "proxmox-gpu-cluster-rollout-0"


def configmap(namespace: str, version: str | None = None) -> str:
    meta: dict[str, Any] = {"name": SLOT, "namespace": namespace}
    if version is not None:
        meta["resourceVersion"] = version
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"holder": "gpu-a"}})


def eviction(namespace: str, pod: str) -> tuple[str, ...]:
    return ("create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", "-f", "-")


def evict_body(namespace: str, pod: str) -> str:
    return json.dumps(
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    )


FAKE_NAMES = {
    "a": "gpu-a",
    "b": "gpu-b",
    "gone": "gpu-gone",
    "ns": "ml",
    "slots": "proxmox-gpu-cluster",
    "bare": "other",
}


def requests(n: dict[str, str]) -> list[tuple[str, tuple[str, ...], str | None]]:
    """(what, kubectl's arguments as node a, stdin), in this order, with the world's names: a and b (nodes), gone
    (no such node), ns (the pods), slots (the slot namespace, with the node-steps RBAC), bare (without it)."""
    own, other = f"spec.nodeName={n['a']}", f"spec.nodeName={n['b']}"
    pods = ("get", "pods", "--all-namespaces", "--field-selector")
    return [
        ("read its own Node", ("get", "node", n["a"], "-o", "json"), None),
        ("read another Node (RBAC get nodes)", ("get", "node", n["b"], "-o", "json"), None),
        ("read a missing Node", ("get", "node", n["gone"], "-o", "json"), None),
        ("read a missing Node, ignored", ("get", "node", n["gone"], "--ignore-not-found", "-o", "json"), None),
        ("cordon another Node", ("cordon", n["b"]), None),
        ("cordon its own Node", ("cordon", n["a"]), None),
        ("annotate at a stale version", ("annotate", "node", n["a"], "--overwrite", "k=v", "--resource-version=1"),
         None),
        ("list another node's pods", (*pods, other, "-o", "json"), None),
        ("list its own pods", (*pods, own, "-o", "json"), None),
        ("evict another node's pod", eviction(n["ns"], "elsewhere"), evict_body(n["ns"], "elsewhere")),
        ("evict a pod its budget guards", eviction(n["ns"], "guarded"), evict_body(n["ns"], "guarded")),
        ("evict its own pod", eviction(n["ns"], "own"), evict_body(n["ns"], "own")),
        ("evict a pod that is gone", eviction(n["ns"], "own"), evict_body(n["ns"], "own")),
        ("list slots without the RBAC", ("get", "configmaps", "-n", n["bare"], "-o", "json"), None),
        ("list slots", ("get", "configmaps", "-n", n["slots"], "-o", "json"), None),
        ("create a slot", ("create", "-f", "-"), configmap(n["slots"])),
        ("create it again", ("create", "-f", "-"), configmap(n["slots"])),
        ("replace at a stale version", ("replace", "-f", "-"), configmap(n["slots"], "1")),
        ("ask whether it may delete another Node", ("auth", "can-i", "delete", f"node/{n['b']}"), None),
        ("ask whether it may delete its own Node", ("auth", "can-i", "delete", f"node/{n['a']}"), None),
        ("delete another Node", ("delete", "node", n["b"]), None),
        ("delete its own Node", ("delete", "node", n["a"]), None),
    ]  # fmt: skip


def outcome(code: int, out: str, err: str, names: dict[str, str]) -> tuple[int, str, str]:
    """(exit code, the status reason or can-i's answer, the message with the world's names made generic)."""
    text = (err or out).strip()
    for generic, real in sorted(names.items(), key=lambda kv: -len(kv[1])):
        text = text.replace(real, f"<{generic}>")
    found = re.search(r"Error from server \((\w+)\)", text)
    reason = found.group(1) if found else (out.strip() if out.strip() in ("yes", "no") else "")
    message = text.splitlines()[-1] if text and (found or reason in ("yes", "no")) else ""
    return code, reason, message


def run_all(kube: Any, names: dict[str, str]) -> list[tuple[int, str, str]]:
    return [outcome(*kube.call(*args, stdin=body), names) for _, args, body in requests(names)]


def fake_world(tmp_path: Path) -> list[tuple[int, str, str]]:
    names = FAKE_NAMES
    fake = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=["gpu-a", "gpu-b"])
    fake.pods = [Pod("ml", "own", "gpu-a"), Pod("ml", "elsewhere", "gpu-b"), Pod("ml", "guarded", "gpu-a", pdb=True)]
    fake.save()
    config = tmp_path / "kubelet.conf"
    config.write_text(kubelet_conf("gpu-a"))
    return run_all(cluster.Kube("t", str(config), "k8s.example.test:6443", command=fake.command()), names)


def real_world(rc: RealCluster, tmp_path: Path) -> list[tuple[int, str, str]]:
    names = {k: rc.unique(v) for k, v in (("a", "gpu-a"), ("b", "gpu-b"), ("gone", "gpu-gone"), ("ns", "ml"),
                                          ("slots", "slots"), ("bare", "other"))}  # fmt: skip
    for node in (names["a"], names["b"]):
        rc.node(node)
    rc.node_steps_rbac(names["slots"])
    for ns in (names["ns"], names["bare"]):
        rc.namespace(ns)
    rc.pod(names["ns"], "own", names["a"])
    rc.pod(names["ns"], "elsewhere", names["b"])
    rc.pod(names["ns"], "guarded", names["a"], labels={"app": "guarded"})
    rc.pdb(names["ns"], "guarded", "guarded", allowed=0)
    config = rc.node_kubeconfig(names["a"], tmp_path / "kubelet-real.conf")
    return run_all(cluster.Kube("t", str(config), rc.server, command=rc.command()), names)


def test_the_fake_answers_as_the_real_api_server(real_cluster: RealCluster, tmp_path: Path) -> None:
    fake, real = fake_world(tmp_path), real_world(real_cluster, tmp_path)
    differ = [
        f"{what}:\n  fake {f}\n  real {r}"
        for (what, _, _), f, r in zip(requests(FAKE_NAMES), fake, real, strict=True)
        if f[:2] != r[:2] or (f[2] != r[2] and f[1] in ("Forbidden", "TooManyRequests"))
    ]
    assert not differ, "\n".join(differ)
