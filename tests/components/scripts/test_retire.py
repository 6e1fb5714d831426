"""Retiring a worker's node before its VM goes: guest_drain.sh in a fake guest against a fake API server, and
retire_vm.sh on a fake Proxmox node that reaches the guest through a fake ``qm guest exec``.

Covered: a drain that succeeds (cordon, evictions, kubelet stopped, Node deleted, kubeadm reset), a
PodDisruptionBudget that blocks (retried until the timeout, the pod named, nothing reset or deleted, the node left
cordoned), pods without a controller, a node that is not in the cluster, an API server that does not answer, a VM
that no longer answers (the destroy proceeds with a warning), two nodes retired at once against one cluster. No
credential reaches the step: it acts as the node itself (kubelet's kubeconfig in the guest); what that credential may
not do, the order against kubeadm reset and a run killed after the delete are in test_retire_node.py.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
from pathlib import Path

import pytest

from proxmox_gpu_cluster.core.spec import DrainSpec
from proxmox_gpu_cluster.render.agent_bundle import LAUNCHER, installed_step
from proxmox_gpu_cluster.render.guest_scripts import drain_args
from proxmox_gpu_cluster.render.host_scripts import retire_args
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakekube import FakeCluster, Pod, install_qm, kubelet_conf
from tests.components.scripts.fakeroot import FakeRoot, Result
from tests.support import external

KUBECONFIG = "apiVersion: v1\nkind: Config\nusers:\n- name: admin\n  user: {token: CANARY-ADMIN-TOKEN}\n"
NODE = "gpu-a10-a"
ENDPOINT = "k8s.example.test:6443"
GUEST_STEP = installed_step("ubuntu", "drain")
"""Where the guest's agent copy holds its drain step (the worker's SSH user is ubuntu)."""
"""The join endpoint: the kubeconfig's own server ("10.0.0.1:6443" in the fake) is not reachable from a guest."""


@pytest.fixture(autouse=True)
def _tools() -> None:
    # The fake kubectl and qm are Python scripts run by the system interpreter (the fake root's PATH is
    # stubs:/usr/bin:/bin), and retire_vm.sh reads qm's JSON with perl's JSON::PP, as a Proxmox node does.
    external(Path("/usr/bin/python3"), "python3", "install it with: apt-get install python3")
    perl = external(Path("/usr/bin/perl"), "perl", "install it with: apt-get install perl")
    if subprocess.run([str(perl), "-MJSON::PP", "-e", "1"], capture_output=True, check=False).returncode:
        external(Path("/nonexistent/JSON/PP.pm"), "perl's JSON::PP", "install it with: apt-get install perl")


@pytest.fixture
def cluster(tmp_path: Path) -> FakeCluster:
    c = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=[NODE, "gpu-a10-b"])
    c.pods = [
        Pod("ml", "infer-7d9f", NODE),
        Pod("gpu-operator", "nvidia-device-plugin-x", NODE, owner="DaemonSet"),
        Pod("ml", "other-node-pod", "gpu-a10-b"),
    ]
    c.save()
    return c


def make_guest(root: Path, cluster: FakeCluster, node: str = NODE) -> FakeGuest:
    """A guest joined as ``node``: kubelet's kubeconfig as kubeadm join leaves it (mode 600); the drain's poll
    (sleep) takes no time, the drain counting its timeout in polls."""
    guest = FakeGuest(root)
    cluster.install(guest)
    guest.write("etc/kubernetes/kubelet.conf", kubelet_conf(node)).chmod(0o600)
    guest.stub_script("sleep", ":")
    return guest


@pytest.fixture
def guest(tmp_path: Path, cluster: FakeCluster) -> FakeGuest:
    return make_guest(tmp_path / "guest", cluster)


def drain(guest: FakeRoot, node: str = NODE, **settings: object) -> Result:
    spec = DrainSpec.model_validate({"timeoutSeconds": 600, **settings})
    return guest.run_bundle("drain", *drain_args(node, ENDPOINT, spec, kubeadm_reset=True))  # nothing on stdin


def assert_as_the_node(result: Result, guest: FakeRoot) -> None:
    """kubectl ran with kubelet's kubeconfig only, and the step left nothing under /run but the machine's lock."""
    calls = [c for c in result.calls if c.startswith("kubectl ")]
    assert calls and all(f"--kubeconfig {guest.root}/etc/kubernetes/kubelet.conf " in c for c in calls), calls
    left = {str(p.relative_to(guest.root)) for p in (guest.root / "run").rglob("*") if p.is_file()}
    assert left <= {"run/lock/proxmox-gpu-cluster.lock"}, left


def test_drain_success_cordons_evicts_resets_and_deletes_the_node(guest: FakeGuest, cluster: FakeCluster) -> None:
    r = drain(guest)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"retire: cordoned {NODE}",
        f"retire: drained {NODE}",
        "retire: systemctl stop",
        f"retire: deleted Node {NODE}",
        "retire: kubeadm reset",
    ]
    state = cluster.state()
    assert state["cordoned"] == [NODE] and state["nodes"] == ["gpu-a10-b"]
    assert [p["name"] for p in state["pods"]] == ["nvidia-device-plugin-x", "other-node-pod"]  # DaemonSet pod stays
    assert not (guest.root / "etc/kubernetes/kubelet.conf").exists()  # kubeadm reset ran
    # The drain is its own pods listed (a field selector: all a node may list) and one Eviction each.
    kubectl = [c.split("--request-timeout=30s ", 1)[1] for c in r.calls if c.startswith("kubectl ")]
    assert f"get pods --all-namespaces --field-selector spec.nodeName={NODE} -o json" in kubectl
    assert [c for c in kubectl if "eviction" in c] == [
        "create --raw /api/v1/namespaces/ml/pods/infer-7d9f/eviction -f -"
    ]
    assert all("--server https://k8s.example.test:6443" in c for c in r.calls if c.startswith("kubectl"))
    assert set(cluster.modes()) == {"0o600"}
    assert_as_the_node(r, guest)


def test_a_disruption_budget_blocks_the_drain_and_nothing_is_removed(guest: FakeGuest, cluster: FakeCluster) -> None:
    cluster.pods.append(Pod("ml", "train-0", NODE, owner="StatefulSet", pdb=True))
    cluster.save()
    r = drain(guest, timeoutSeconds=120)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[0] == (
        f"drain: pods on {NODE}: expected none left within 120s, saw ml/train-0 (a PodDisruptionBudget refuses its "
        f"eviction); {NODE} stays cordoned: relax the budget or move the pods (or set kubernetes.drain.force for pods "
        "without a controller), then run pulumi up again"
    )
    # The refused eviction was retried at every poll (5 s) until the timeout; the other pod went at the first.
    evictions = [c for c in r.calls if c.startswith("kubectl") and "/eviction" in c]
    assert sum("/pods/train-0/eviction" in c for c in evictions) == 120 // 5
    assert sum("/pods/infer-7d9f/eviction" in c for c in evictions) == 1
    assert [c for c in r.calls if c.startswith("sleep")] == ["sleep 5"] * (120 // 5)
    state = cluster.state()
    assert NODE in state["nodes"] and state["cordoned"] == [NODE]  # not deleted, left cordoned
    assert (guest.root / "etc/kubernetes/kubelet.conf").exists()  # not reset
    assert not any(c.startswith("kubeadm") for c in r.calls)
    assert_as_the_node(r, guest)


def test_pods_without_a_controller_need_force(guest: FakeGuest, cluster: FakeCluster) -> None:
    cluster.pods.append(Pod("default", "debug-shell", NODE, owner=None))
    cluster.save()
    r = drain(guest)
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == (
        f"drain: pods on {NODE}: expected pods a drain may evict, saw default/debug-shell (no controller: "
        f"kubernetes.drain.force deletes it); {NODE} stays cordoned: relax the budget or move the pods (or set "
        "kubernetes.drain.force for pods without a controller), then run pulumi up again"
    )
    assert cluster.state()["pods"][0]["name"] == "infer-7d9f"  # checked before anything was evicted
    r = drain(guest, force=True)
    assert r.returncode == 0, r.stderr
    assert any("/pods/debug-shell/eviction" in c for c in r.calls)


def test_a_node_that_is_not_in_the_cluster_is_only_reset(guest: FakeGuest, cluster: FakeCluster) -> None:
    r = drain(guest, node="gpu-gone")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "retire: gpu-gone is not in the cluster; nothing to drain",
        "retire: kubeadm reset",
    ]
    assert not any(" cordon " in c or " delete " in c for c in r.calls)


def test_an_api_server_that_does_not_answer_fails_the_step(guest: FakeGuest, cluster: FakeCluster) -> None:
    cluster.save(api_down=True)
    r = drain(guest)
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == (
        f"drain: kubectl get node {NODE}: expected an answer from the API server at https://{ENDPOINT}, saw no answer "
        "(The connection to the server 10.0.0.1:6443 was refused - did you specify the right host or port?)"
    )
    assert not any(c.startswith("kubeadm") for c in r.calls)


def test_two_nodes_retire_at_once_against_one_cluster(tmp_path: Path, cluster: FakeCluster) -> None:
    cluster.pods.append(Pod("ml", "infer-b", "gpu-a10-b"))
    cluster.save()
    guests = [make_guest(tmp_path / name, cluster, name) for name in (NODE, "gpu-a10-b")]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda g: drain(g[1], node=g[0]), zip((NODE, "gpu-a10-b"), guests, strict=True)))
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    state = cluster.state()
    assert state["nodes"] == [] and sorted(state["cordoned"]) == [NODE, "gpu-a10-b"]
    assert [p["name"] for p in state["pods"]] == ["nvidia-device-plugin-x"]


# --- retire_vm.sh on the Proxmox node ------------------------------------------------------------------------


@pytest.fixture
def host(tmp_path: Path, guest: FakeGuest) -> FakeRoot:
    h = FakeRoot(tmp_path / "host")
    install_qm(h, guest)
    guest.install_bundle("drain")  # the guest's agent copy, as its bootstrap left it
    return h


def retire(host: FakeRoot, *, check: bool = False, timeout: int = 600) -> Result:
    guest_args = drain_args(NODE, ENDPOINT, DrainSpec.model_validate({"timeoutSeconds": timeout}), kubeadm_reset=True)
    args = retire_args(3201, NODE, timeout, GUEST_STEP, guest_args, check=check)
    return host.run_bundle("retire", *args)  # nothing on stdin: no credential passes through the Proxmox node


def test_retire_through_the_guest_agent(host: FakeRoot, guest: FakeGuest, cluster: FakeCluster) -> None:
    r = retire(host)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2:] == [f"retire: deleted Node {NODE}", "retire: kubeadm reset"]
    assert NODE not in cluster.state()["nodes"]
    exec_call = next(c for c in r.calls if c.startswith("qm guest exec 3201 --timeout 780"))
    assert exec_call.startswith(f"qm guest exec 3201 --timeout 780 -- bash -c {LAUNCHER} {GUEST_STEP} --node-name ")
    assert "--node-name gpu-a10-a --api-endpoint k8s.example.test:6443" in exec_call
    assert not any("--pass-stdin" in c for c in r.calls)  # the guest's step is given no stdin at all
    assert_as_the_node(Result(0, "", "", guest.log.read_text().splitlines()), guest)


def test_a_blocked_drain_fails_the_destroy_with_the_guests_message(
    host: FakeRoot, guest: FakeGuest, cluster: FakeCluster
) -> None:
    cluster.pods.append(Pod("ml", "train-0", NODE, owner="StatefulSet", pdb=True))
    cluster.save()
    r = retire(host)
    assert r.returncode == 1
    assert "ml/train-0 (a PodDisruptionBudget refuses its eviction)" in r.stderr
    assert r.stderr.strip().endswith(
        "retire: guest: expected exit code 0 from the retire step in VM 3201, saw 1 (its message is above)"
    )
    assert NODE in cluster.state()["nodes"]
    assert_as_the_node(Result(1, "", "", guest.log.read_text().splitlines()), guest)


@pytest.mark.parametrize(
    ("status", "dead_agent", "why"),
    [
        ("stopped", False, "VM 3201 is not running (status: stopped)"),
        ("missing", False, "VM 3201 is not on this node"),
        ("running", True, "VM 3201's guest agent does not answer"),
    ],
)
def test_a_vm_that_no_longer_answers_does_not_block_the_destroy(
    host: FakeRoot, cluster: FakeCluster, status: str, dead_agent: bool, why: str
) -> None:
    host.write("fake-vm-status", status)
    if dead_agent:
        host.write("agent-dead", "")
    r = retire(host)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].startswith(f"retire: warning: {why}")
    if dead_agent:  # an agent that does not answer may be restarting: tried 5 times before the drain is skipped
        assert [c for c in r.calls if c.startswith("qm guest cmd")] == ["qm guest cmd 3201 ping"] * 5
    assert r.stdout.strip().endswith(
        f"{NODE} was not drained and its Node object stays (NotReady); delete it with: kubectl delete node {NODE}"
    )
    assert NODE in cluster.state()["nodes"]
    # ...but at create time the same finding is an error: a later retire would not reach the guest.
    r = retire(host, check=True)
    assert r.returncode == 1 and r.stderr.startswith("retire: guest agent: expected VM 3201 (gpu-a10-a) running")


def test_the_create_step_only_checks_the_agent(host: FakeRoot, cluster: FakeCluster) -> None:
    r = retire(host, check=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"retire: ready: VM 3201 ({NODE}) answers through its guest agent and has its drain step"
    # It only looks for the installed drain step; nothing runs in the guest.
    assert [c for c in r.calls if c.startswith("qm guest exec")] == [
        f"qm guest exec 3201 --timeout 30 -- test -f {GUEST_STEP}"
    ]
    assert cluster.state()["cordoned"] == []


def test_a_credential_the_api_server_does_not_know_is_refused_in_one_line(
    guest: FakeGuest, cluster: FakeCluster
) -> None:
    guest.write("etc/kubernetes/kubelet.conf", "apiVersion: v1\nkind: Config\nusers: []\n")  # revoked, or foreign
    r = drain(guest)
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == (
        f"drain: kubectl get node {NODE}: expected an answer from the API server at https://{ENDPOINT}, saw "
        "Unauthorized (the API server refused the credentials)"
    )
    assert r.stderr.splitlines()[1] == "error: You must be logged in to the server (Unauthorized)"  # kubectl's own
    assert NODE in cluster.state()["nodes"] and not any(c.startswith("kubeadm") for c in r.calls)


def test_a_guest_without_the_drain_step_is_left_with_a_warning(
    host: FakeRoot, guest: FakeGuest, cluster: FakeCluster
) -> None:
    # A guest whose agent copy lacks this drain step (removed by hand, a copy that failed): the create step fails
    # (so the retirement is never recorded as able to drain), and a destroy goes on, saying what is left to do.
    import shutil

    shutil.rmtree((guest.root / GUEST_STEP.lstrip("/")).parent)
    check = retire(host, check=True)
    assert check.returncode == 1
    assert check.stderr.strip() == (
        f"retire: guest agent: expected VM 3201 ({NODE}) running with a QEMU guest agent that answers, saw the node "
        f"agent's drain step {GUEST_STEP} is not installed in VM 3201"
    )
    r = retire(host)
    assert r.returncode == 0
    assert "was not drained and its Node object stays" in r.stdout and NODE in cluster.state()["nodes"]
