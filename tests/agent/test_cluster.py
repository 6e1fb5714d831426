"""The node agent's rollout slots (cluster.py), called directly against the fake API server's kubectl: ownership,
concurrency, expiry, recovery after a killed run, what a failure says, and API server errors."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.agent.agent import (
    ENDPOINT,
    KUBECONFIG,
    cluster,
    concurrent_takes,
    held,
    kube,
    kubeapi,
    make_cluster,
    rollout,
)
from tests.components.scripts.fakekube import SLOT_NAMESPACE, FakeCluster, Pod

SLOT0, SLOT1 = "proxmox-gpu-cluster-rollout-0", "proxmox-gpu-cluster-rollout-1"
ANNOTATION = "proxmox-gpu-cluster.io/rollout"


def slot(name: str, holder: str, age: int) -> dict[str, Any]:
    stamp = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": SLOT_NAMESPACE, "resourceVersion": "7"},
        "data": {"holder": holder, "leaseDurationSeconds": "3600", "renewTime": stamp},
    }  # fmt: skip


def key(name: str) -> str:
    return f"{SLOT_NAMESPACE}/{name}"


def failed_node(fake: FakeCluster, node: str, slot_name: str) -> None:
    """``node`` as a failed change leaves it: cordoned, marked for ``slot_name``, which it holds (renewed long ago)."""

    def edit(state: dict[str, Any]) -> None:
        state["cordoned"] = sorted({*state["cordoned"], node})
        state["annotations"].setdefault(node, {})[ANNOTATION] = slot_name
        state["configmaps"][key(slot_name)] = slot(slot_name, node, age=7200)

    fake.change(edit, node)


def test_only_the_holder_releases_and_release_is_idempotent(tmp_path: Path) -> None:
    fake = make_cluster(tmp_path, ["gpu-a", "gpu-b"])
    a, b = rollout(fake, tmp_path, "gpu-a"), rollout(fake, tmp_path, "gpu-b")
    assert a.take() == SLOT0 and b.take() is None
    assert held(fake) == {SLOT0: "gpu-a"} and fake.state()["annotations"]["gpu-a"] == {ANNOTATION: SLOT0}
    events = len(fake.state()["events"])
    assert b.release(SLOT0) is False  # a run that does not hold it changes nothing
    assert held(fake) == {SLOT0: "gpu-a"} and len(fake.state()["events"]) == events
    assert a.release(SLOT0) is True and a.release(SLOT0) is False
    assert held(fake) == {} and b.take() == SLOT0


@pytest.mark.parametrize("slots", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_concurrent_takers_for_one_node_settle_on_one_slot(tmp_path: Path, slots: int) -> None:
    # Two runs of one node's step at once (no machine lock): each may claim a different free slot, but the node's
    # annotation, written at the Node's resourceVersion, admits one; the others give their claim back and adopt it.
    for round_ in range(2):
        (tmp_path / str(round_)).mkdir()
        fake = make_cluster(tmp_path / str(round_), ["gpu-a"])
        takers = [rollout(fake, tmp_path / str(round_), "gpu-a", max_unavailable=slots) for _ in range(4)]
        taken = concurrent_takes(takers)
        assert len(taken) == 1, taken
        assert held(fake) == {taken.pop(): "gpu-a"}


def test_an_expired_slot_is_not_taken_from_a_node_still_cordoned_for_it(tmp_path: Path) -> None:
    fake = make_cluster(tmp_path, ["gpu-a", "gpu-b"])
    failed_node(fake, "gpu-b", SLOT0)
    a = rollout(fake, tmp_path, "gpu-a", wait_seconds=0)
    with pytest.raises(cluster.Failure) as failure:
        a.begin("driver")
    assert str(failure.value) == (
        "rollout: slot for gpu-a: expected one of 1 free within 0s, saw held by gpu-b (cordoned by a rollout; if its "
        f"change failed: kubectl annotate node gpu-b {ANNOTATION}- && kubectl -n {SLOT_NAMESPACE} delete configmap {SLOT0}) (pulumi "
        "up --parallel must exceed kubernetes.drain.maxUnavailable)"
    )
    assert fake.state()["cordoned"] == ["gpu-b"]
    # The operator's command from that message frees it (the node stays cordoned until they uncordon it).
    operator = kube(fake, tmp_path, config=KUBECONFIG)  # the admin's
    operator("annotate", "node", "gpu-b", f"{ANNOTATION}-")
    operator("-n", SLOT_NAMESPACE, "delete", "configmap", SLOT0)
    assert a.take() == SLOT0 and fake.state()["cordoned"] == ["gpu-b"]


def test_an_expired_slot_whose_holder_is_in_service_is_taken_over(tmp_path: Path) -> None:
    fake = make_cluster(tmp_path, ["gpu-a", "gpu-b"])
    failed_node(fake, "gpu-b", SLOT0)
    fake.change(lambda state: state.update(cordoned=[]), "gpu-b")  # an admin uncordoned it
    assert rollout(fake, tmp_path, "gpu-a").take() == SLOT0
    assert held(fake) == {SLOT0: "gpu-a"}


def test_a_killed_run_takes_its_own_slot_again_and_finishes(tmp_path: Path) -> None:
    fake = make_cluster(tmp_path, ["gpu-a", "gpu-b"])
    failed_node(fake, "gpu-a", SLOT0)  # killed after the cordon, an hour and more ago: its lease expired
    assert rollout(fake, tmp_path, "gpu-b").take() is None
    a = rollout(fake, tmp_path, "gpu-a")
    a.resume()  # the re-run renews it
    renewed = fake.state()["configmaps"][key(SLOT0)]["data"]["renewTime"]
    assert renewed > slot(SLOT0, "gpu-a", age=60)["data"]["renewTime"]
    fake.change(lambda state: state["configmaps"].pop(key(SLOT0)))  # an operator deleted only the slot
    a.resume()
    assert held(fake) == {SLOT0: "gpu-a"}  # taken again, as the annotation says
    a.end()
    assert held(fake) == {} and fake.state()["cordoned"] == [] and fake.state()["annotations"]["gpu-a"] == {}


def test_begin_and_end_mark_cordon_drain_and_give_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=["gpu-a"])
    fake.pods = [Pod("ml", "train-0", "gpu-a"), Pod("gpu-operator", "dp", "gpu-a", owner="DaemonSet")]
    fake.save()
    a = rollout(fake, tmp_path, "gpu-a")
    a.begin("driver 1 -> 2")
    assert capsys.readouterr().out.splitlines() == [
        f"rollout: gpu-a took slot {SLOT0} (driver 1 -> 2)", "rollout: cordoned gpu-a", "rollout: drained gpu-a"
    ]  # fmt: skip
    state = fake.state()
    assert state["cordoned"] == ["gpu-a"] and [p["name"] for p in state["pods"]] == ["dp"]
    a.end()
    assert capsys.readouterr().out.splitlines() == ["rollout: uncordoned gpu-a", f"rollout: released slot {SLOT0}"]
    assert [e[1] for e in fake.state()["events"]] == ["lease", "cordon", "evict", "lease", "uncordon", "release"]


def test_cleanup_says_what_is_true(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = make_cluster(tmp_path, ["gpu-a"])
    a = rollout(fake, tmp_path, "gpu-a", max_unavailable=2)
    a.cleanup()  # nothing held, nothing cordoned: nothing to say
    assert capsys.readouterr().err == ""
    assert a.take() == SLOT0  # the step failed before the cordon: the slot goes back, the mark too
    a.cleanup()
    assert capsys.readouterr().err == f"rollout: released slot {SLOT0}\n"
    assert held(fake) == {} and fake.state()["annotations"]["gpu-a"] == {}
    a.begin("x")  # cordoned, then the step failed: it stays cordoned and keeps its slot
    capsys.readouterr()
    a.cleanup()
    assert capsys.readouterr().err == (
        f"rollout: gpu-a stays cordoned and keeps its slot {SLOT0} until a later run passes; free it with: kubectl "
        f"annotate node gpu-a {ANNOTATION}- && kubectl -n {SLOT_NAMESPACE} delete configmap {SLOT0} (and uncordon it once "
        "healthy)\n"
    )
    assert held(fake) == {SLOT0: "gpu-a"} and fake.state()["cordoned"] == ["gpu-a"]


@pytest.mark.parametrize(
    ("state", "config", "saw"),
    [
        ({"api_down": True}, None, "no answer (The connection to the server 10.0.0.1:6443 was refused"),
        ({}, "a stale kubeconfig", "Unauthorized (the API server refused the credentials)"),
    ],
)
def test_api_server_errors_are_one_line_with_kubectls_output_below(
    tmp_path: Path, state: dict[str, Any], config: str | None, saw: str
) -> None:
    fake = make_cluster(tmp_path, ["gpu-a"], **state)
    client = kube(fake, tmp_path, config=config) if config else kube(fake, tmp_path)
    with pytest.raises(cluster.Failure) as failure:
        cluster.Rollout(client, "gpu-a").take()
    assert str(failure.value).startswith(
        f"rollout: kubectl get node gpu-a: expected an answer from the API server at https://{ENDPOINT}, saw {saw}"
    )
    assert failure.value.output.startswith(("The connection to the server", "error: You must be logged in"))


def test_a_failed_drain_names_each_pod_and_why(tmp_path: Path) -> None:
    waits: list[int] = []
    fake = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=["gpu-a"])
    fake.pods = [Pod("ml", "train-0", "gpu-a", pdb=True), Pod("ml", "serve-0", "gpu-a")]
    fake.save()
    with pytest.raises(cluster.Failure) as failure:
        cluster.drain(
            kube(fake, tmp_path, "drain"),
            "gpu-a",
            60,
            emptydir=True,
            force=False,
            advice="then retry",
            sleep=waits.append,
        )
    assert str(failure.value) == (
        "drain: pods on gpu-a: expected none left within 60s, saw ml/train-0 (a PodDisruptionBudget refuses its "
        "eviction); then retry"
    )
    assert "Cannot evict pod as it would violate the pod's disruption budget" in failure.value.output
    assert [p["name"] for p in fake.state()["pods"]] == ["train-0"]  # the other one was evicted
    assert sum(waits) == 60  # retried every 5 s until the timeout


def test_the_slot_written_is_a_valid_configmap(tmp_path: Path) -> None:
    fake = make_cluster(tmp_path, ["gpu-a"])
    rollout(fake, tmp_path, "gpu-a", lease_seconds=900).take()
    written = fake.state()["configmaps"][key(SLOT0)]
    kubernetes_validate.validate(written, "1.34", strict=True)
    assert written["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "proxmox-gpu-cluster"}
    assert written["data"]["leaseDurationSeconds"] == "900" and written["data"]["holder"] == "gpu-a"
    for field in ("acquireTime", "renewTime"):  # MicroTime, RFC 3339 with microseconds
        datetime.datetime.strptime(written["data"][field], "%Y-%m-%dT%H:%M:%S.%fZ")


def test_without_the_node_steps_rbac_the_failure_says_so(tmp_path: Path) -> None:
    # The node's own credential may write no ConfigMap until the cluster's NodeStepAccess is applied.
    fake = make_cluster(tmp_path, ["gpu-a"], rbac=False)
    with pytest.raises(cluster.Failure) as failure:
        rollout(fake, tmp_path, "gpu-a").take()
    assert str(failure.value).startswith(
        f"rollout: kubectl get configmaps: expected an answer from the API server at https://{ENDPOINT}, saw "
        'Forbidden (User "system:node:gpu-a" cannot list resource "configmaps" in API group "" in the namespace '
        f'"{SLOT_NAMESPACE}": No Object name found; is the cluster\'s node-steps RBAC applied?)'
    )


def test_a_node_acts_on_itself_only(tmp_path: Path) -> None:
    fake = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=["gpu-a", "gpu-b"], pods=[Pod("ml", "t", "gpu-b")])
    fake.save()
    as_a = kube(fake, tmp_path, "drain", node="gpu-a")
    with pytest.raises(cluster.Failure) as failure:  # kubectl cordon exits 0 on a refused patch; cordon() fails
        kubeapi.cordon(as_a, "gpu-b")
    assert 'Forbidden (node "gpu-a" is not allowed to modify node "gpu-b"; is' in str(failure.value)
    with pytest.raises(cluster.Failure) as failure:
        as_a("delete", "node", "gpu-b")
    assert 'node "gpu-a" is not allowed to modify node "gpu-b"' in str(failure.value)
    with pytest.raises(cluster.Failure) as failure:
        cluster.drain(as_a, "gpu-b", 30, emptydir=True, force=False, advice="", sleep=lambda s: None)
    assert "can only list/watch pods with spec.nodeName field selector" in str(failure.value)
    with pytest.raises(cluster.Failure) as failure:
        kubeapi.evict(as_a, "ml/t")
    assert "node gpu-a can only evict pods with spec.nodeName set to itself" in str(failure.value)
    assert fake.state()["pods"] and fake.state()["cordoned"] == [] and fake.state()["nodes"] == ["gpu-a", "gpu-b"]
