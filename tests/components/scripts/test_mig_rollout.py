"""A MIG geometry change on a live node (guest_mig.sh): drained through a rollout slot before the label changes,
uncordoned only once mig-manager reports success; a failure names the node, the geometry and where to look, and the
node stays cordoned keeping its slot until a later end passes. Run as machines run it: the agent bundle's step.sh,
nothing on stdin, acting as the node itself (kubelet's kubeconfig)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.render.guest_scripts import mig_args
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakekube import SLOT_NAMESPACE, FakeCluster, Pod, kubelet_conf
from tests.components.scripts.fakeroot import Result
from tests.components.scripts.test_rollout import held
from tests.support import external

SLOT0 = "proxmox-gpu-cluster-rollout-0"
KUBECONFIG = "apiVersion: v1\nkind: Config\nusers:\n- name: admin\n  user: {token: CANARY-MIG-TOKEN}\n"
NODE = "gpu-a100-a"
OLD, NEW = "all-1g.5gb", "all-3g.20gb"
B = GuestBootstrapSpec.model_validate(
    {
        "nodeName": NODE, "gpus": [{"vendorDevice": "10de:20f1", "product": "NVIDIA-A100-PCIE-40GB"}],
        "driverMode": "host", "driverBranch": "580", "kernelModules": "open", "toolkit": True,
        "apiEndpoint": "k8s.example.test:6443", "kubernetesMinor": 34, "rollout": {"drainTimeoutSeconds": 60},
    }
)  # fmt: skip


@pytest.fixture(autouse=True)
def _tools() -> None:
    external(Path("/usr/bin/python3"), "python3", "install it with: apt-get install python3")


@pytest.fixture
def cluster(tmp_path: Path) -> FakeCluster:
    c = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=[NODE], pods=[Pod("ml", "train-0", NODE)])
    c.labels = {NODE: {"nvidia.com/mig.config": OLD, "nvidia.com/mig.config.state": "success"}}
    c.save()
    return c


@pytest.fixture
def guest(tmp_path: Path, cluster: FakeCluster) -> FakeGuest:
    g = FakeGuest(tmp_path / "guest")
    cluster.install(g)
    g.write("etc/kubernetes/kubelet.conf", kubelet_conf(NODE)).chmod(0o600)  # as kubeadm join leaves it
    g.stub_script("sleep", "exec /bin/sleep 0.1")
    return g


def phase(guest: FakeGuest, name: str, wanted: str = NEW, timeout: int = 300) -> Result:
    args = mig_args(B, name, wanted, timeout, "gpu-operator")
    return guest.run_bundle("mig", *args)  # no credential on stdin: the step acts as the node


def mig_manager(cluster: FakeCluster, state: str, delay: float = 0.5) -> threading.Thread:
    """The label patch lands, mig-manager reports pending, then ``state``."""

    def act() -> None:
        cluster.set_labels(NODE, **{"nvidia.com/mig.config": NEW, "nvidia.com/mig.config.state": "pending"})
        time.sleep(delay)
        cluster.set_labels(NODE, **{"nvidia.com/mig.config.state": state})

    thread = threading.Thread(target=act)
    thread.start()
    return thread


def test_a_geometry_change_drains_first_and_uncordons_after_success(guest: FakeGuest, cluster: FakeCluster) -> None:
    begin = phase(guest, "begin")
    assert begin.returncode == 0, begin.stderr
    assert f"rollout: {NODE} took slot proxmox-gpu-cluster-rollout-0 (MIG {OLD} -> {NEW})" in begin.stdout
    state = cluster.state()
    assert (
        state["cordoned"] == [NODE]
        and state["pods"] == []
        and list(state["configmaps"]) == [f"{SLOT_NAMESPACE}/{SLOT0}"]
    )
    manager = mig_manager(cluster, "success")
    end = phase(guest, "end")
    manager.join()
    assert end.returncode == 0, end.stderr
    assert f"mig: {NODE} runs {NEW} (mig-manager: success)" in end.stdout
    assert f"rollout: uncordoned {NODE}" in end.stdout
    state = cluster.state()
    assert state["cordoned"] == [] and held(cluster) == {}
    assert [e[1] for e in state["events"]] == ["lease", "cordon", "evict", "lease", "lease", "uncordon", "release"]
    calls = [c for c in begin.calls + end.calls if c.startswith("kubectl ")]
    assert calls and all(f"--kubeconfig {guest.root}/etc/kubernetes/kubelet.conf " in c for c in calls)
    assert set(cluster.modes()) == {"0o600"}
    assert {str(p.relative_to(guest.root)) for p in (guest.root / "run").rglob("*") if p.is_file()} <= {
        "run/lock/proxmox-gpu-cluster.lock"
    }  # nothing but the per-machine lock under /run


@pytest.mark.parametrize("current", [None, NEW])
def test_a_first_geometry_or_the_same_one_drains_nothing(guest: FakeGuest, cluster: FakeCluster, current: str) -> None:
    cluster.labels = {NODE: {"nvidia.com/mig.config": current}} if current else {}
    cluster.save()
    begin, end = phase(guest, "begin"), phase(guest, "end")
    assert begin.returncode == end.returncode == 0, begin.stderr + end.stderr
    assert "nothing to drain" in begin.stdout and "nothing to wait for" in end.stdout
    assert cluster.state()["events"] == []


def test_a_failed_repartition_fails_and_leaves_the_node_cordoned(guest: FakeGuest, cluster: FakeCluster) -> None:
    assert phase(guest, "begin").returncode == 0
    manager = mig_manager(cluster, "failed")
    end = phase(guest, "end")
    manager.join()
    assert end.returncode == 1
    assert (
        f"mig: nvidia.com/mig.config.state: expected success for {NEW} on {NODE}, saw failed: see "
        "kubectl logs -n gpu-operator -l app=nvidia-mig-manager"
    ) in end.stderr.splitlines()[0]
    assert f"rollout: {NODE} stays cordoned and keeps its slot {SLOT0} until a later run passes; free it with: " in (
        end.stderr
    )
    assert len(end.stderr.splitlines()) == 2  # the failure line, then what is left as it is
    assert cluster.state()["cordoned"] == [NODE] and held(cluster) == {SLOT0: NODE}
    # Fixed (mig-manager retried and succeeded): the end step run again uncordons and gives the slot back.
    cluster.set_labels(NODE, **{"nvidia.com/mig.config.state": "success"})
    again = phase(guest, "end")
    assert again.returncode == 0, again.stderr
    assert cluster.state()["cordoned"] == [] and held(cluster) == {}


def test_a_repartition_that_never_settles_fails_in_bounded_time(guest: FakeGuest, cluster: FakeCluster) -> None:
    assert phase(guest, "begin").returncode == 0
    cluster.set_labels(NODE, **{"nvidia.com/mig.config": NEW, "nvidia.com/mig.config.state": "pending"})
    end = phase(guest, "end", timeout=1)
    assert end.returncode == 1
    assert f"expected success for {NEW} on {NODE} within 1s, saw label {NEW}, state pending" in end.stderr


@pytest.mark.parametrize("down", [True, False])
def test_an_api_server_that_does_not_answer_or_refuses_fails_in_one_line(
    guest: FakeGuest, cluster: FakeCluster, down: bool
) -> None:
    cluster.save(api_down=down)
    if not down:  # a credential this API server does not know (another cluster's, or a revoked certificate)
        guest.write("etc/kubernetes/kubelet.conf", "apiVersion: v1\nkind: Config\nusers: []\n")
    begin = phase(guest, "begin")
    assert begin.returncode == 1
    saw = "no answer (The connection to the server" if down else "Unauthorized (the API server refused the credentials)"
    assert begin.stderr.startswith(
        f"rollout: kubectl get node {NODE}: expected an answer from the API server at https://k8s.example.test:6443, "
        f"saw {saw}"
    )
    assert len(begin.stderr.splitlines()) == 2  # one failure line, kubectl's own below it, nothing more
    assert cluster.state()["cordoned"] == []
