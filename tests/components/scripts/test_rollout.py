"""Rolling disruptive changes over joined nodes (guest_rollout.sh in the driver and verify steps), in fake guests
against one fake API server that keeps the slots (ConfigMaps), cordons and pods. The steps act as the node itself
(kubelet's kubeconfig, /etc/kubernetes/kubelet.conf): no credential reaches them.

Covered: a driver bump on a joined node (slot, cordon, drain, install, reboot, verify, uncordon, slot given back);
a first provisioning and an unchanged node take no slot; a failed verify leaves the node cordoned and keeping its
slot (the message says how to free it) until a later run passes; a drain a PodDisruptionBudget blocks changes
nothing on the machine; an expired slot is taken over, a live one is waited for (bounded, naming the holder); and N
nodes rolled at once never have more than maxUnavailable between cordon and uncordon; a cluster without the node-steps
RBAC refuses in one line that says so; a node's credential cannot cordon another node. The agent's own tests are in
tests/agent/.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
from pathlib import Path

import pytest

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.render.guest_scripts import driver_args, verify_args
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakekube import SLOT_NAMESPACE, FakeCluster, Pod, kubelet_conf
from tests.components.scripts.fakeroot import Result
from tests.support import external

KUBECONFIG = "apiVersion: v1\nkind: Config\nusers:\n- name: admin\n  user: {token: CANARY-ROLLOUT-TOKEN}\n"
ENDPOINT = "k8s.example.test:6443"
OLD, NEW = "580.95.05", "580.105.08"


@pytest.fixture(autouse=True)
def _tools() -> None:
    # The fake kubectl and the scripts' slot JSON run on the system interpreter, as python3 on an Ubuntu guest.
    external(Path("/usr/bin/python3"), "python3", "install it with: apt-get install python3")


def spec(node: str, version: str, max_unavailable: int = 1, wait: int = 600) -> GuestBootstrapSpec:
    return GuestBootstrapSpec.model_validate(
        {
            "nodeName": node, "gpus": [{"vendorDevice": "10de:2236", "product": "NVIDIA-A10"}], "driverMode": "host",
            "driverBranch": "580", "driverVersion": version, "kernelModules": "open", "toolkit": False,
            "apiEndpoint": ENDPOINT, "kubernetesMinor": 34,
            "rollout": {"maxUnavailable": max_unavailable, "waitSeconds": wait, "drainTimeoutSeconds": 60},
        }
    )  # fmt: skip


def held(cluster: FakeCluster) -> dict[str, str]:
    """Slot -> holder of every held slot (a released slot keeps its ConfigMap, with no holder)."""
    maps, prefix = cluster.state()["configmaps"].items(), f"{SLOT_NAMESPACE}/"
    return {
        key.removeprefix(prefix): h for key, cm in maps if key.startswith(prefix) and (h := cm["data"].get("holder"))
    }


def run(guest: FakeGuest, step: str, b: GuestBootstrapSpec) -> Result:
    """The step as the machine runs it: nothing on stdin (no credential reaches a node step)."""
    args = driver_args(b) if step == "driver" else verify_args(b)
    return guest.step(step, *args)


def join(guest: FakeGuest, node: str) -> None:
    """What the join step leaves: kubelet's kubeconfig for ``node``, mode 600, and the kubelet package."""
    guest.write("etc/kubernetes/kubelet.conf", kubelet_conf(node)).chmod(0o600)
    guest.write("var/lib/fake-dpkg/kubelet", "1.34.2-1.1")  # and the kubelet it installed


def assert_as_the_node(guest: FakeGuest, cluster: FakeCluster, *results: Result) -> None:
    """Every kubectl call used kubelet's kubeconfig (mode 600), and the steps left nothing under /run but the
    per-machine lock file."""
    calls = [c for r in results for c in r.calls if c.startswith("kubectl ")]
    credential = f"--kubeconfig {guest.root}/etc/kubernetes/kubelet.conf "
    assert calls and all(credential in c for c in calls), calls
    assert set(cluster.modes()) == {"0o600"}
    left = {str(p.relative_to(guest.root)) for p in (guest.root / "run").rglob("*") if p.is_file()}
    assert left <= {"run/lock/proxmox-gpu-cluster.lock"}, left


def joined_guest(root: Path, cluster: FakeCluster, node: str) -> FakeGuest:
    """A guest provisioned with the old driver and joined as ``node``."""
    guest = FakeGuest(root)
    cluster.install(guest)
    guest.stub_script("sleep", ":")  # the drain's poll after the evictions: no time in the fake
    first = run(guest, "driver", spec(node, OLD))  # not joined yet: no slot
    assert first.returncode == 0, first.stderr
    join(guest, node)
    return guest


def roll(guest: FakeGuest, node: str, version: str, max_unavailable: int = 1) -> tuple[Result, Result]:
    """The driver step, the reboot it schedules, then the verify step."""
    b = spec(node, version, max_unavailable)
    driver = run(guest, "driver", b)
    if driver.returncode == 0 and "reboot: scheduled" in driver.stdout:
        guest.reboot()
    return driver, run(guest, "verify", b)


def two_nodes(state: Path) -> FakeCluster:
    """A fake API server (its state in ``state``) with nodes gpu-a and gpu-b, each running one pod."""
    c = FakeCluster(state, KUBECONFIG, nodes=["gpu-a", "gpu-b"])
    c.pods = [Pod("ml", "train-0", "gpu-a"), Pod("ml", "serve-0", "gpu-b")]
    c.save()
    return c


@pytest.fixture
def cluster(tmp_path: Path) -> FakeCluster:
    return two_nodes(tmp_path / "api.json")


def test_a_driver_bump_on_a_joined_node_rolls_through_a_slot(tmp_path: Path, cluster: FakeCluster) -> None:
    guest = joined_guest(tmp_path / "a", cluster, "gpu-a")
    driver, verify = roll(guest, "gpu-a", NEW)
    assert driver.returncode == 0, driver.stderr
    lines = driver.stdout.splitlines()
    took = next(i for i, line in enumerate(lines) if line.startswith("rollout: gpu-a took slot"))
    installed = next(i for i, line in enumerate(lines) if "(installed)" in line)
    assert "rollout: drained gpu-a" in lines[took:installed]  # cordoned and drained before the new driver
    assert "driver 580.95.05-0ubuntu0.24.04.2 -> 580.105.08" in lines[took]
    assert verify.returncode == 0, verify.stderr
    assert "rollout: uncordoned gpu-a" in verify.stdout and "rollout: released slot" in verify.stdout
    state = cluster.state()
    assert state["cordoned"] == [] and held(cluster) == {} and state["annotations"]["gpu-a"] == {}
    assert [p["name"] for p in state["pods"]] == ["serve-0"]  # gpu-a's pod was evicted, gpu-b's stays
    # The slot is written when taken, renewed after the drain (its pod evicted) and when verify starts, then released.
    assert [e[1:] for e in state["events"]] == [
        ["lease", "gpu-a"], ["cordon", "gpu-a"], ["evict", "gpu-a"], ["lease", "gpu-a"], ["lease", "gpu-a"],
        ["uncordon", "gpu-a"], ["release", "gpu-a"],
    ]  # fmt: skip
    assert_as_the_node(guest, cluster, driver, verify)


def test_first_provisioning_and_an_unchanged_node_take_no_slot(tmp_path: Path, cluster: FakeCluster) -> None:
    guest = FakeGuest(tmp_path / "a")
    cluster.install(guest)
    first = run(guest, "driver", spec("gpu-a", OLD))
    assert first.returncode == 0 and "rollout" not in first.stdout
    assert not any(c.startswith("kubectl") for c in first.calls)  # not joined: the cluster is not even asked
    join(guest, "gpu-a")
    again, verify = roll(guest, "gpu-a", OLD)
    assert again.returncode == verify.returncode == 0, again.stderr + verify.stderr
    assert "rollout" not in again.stdout + verify.stdout and "reboot: not-needed" in again.stdout
    assert cluster.state()["events"] == []


SLOT0 = "proxmox-gpu-cluster-rollout-0"
FREE_IT = (
    f"free it with: kubectl annotate node gpu-a proxmox-gpu-cluster.io/rollout- && kubectl -n {SLOT_NAMESPACE} delete "
    f"configmap {SLOT0}"
)


def test_a_failed_verify_leaves_the_node_cordoned_and_keeping_its_slot(tmp_path: Path, cluster: FakeCluster) -> None:
    guest = joined_guest(tmp_path / "a", cluster, "gpu-a")
    guest.write("fake-gpus", "")  # the GPU fell off the bus across the reboot
    driver, verify = roll(guest, "gpu-a", NEW)
    assert driver.returncode == 0 and verify.returncode == 1
    assert "verify: nvidia-smi -L: expected" in verify.stderr
    assert f"rollout: gpu-a stays cordoned and keeps its slot {SLOT0} until a later run passes; {FREE_IT}" in (
        verify.stderr
    )
    assert cluster.state()["cordoned"] == ["gpu-a"] and held(cluster) == {SLOT0: "gpu-a"}
    # It keeps counting against maxUnavailable: another node waits for it, and is told why.
    other = joined_guest(tmp_path / "b", cluster, "gpu-b")
    blocked = run(other, "driver", spec("gpu-b", NEW, wait=0))
    assert blocked.returncode == 1 and cluster.state()["cordoned"] == ["gpu-a"]
    assert (
        "rollout: slot for gpu-b: expected one of 1 free within 0s, saw held by gpu-a (cordoned by a rollout; if "
        "its change failed: kubectl annotate node gpu-a"
    ) in blocked.stderr
    # Fixed and run again: verify passes, the node is uncordoned and its slot given back.
    guest.write("fake-gpus", "GPU 0: NVIDIA A10 (UUID: GPU-7f1c2a80-0000-0000-0000-000000000001)\n")
    again = run(guest, "verify", spec("gpu-a", NEW))
    assert again.returncode == 0 and "rollout: uncordoned gpu-a" in again.stdout
    assert cluster.state()["cordoned"] == [] and held(cluster) == {}


def test_a_blocked_drain_changes_nothing(tmp_path: Path, cluster: FakeCluster) -> None:
    cluster.pods = [Pod("ml", "train-0", "gpu-a", pdb=True)]
    cluster.save()
    guest = joined_guest(tmp_path / "a", cluster, "gpu-a")
    driver = run(guest, "driver", spec("gpu-a", NEW))
    assert driver.returncode == 1
    assert driver.stderr.startswith(
        "rollout: pods on gpu-a: expected none left within 60s, saw ml/train-0 (a PodDisruptionBudget refuses its "
        "eviction); nothing on the machine was changed yet"
    )
    assert "Cannot evict pod as it would violate the pod's disruption budget" in driver.stderr  # kubectl's own
    assert f"rollout: gpu-a stays cordoned and keeps its slot {SLOT0}" in driver.stderr
    assert guest.installed("nvidia-headless-580-server-open").startswith(OLD)  # type: ignore[union-attr]
    assert cluster.state()["cordoned"] == ["gpu-a"] and held(cluster) == {SLOT0: "gpu-a"}


def lease(holder: str, age: int, seconds: int = 3600) -> dict[str, object]:
    """Slot 0 held by ``holder``, renewed ``age`` seconds ago, by ``namespace/name`` (as ``save`` takes it)."""
    stamp = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {f"{SLOT_NAMESPACE}/{SLOT0}": {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": SLOT0, "namespace": SLOT_NAMESPACE, "resourceVersion": "7"},
        "data": {"holder": holder, "leaseDurationSeconds": str(seconds), "renewTime": stamp},
    }}  # fmt: skip


def test_an_expired_slot_is_taken_over_and_a_live_one_waited_for(tmp_path: Path, cluster: FakeCluster) -> None:
    cluster.save(configmaps=lease("crashed-node", age=7200))
    guest = joined_guest(tmp_path / "a", cluster, "gpu-a")
    driver, verify = roll(guest, "gpu-a", NEW)
    assert driver.returncode == verify.returncode == 0, driver.stderr + verify.stderr
    assert "rollout: gpu-a took slot proxmox-gpu-cluster-rollout-0" in driver.stdout
    cluster.save(configmaps=lease("gpu-b", age=10))
    waiting = FakeGuest(tmp_path / "b")
    cluster.install(waiting)
    join(waiting, "gpu-a")
    blocked = run(waiting, "driver", spec("gpu-a", NEW, wait=0))
    assert blocked.returncode == 1
    assert "rollout: slot for gpu-a: expected one of 1 free within 0s, saw held by gpu-b (pulumi up" in blocked.stderr
    assert cluster.state()["cordoned"] == []  # nothing was touched while waiting


@pytest.mark.parametrize("max_unavailable", [1, 2])
def test_concurrent_nodes_never_exceed_max_unavailable(tmp_path: Path, max_unavailable: int) -> None:
    nodes = [f"gpu-{i}" for i in range(5)]
    cluster = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=nodes)
    cluster.pods = [Pod("ml", f"job-{n}", n) for n in nodes]
    cluster.save()
    guests = {n: joined_guest(tmp_path / n, cluster, n) for n in nodes}
    for guest in guests.values():
        guest.stub_script("sleep", "exec /bin/sleep 0.2")  # the slot poll, shortened
    with concurrent.futures.ThreadPoolExecutor(len(nodes)) as pool:
        results = dict(zip(nodes, pool.map(lambda n: roll(guests[n], n, NEW, max_unavailable), nodes), strict=True))
    for node, (driver, verify) in results.items():
        assert driver.returncode == verify.returncode == 0, (node, driver.stderr, verify.stderr)
        assert guests[node].installed("nvidia-headless-580-server-open").startswith(NEW)  # type: ignore[union-attr]
    state = cluster.state()
    assert state["cordoned"] == [] and held(cluster) == {}
    assert state["peak"] == max_unavailable  # cordoned by a rollout at once, checked after every API request
    out_of_service, peak = set(), 0
    for _, what, node in sorted(state["events"]):
        if what == "cordon":
            out_of_service.add(node)
        elif what == "uncordon":
            out_of_service.discard(node)
        peak = max(peak, len(out_of_service))
    assert peak == max_unavailable  # reached (they did overlap), never exceeded
    (tmp_path / "events.json").write_text(json.dumps(state["events"]))


def test_a_switch_to_vm_workloads_rolls_too(tmp_path: Path, cluster: FakeCluster) -> None:
    # A joined container node becomes a KubeVirt vm-passthrough node: its host driver goes, its GPU goes to vfio-pci
    # and the guest needs the IOMMU on, a reboot away: drained through a slot first, like a driver change.
    guest = joined_guest(tmp_path / "a", cluster, "gpu-a")
    vfio = spec("gpu-a", OLD).model_copy(
        update={"driver_mode": "vfio", "kernel_args": ("intel_iommu=on", "iommu=pt"), "kvm": True, "toolkit": False}
    )
    driver = run(guest, "driver", vfio)
    assert driver.returncode == 0, driver.stderr
    assert "rollout: gpu-a took slot proxmox-gpu-cluster-rollout-0 (the host driver to remove (driver mode vfio))" in (
        driver.stdout
    )
    assert "driver: host driver removed (nvidia-headless-580-server-open nvidia-utils-580-server)" in driver.stdout
    assert "reboot: scheduled" in driver.stdout and cluster.state()["cordoned"] == ["gpu-a"]
    guest.reboot()
    verify = run(guest, "verify", vfio)
    assert verify.returncode == 0, verify.stderr
    assert "rollout: uncordoned gpu-a" in verify.stdout and held(cluster) == {}


def test_an_unchanged_joined_node_does_not_even_ask_the_api_server(tmp_path: Path, cluster: FakeCluster) -> None:
    guest = joined_guest(tmp_path / "a", cluster, "gpu-a")
    cluster.save(api_down=True)
    again = run(guest, "driver", spec("gpu-a", OLD))
    assert again.returncode == 0, again.stderr
    assert not any(c.startswith("kubectl") for c in again.calls)


def test_the_holder_renews_its_slot_so_a_long_change_keeps_it(tmp_path: Path, cluster: FakeCluster) -> None:
    # Its own slot from a run that died an hour ago: taken again, and renewed once the node is drained, so no
    # other node can take it over while this one installs and reboots.
    cluster.save(configmaps=lease("gpu-a", age=7200))
    guest = joined_guest(tmp_path / "a", cluster, "gpu-a")
    driver = run(guest, "driver", spec("gpu-a", NEW))
    assert driver.returncode == 0, driver.stderr
    held = cluster.state()["configmaps"][f"{SLOT_NAMESPACE}/{SLOT0}"]["data"]
    renewed = datetime.datetime.strptime(held["renewTime"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.UTC)
    assert held["holder"] == "gpu-a"
    assert (datetime.datetime.now(datetime.UTC) - renewed).total_seconds() < 60


def test_a_killed_verify_is_run_again_and_finishes(tmp_path: Path, cluster: FakeCluster) -> None:
    # The verify step is killed (SIGKILL of the whole run, as a dropped SSH session) at each of its commands in turn,
    # up to the uncordon; every time, the node stays cordoned and holds its slot, and the next run renews it.
    guest = joined_guest(tmp_path / "a", cluster, "gpu-a")
    driver = run(guest, "driver", spec("gpu-a", NEW))
    assert driver.returncode == 0, driver.stderr
    guest.reboot()
    for at in range(1, 100):
        guest.fault(at, "kill")
        run(guest, "verify", spec("gpu-a", NEW))
        hit = guest.fault_hit() or ""
        assert guest.killed, f"verify ended before the uncordon, at {at}"
        assert held(cluster) == {SLOT0: "gpu-a"} and cluster.state()["cordoned"] == ["gpu-a"], hit
        if " uncordon " in hit:
            break
    guest.fault(None)
    again = run(guest, "verify", spec("gpu-a", NEW))
    assert again.returncode == 0, again.stderr
    assert "rollout: uncordoned gpu-a" in again.stdout and f"rollout: released slot {SLOT0}" in again.stdout
    assert held(cluster) == {} and cluster.state()["cordoned"] == []
    assert_as_the_node(guest, cluster, again)  # and nothing of the killed runs is left under /run


def test_a_cluster_without_the_node_steps_rbac_refuses_in_one_line(tmp_path: Path, cluster: FakeCluster) -> None:
    # The node's own credential may read its Node, but the slots (ConfigMaps in the slot namespace) need the grants
    # the cluster applies (render/node_rbac.py): without them the step stops before touching anything, saying so.
    cluster.save(rbac=False)
    guest = joined_guest(tmp_path / "a", cluster, "gpu-a")
    driver = run(guest, "driver", spec("gpu-a", NEW))
    assert driver.returncode == 1
    first = driver.stderr.splitlines()[0]
    assert first.startswith(
        f"rollout: kubectl get configmaps: expected an answer from the API server at https://{ENDPOINT}, saw Forbidden ("
    ), first
    assert 'User "system:node:gpu-a" cannot list resource "configmaps"' in first
    assert first.endswith("is the cluster's node-steps RBAC applied?)")
    state = cluster.state()
    assert state["cordoned"] == [] and state["configmaps"] == {} and len(state["pods"]) == 2
    assert guest.installed("nvidia-headless-580-server-open").startswith(OLD)  # type: ignore[union-attr]


def test_a_nodes_credential_cannot_cordon_or_drain_another_node(tmp_path: Path, cluster: FakeCluster) -> None:
    # A machine that holds gpu-a's kubelet credential but is told it is gpu-b (a wrong --rollout-node, or a node
    # trying its neighbour): NodeRestriction refuses the mark and the cordon, so gpu-b is untouched and its pod stays.
    guest = joined_guest(tmp_path / "a", cluster, "gpu-b")
    join(guest, "gpu-a")
    driver = run(guest, "driver", spec("gpu-b", NEW))
    assert driver.returncode == 1
    assert 'is forbidden: node "gpu-a" is not allowed to modify node "gpu-b"' in driver.stderr
    state = cluster.state()
    assert state["cordoned"] == [] and state["annotations"].get("gpu-b", {}) == {}
    assert sorted(p["name"] for p in state["pods"]) == ["serve-0", "train-0"]
    assert held(cluster) == {}  # the slot it took before the refused mark was given back
    assert guest.installed("nvidia-headless-580-server-open").startswith(OLD)  # type: ignore[union-attr]
