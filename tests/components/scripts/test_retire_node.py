"""The retirement drain as the node itself (guest_drain.sh and the agent's kubeapi.retire, with kubelet's kubeconfig):
the Node is deleted before kubeadm reset (which removes the credential that deletes it) and after the kubelet
stopped (so it is not registered again), and a run killed after the delete converges on the next; pods with
emptyDir data need kubernetes.drain.deleteEmptydirData; a node's credential cannot cordon, list or evict another
node's pods; a cluster without the node-steps RBAC refuses the delete in one line that says so."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.agent.agent import ENDPOINT, cluster, kube
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakekube import FakeCluster, Pod, grants
from tests.components.scripts.test_retire import KUBECONFIG, NODE, drain, make_guest
from tests.support import external

OTHER = "gpu-a10-b"


@pytest.fixture(autouse=True)
def _tools() -> None:
    # The fake kubectl and the agent run on the system interpreter, as python3 on an Ubuntu guest.
    external(Path("/usr/bin/python3"), "python3", "install it with: apt-get install python3")


def setup(root: Path) -> tuple[FakeGuest, FakeCluster]:
    root.mkdir(parents=True, exist_ok=True)
    cluster = FakeCluster(root / "api.json", KUBECONFIG, nodes=[NODE, OTHER])
    cluster.pods = [Pod("ml", "infer-7d9f", NODE), Pod("ml", "other-node-pod", OTHER)]
    cluster.save()
    return make_guest(root / "guest", cluster), cluster


def order(calls: list[str]) -> list[str]:
    """The retirement's last three actions, in the order the machine ran them."""
    wanted = {"systemctl stop kubelet ": "stop", f" delete node {NODE} ": "delete", "kubeadm reset --force ": "reset"}
    return [name for c in calls for key, name in wanted.items() if key in f"{c} "]


def test_the_node_is_deleted_after_the_kubelet_stops_and_before_kubeadm_reset(tmp_path: Path) -> None:
    guest, cluster = setup(tmp_path)
    r = drain(guest)
    assert r.returncode == 0, r.stderr
    assert order(r.calls) == ["stop", "delete", "reset"]
    assert NODE not in cluster.state()["nodes"] and not (guest.root / "etc/kubernetes/kubelet.conf").exists()


@pytest.mark.parametrize("mode", ["kill-after", "fail"])
def test_a_run_stopped_right_after_the_delete_converges_on_the_next(tmp_path: Path, mode: str) -> None:
    probe, _ = setup(tmp_path / "probe")
    at = next(i for i, c in enumerate(drain(probe).calls, 1) if f" delete node {NODE} " in c)
    guest, cluster = setup(tmp_path / "run")
    guest.fault(at + 1 if mode == "fail" else at, mode)  # fail: the kubeadm reset after the delete
    first = drain(guest)
    hit = guest.fault_hit() or ""
    assert first.returncode != 0 and (
        f" delete node {NODE} " in hit if mode == "kill-after" else hit == "kubeadm reset --force"
    ), hit
    assert NODE not in cluster.state()["nodes"]  # the delete happened
    assert (guest.root / "etc/kubernetes/kubelet.conf").exists()  # the reset did not
    guest.fault(None)
    again = drain(guest)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        f"retire: {NODE} is not in the cluster; nothing to drain",
        "retire: kubeadm reset",
    ]
    assert not (guest.root / "etc/kubernetes/kubelet.conf").exists()
    third = drain(guest)  # nothing left to do: no credential any more, and no call to the API server
    assert third.returncode == 0 and not any(c.startswith("kubectl") for c in third.calls), third.stdout
    assert cluster.state()["nodes"] == [OTHER] and [p["name"] for p in cluster.state()["pods"]] == ["other-node-pod"]


def test_pods_with_emptydir_data_need_delete_emptydir_data(tmp_path: Path) -> None:
    guest, cluster = setup(tmp_path)
    cluster.pods.append(Pod("ml", "cache-0", NODE, emptydir=True))
    cluster.save()
    refused = drain(guest, deleteEmptydirData=False)
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[0].startswith(
        f"drain: pods on {NODE}: expected pods a drain may evict, saw ml/cache-0 (emptyDir data: "
        f"kubernetes.drain.deleteEmptydirData evicts it); {NODE} stays cordoned"
    )
    assert not any("/eviction" in c for c in refused.calls)  # checked before anything is evicted
    assert [p["name"] for p in cluster.state()["pods"]] == ["infer-7d9f", "other-node-pod", "cache-0"]
    assert NODE in cluster.state()["nodes"] and not any(c.startswith("kubeadm") for c in refused.calls)
    r = drain(guest, deleteEmptydirData=True)
    assert r.returncode == 0, r.stderr
    assert any(c.endswith("/pods/cache-0/eviction -f -") for c in r.calls)
    assert [p["name"] for p in cluster.state()["pods"]] == ["other-node-pod"]


def test_a_nodes_credential_cannot_drain_another_node(tmp_path: Path) -> None:
    # The guest holds NODE's kubelet credential but is told to retire OTHER: the cordon is refused by NodeRestriction
    # before anything happens to OTHER, and nothing is stopped, deleted or reset on this machine.
    guest, cluster = setup(tmp_path)
    r = drain(guest, node=OTHER)
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == (
        f"drain: kubectl cordon {OTHER}: expected an answer from the API server at https://{ENDPOINT}, saw Forbidden "
        f'(node "{NODE}" is not allowed to modify node "{OTHER}"; is the cluster\'s node-steps RBAC applied?)'
    )
    state = cluster.state()
    assert state["cordoned"] == [] and state["nodes"] == [NODE, OTHER] and len(state["pods"]) == 2
    assert not any(c.startswith(("kubeadm", "systemctl stop")) for c in r.calls)


def test_a_nodes_credential_cannot_list_or_evict_another_nodes_pods(tmp_path: Path) -> None:
    # The agent driven directly as NODE against OTHER (past any check of the shell steps): the Node authorizer lets a
    # node list only its own pods, and NodeRestriction lets it evict only its own.
    kubeapi = sys.modules[cluster.Kube.__module__]  # the kubeapi.py cluster.py imported, as on the machine
    api = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=[NODE, OTHER])
    api.pods = [Pod("ml", "other-node-pod", OTHER)]
    api.save()
    as_node = kube(api, tmp_path, "drain", node=NODE)
    with pytest.raises(kubeapi.Failure) as listing:
        kubeapi.drain(as_node, OTHER, 10, emptydir=True, force=False, advice="-", sleep=lambda _: None)
    assert "at the cluster scope: can only list/watch pods with spec.nodeName field selector; is" in str(listing.value)
    with pytest.raises(kubeapi.Failure) as eviction:
        kubeapi.evict(as_node, "ml/other-node-pod")
    assert f"Forbidden (node {NODE} can only evict pods with spec.nodeName set to itself" in str(eviction.value)
    assert [p["name"] for p in api.state()["pods"]] == ["other-node-pod"]
    # The same calls with OTHER's own credential: it may.
    as_other = kube(api, tmp_path, "drain", node=OTHER)
    kubeapi.drain(as_other, OTHER, 10, emptydir=True, force=False, advice="-", sleep=lambda _: None)
    assert api.state()["pods"] == []


def test_a_cluster_without_the_node_steps_rbac_refuses_the_delete_in_one_line(tmp_path: Path) -> None:
    # Without the grants (render/node_rbac.py) a node may cordon and drain itself but not delete its Node: the step
    # asks first and fails saying so, before it stops the kubelet (a drained node is not left NotReady for nothing)
    # and before kubeadm reset; once the RBAC is applied, the next run finishes.
    guest, cluster = setup(tmp_path)
    cluster.change(lambda state: state.update(rbac={}))
    r = drain(guest)
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == (
        f"drain: kubectl auth can-i delete node/{NODE}: expected yes (the cluster's node-steps RBAC), saw no"
    )
    assert NODE in cluster.state()["nodes"] and order(r.calls) == []  # kubelet running, nothing deleted or reset
    assert (guest.root / "etc/kubernetes/kubelet.conf").exists()
    cluster.change(lambda state: state.update(rbac=grants()))
    again = drain(guest)
    assert again.returncode == 0, again.stderr
    assert NODE not in cluster.state()["nodes"] and order(again.calls) == ["stop", "delete", "reset"]
