"""The node agent's Kubernetes work (cluster.py, kubeapi.py, capacity.py) against a real kube-apiserver with etcd
(tests/kubeapi_real.py): the Node authorizer, NodeRestriction and the node-steps RBAC (render/node_rbac.py) decide,
and the agent authenticates as each node (client certificate CN=system:node:<name>, O=system:nodes) through the real
kubectl: rollout slots under real optimistic concurrency, cordon, drain by Eviction with PodDisruptionBudgets (429),
MIG begin and end, the capacity gate, and the retirement's delete."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from tests.agent.agent import capacity, cluster, concurrent_takes, kubeapi, mig_manager
from tests.kubeapi_real import RealCluster, real_cluster

__all__ = ["real_cluster"]  # the fixture, imported for pytest

pytestmark = pytest.mark.slow  # one real API server per process: about 10 s to start

SLOT0, SLOT1 = "proxmox-gpu-cluster-rollout-0", "proxmox-gpu-cluster-rollout-1"
ANNOTATION = "proxmox-gpu-cluster.io/rollout"


class World:
    """One test's part of the shared API server: its own nodes and slot namespace (with the node-steps RBAC)."""

    def __init__(self, rc: RealCluster, tmp_path: Path, *nodes: str, rbac: bool = True) -> None:
        self.rc, self.tmp = rc, tmp_path
        self.ns = rc.unique("slots")
        self.nodes = {n: rc.unique(n) for n in nodes}
        if rbac:
            rc.node_steps_rbac(self.ns)
        else:
            rc.namespace(self.ns)
        for name in self.nodes.values():
            rc.node(name)

    def kube(self, node: str, step: str = "rollout") -> Any:
        """cluster.Kube as ``node`` (its kubelet credential), through the real kubectl."""
        config = self.rc.node_kubeconfig(self.nodes[node], self.tmp / f"kubelet-{node}.conf")
        return cluster.Kube(step, str(config), self.rc.server, command=self.rc.command())

    def rollout(self, node: str, **settings: Any) -> Any:
        settings.setdefault("sleep", lambda seconds: None)
        return cluster.Rollout(self.kube(node), self.nodes[node], namespace=self.ns, **settings)

    def held(self) -> dict[str, str]:
        items = self.rc.get("configmaps", "-n", self.ns)["items"]
        return {i["metadata"]["name"]: h for i in items if (h := (i.get("data") or {}).get("holder"))}

    def node(self, node: str) -> dict[str, Any]:
        result: dict[str, Any] = self.rc.get("node", self.nodes[node])
        return result

    def cordoned(self, node: str) -> bool:
        return bool(self.node(node).get("spec", {}).get("unschedulable"))

    def annotations(self, node: str) -> dict[str, str]:
        return dict(self.node(node)["metadata"].get("annotations") or {})


def stamp(age: int) -> str:
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=age)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def failed_node(w: World, node: str, slot: str) -> None:
    """``node`` as a failed change leaves it: cordoned, marked, holding ``slot`` renewed two hours ago."""
    name = w.nodes[node]
    w.rc.run("cordon", name)
    w.rc.run("annotate", "node", name, f"{ANNOTATION}={slot}")
    w.rc.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": slot, "namespace": w.ns},
                "data": {"holder": name, "leaseDurationSeconds": "3600", "renewTime": stamp(7200)}})  # fmt: skip


def test_only_the_holder_releases_and_a_released_slot_is_taken(real_cluster: RealCluster, tmp_path: Path) -> None:
    w = World(real_cluster, tmp_path, "gpu-a", "gpu-b")
    a, b = w.rollout("gpu-a"), w.rollout("gpu-b")
    assert a.take() == SLOT0 and b.take() is None
    assert w.held() == {SLOT0: w.nodes["gpu-a"]} and w.annotations("gpu-a") == {ANNOTATION: SLOT0}
    assert b.release(SLOT0) is False
    assert a.release(SLOT0) is True and a.release(SLOT0) is False
    assert w.held() == {} and b.take() == SLOT0


def test_concurrent_takers_for_one_node_settle_on_one_slot(real_cluster: RealCluster, tmp_path: Path) -> None:
    # The real server's optimistic concurrency (a PUT at a stale resourceVersion: 409 Conflict; a create of an
    # existing name: 409 AlreadyExists) decides which of four runs for one node wins.
    w = World(real_cluster, tmp_path, "gpu-a")
    takers = [w.rollout("gpu-a", max_unavailable=2) for _ in range(4)]
    taken = concurrent_takes(takers)
    assert len(taken) == 1, taken
    assert w.held() == {taken.pop(): w.nodes["gpu-a"]}


def test_an_expired_slot_is_kept_for_a_cordoned_holder_and_taken_from_one_in_service(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    w = World(real_cluster, tmp_path, "gpu-a", "gpu-b")
    failed_node(w, "gpu-b", SLOT0)
    a = w.rollout("gpu-a", wait_seconds=0)
    with pytest.raises(cluster.Failure) as failure:
        a.begin("driver")
    assert f"saw held by {w.nodes['gpu-b']} (cordoned by a rollout;" in str(failure.value)
    real_cluster.run("uncordon", w.nodes["gpu-b"])  # an admin put it back in service: expiry frees the slot
    assert a.take() == SLOT0 and w.held() == {SLOT0: w.nodes["gpu-a"]}


def test_begin_and_end_cordon_drain_by_eviction_and_give_back(
    real_cluster: RealCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w = World(real_cluster, tmp_path, "gpu-a")
    node, ns = w.nodes["gpu-a"], real_cluster.unique("ml")
    real_cluster.namespace(ns)
    real_cluster.pod(ns, "train-0", node)
    real_cluster.pod(ns, "dp", node, owner="DaemonSet")
    real_cluster.pod(ns, "done", node, owner=None, phase="Succeeded")  # finished: needs no force
    a = w.rollout("gpu-a")
    a.begin("driver 1 -> 2")
    assert capsys.readouterr().out.splitlines() == [
        f"rollout: {node} took slot {SLOT0} (driver 1 -> 2)", f"rollout: cordoned {node}", f"rollout: drained {node}"
    ]  # fmt: skip
    assert w.cordoned("gpu-a") and real_cluster.pods(ns) == ["dp"]
    a.end()
    assert not w.cordoned("gpu-a") and ANNOTATION not in w.annotations("gpu-a") and w.held() == {}


def test_a_disruption_budget_refuses_with_429_and_the_drain_names_the_pod(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    w = World(real_cluster, tmp_path, "gpu-a")
    node, ns = w.nodes["gpu-a"], real_cluster.unique("ml")
    real_cluster.namespace(ns)
    real_cluster.pod(ns, "train-0", node, labels={"app": "train"})
    real_cluster.pod(ns, "train-1", node, labels={"app": "train"})
    real_cluster.pod(ns, "serve-0", node)
    real_cluster.pdb(ns, "train", "train", allowed=1)  # one of the two may go, then the budget is spent
    waits: list[int] = []
    with pytest.raises(cluster.Failure) as failure:
        cluster.drain(w.kube("gpu-a", "drain"), node, 15, emptydir=True, force=False, advice="then retry",
                      sleep=waits.append)  # fmt: skip
    left = real_cluster.pods(ns)
    assert len(left) == 1 and left[0].startswith("train-"), left
    assert str(failure.value) == (
        f"drain: pods on {node}: expected none left within 15s, saw {ns}/{left[0]} (a PodDisruptionBudget refuses "
        "its eviction); then retry"
    )
    assert "(TooManyRequests)" in failure.value.output
    assert "Cannot evict pod as it would violate the pod's disruption budget" in failure.value.output
    assert sum(waits) == 15


def test_a_drain_refuses_bare_and_emptydir_pods_before_evicting_anything(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    w = World(real_cluster, tmp_path, "gpu-a")
    node, ns = w.nodes["gpu-a"], real_cluster.unique("ml")
    real_cluster.namespace(ns)
    real_cluster.pod(ns, "bare", node, owner=None)
    real_cluster.pod(ns, "cache", node, emptydir=True)
    with pytest.raises(cluster.Failure) as failure:
        cluster.drain(w.kube("gpu-a", "drain"), node, 30, emptydir=False, force=False, advice="x",
                      sleep=lambda s: None)  # fmt: skip
    assert f"{ns}/bare (no controller" in str(failure.value) and f"{ns}/cache (emptyDir data" in str(failure.value)
    assert real_cluster.pods(ns) == ["bare", "cache"]


def test_without_the_node_steps_rbac_the_failure_says_so(real_cluster: RealCluster, tmp_path: Path) -> None:
    w = World(real_cluster, tmp_path, "gpu-a", rbac=False)
    with pytest.raises(cluster.Failure) as failure:
        w.rollout("gpu-a").take()
    assert str(failure.value) == (
        f"rollout: kubectl get configmaps: expected an answer from the API server at https://{real_cluster.server}, "
        f'saw Forbidden (User "system:node:{w.nodes["gpu-a"]}" cannot list resource "configmaps" in API group "" in '
        f'the namespace "{w.ns}": No Object name found; is the cluster\'s node-steps RBAC applied?)'
    )


def test_a_node_acts_on_itself_only(real_cluster: RealCluster, tmp_path: Path) -> None:
    w = World(real_cluster, tmp_path, "gpu-a", "gpu-b")
    a, b, ns = w.nodes["gpu-a"], w.nodes["gpu-b"], real_cluster.unique("ml")
    real_cluster.namespace(ns)
    real_cluster.pod(ns, "t", b)
    as_a = w.kube("gpu-a", "drain")
    with pytest.raises(cluster.Failure) as failure:  # kubectl exits 0 here, saying "error: unable to cordon"
        kubeapi.cordon(as_a, b)
    assert str(failure.value) == (
        f"drain: kubectl cordon {b}: expected an answer from the API server at https://{real_cluster.server}, saw "
        f'Forbidden (node "{a}" is not allowed to modify node "{b}"; is the cluster\'s node-steps RBAC applied?)'
    )
    with pytest.raises(cluster.Failure) as failure:
        as_a("delete", "node", b)
    assert f'node "{a}" is not allowed to modify node "{b}"' in str(failure.value)
    with pytest.raises(cluster.Failure) as failure:
        cluster.drain(as_a, b, 30, emptydir=True, force=False, advice="", sleep=lambda s: None)
    assert "can only list/watch pods with spec.nodeName field selector" in failure.value.output
    with pytest.raises(cluster.Failure) as failure:
        kubeapi.evict(as_a, f"{ns}/t")
    assert f"node {a} can only evict pods with spec.nodeName set to itself" in str(failure.value)
    assert real_cluster.pods(ns) == ["t"] and not w.cordoned("gpu-b")


def test_retirement_cordons_drains_and_deletes_its_own_node(real_cluster: RealCluster, tmp_path: Path) -> None:
    w = World(real_cluster, tmp_path, "gpu-a", "gpu-b")
    a, ns = w.nodes["gpu-a"], real_cluster.unique("ml")
    real_cluster.namespace(ns)
    real_cluster.pod(ns, "infer", a)
    as_a = w.kube("gpu-a", "drain")
    assert as_a.call("auth", "can-i", "delete", f"node/{a}")[1].strip() == "yes"
    kubeapi.retire(as_a, a, 30, emptydir=True, force=False, reset=False)
    assert real_cluster.run("get", "node", a, "--ignore-not-found").stdout == ""
    assert real_cluster.pods(ns) == [] and real_cluster.get("node", w.nodes["gpu-b"])
    kubeapi.retire(as_a, a, 30, emptydir=True, force=False, reset=False)  # a second run: nothing left to do


def test_mig_begin_drains_and_end_waits_for_mig_manager(real_cluster: RealCluster, tmp_path: Path) -> None:
    w = World(real_cluster, tmp_path, "gpu-a")
    node, ns = w.nodes["gpu-a"], real_cluster.unique("ml")
    real_cluster.run("label", "node", node, "nvidia.com/mig.config=all-1g.10gb", "nvidia.com/mig.config.state=success")
    real_cluster.namespace(ns)
    real_cluster.pod(ns, "train-0", node)
    r = w.rollout("gpu-a")
    mig_manager.mig(r, "begin", "all-2g.20gb", 30, "gpu-operator")
    assert w.cordoned("gpu-a") and real_cluster.pods(ns) == [] and w.held() == {SLOT0: node}
    # mig-manager applies the new geometry (the label patch wrote it; mig-manager reports success)
    polls: list[int] = []

    def reports(seconds: int) -> None:
        polls.append(seconds)
        real_cluster.run("label", "node", node, "--overwrite", "nvidia.com/mig.config=all-2g.20gb",
                         "nvidia.com/mig.config.state=success")  # fmt: skip

    r.sleep = reports
    mig_manager.mig(r, "end", "all-2g.20gb", 30, "gpu-operator")
    assert polls and not w.cordoned("gpu-a") and w.held() == {} and ANNOTATION not in w.annotations("gpu-a")


def test_the_capacity_gate_reads_its_own_node_as_the_node(
    real_cluster: RealCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = World(real_cluster, tmp_path, "gpu-a")
    node = w.nodes["gpu-a"]
    real_cluster.status("node", node, {"allocatable": {"nvidia.com/gpu": "2"}, "capacity": {"nvidia.com/gpu": "2"}})
    config = real_cluster.node_kubeconfig(node, tmp_path / "kubelet.conf")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").symlink_to(real_cluster.kubectl)  # capacity.py runs `kubectl` from PATH, as on the node
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("KUBECACHEDIR", str(tmp_path / "kubectl-cache"))
    line = capacity.gate(str(config), node, ["nvidia.com/gpu=2"], timeout=0, interval=1)
    assert line == f"capacity: ok: {node} advertises nvidia.com/gpu=2"
    with pytest.raises(capacity.Failure) as failure:
        capacity.gate(str(config), node, ["nvidia.com/gpu=4"], timeout=0, interval=1)
    assert "saw nvidia.com/gpu=2 after 0s" in str(failure.value)


def test_the_slot_written_is_what_the_server_stores(real_cluster: RealCluster, tmp_path: Path) -> None:
    w = World(real_cluster, tmp_path, "gpu-a")
    w.rollout("gpu-a", lease_seconds=900).take()
    stored = real_cluster.get("configmap", SLOT0, "-n", w.ns)
    assert stored["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "proxmox-gpu-cluster"}
    assert stored["data"]["leaseDurationSeconds"] == "900" and stored["data"]["holder"] == w.nodes["gpu-a"]
    assert json.loads(json.dumps(stored["data"])).keys() == {"holder", "acquireTime", "renewTime",
                                                              "leaseDurationSeconds"}  # fmt: skip
