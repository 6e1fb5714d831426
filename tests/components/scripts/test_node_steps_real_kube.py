"""The node steps that talk to Kubernetes, run as machines run them (the agent bundle's step.sh, nothing on stdin,
kubelet's kubeconfig), against a real kube-apiserver with etcd (tests/kubeapi_real.py) and the real kubectl: the
driver step's rolling change (guest_rollout.sh: slot, cordon, drain by Eviction, uncordon, slot given back), one a
PodDisruptionBudget blocks (429), a MIG geometry change (guest_mig.sh), and the retirement's drain (guest_drain.sh:
the node deletes its own Node). The node's credential is a client certificate for system:node:<name> in
system:nodes, so the Node authorizer, NodeRestriction and the node-steps RBAC decide every request."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.core.spec import DrainSpec
from proxmox_gpu_cluster.render.guest_scripts import drain_args, driver_args, mig_args, verify_args
from tests.agent.test_mig_manager import mig_manager_pod
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakeroot import Result
from tests.kubeapi_real import RealCluster, real_cluster
from tests.support import external

__all__ = ["real_cluster"]

pytestmark = pytest.mark.slow

OLD, NEW = "580.95.05", "580.105.08"
SLOT0 = "proxmox-gpu-cluster-rollout-0"


@pytest.fixture(autouse=True)
def _tools() -> None:
    external(Path("/usr/bin/python3"), "python3", "install it with: apt-get install python3")


def guest_of(rc: RealCluster, root: Path, node: str, joined: bool = True) -> FakeGuest:
    """A fake guest whose kubectl is the real one, joined as ``node`` (kubelet.conf: its client certificate)."""
    guest = FakeGuest(root)
    guest.stub_script("kubectl", f'KUBECACHEDIR="{root}/kubectl-cache" "{rc.kubectl}" "$@"')  # the guest has no HOME
    guest.stub_script("sleep", ":")  # the drain's and the wait's polls take no time
    if joined:
        join(rc, guest, node)
    return guest


def join(rc: RealCluster, guest: FakeGuest, node: str) -> None:
    guest.write("etc/kubernetes/kubelet.conf", "")
    rc.node_kubeconfig(node, guest.root / "etc/kubernetes/kubelet.conf")
    guest.write("var/lib/fake-dpkg/kubelet", "1.34.2-1.1")  # the kubelet the join step installed


def spec(rc: RealCluster, node: str, version: str, namespace: str, **extra: object) -> GuestBootstrapSpec:
    return GuestBootstrapSpec.model_validate(
        {
            "nodeName": node, "gpus": [{"vendorDevice": "10de:2236", "product": "NVIDIA-A10"}], "driverMode": "host",
            "driverBranch": "580", "driverVersion": version, "kernelModules": "open", "toolkit": False,
            "apiEndpoint": rc.server, "kubernetesMinor": 34,
            "rollout": {"drainTimeoutSeconds": 30, "namespace": namespace}, **extra,
        }
    )  # fmt: skip


def held(rc: RealCluster, namespace: str) -> dict[str, str]:
    items = rc.get("configmaps", "-n", namespace)["items"]
    return {i["metadata"]["name"]: h for i in items if (h := (i.get("data") or {}).get("holder"))}


def cordoned(rc: RealCluster, node: str) -> bool:
    return bool(rc.get("node", node).get("spec", {}).get("unschedulable"))


def as_the_node(guest: FakeGuest, *results: Result) -> None:
    calls = [c for r in results for c in r.calls if c.startswith("kubectl ")]
    assert calls and all(f"--kubeconfig {guest.root}/etc/kubernetes/kubelet.conf " in c for c in calls), calls


def world(rc: RealCluster, *pods: tuple[str, dict[str, object]]) -> tuple[str, str, str]:
    """A node, its pods' namespace and a slot namespace with the node-steps RBAC."""
    node, ns, slots = rc.unique("gpu-a"), rc.unique("ml"), rc.unique("slots")
    rc.node(node)
    rc.namespace(ns)
    rc.node_steps_rbac(slots)
    for name, settings in pods:
        rc.pod(ns, name, node, **settings)  # type: ignore[arg-type]
    return node, ns, slots


def test_a_driver_bump_rolls_through_a_slot_against_the_real_api_server(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    rc = real_cluster
    node, ns, slots = world(rc, ("train-0", {}), ("dp", {"owner": "DaemonSet"}))
    guest = guest_of(rc, tmp_path / "g", node, joined=False)
    first = guest.step("driver", *driver_args(spec(rc, node, OLD, slots)))
    assert first.returncode == 0, first.stderr
    join(rc, guest, node)
    b = spec(rc, node, NEW, slots)
    driver = guest.step("driver", *driver_args(b))
    assert driver.returncode == 0, driver.stderr
    assert f"rollout: drained {node}" in driver.stdout and cordoned(rc, node)
    assert rc.pods(ns) == ["dp"] and held(rc, slots) == {SLOT0: node}
    guest.reboot()
    verify = guest.step("verify", *verify_args(b))
    assert verify.returncode == 0, verify.stderr
    assert f"rollout: uncordoned {node}" in verify.stdout and "rollout: released slot" in verify.stdout
    assert not cordoned(rc, node) and held(rc, slots) == {}
    assert "proxmox-gpu-cluster.io/rollout" not in (rc.get("node", node)["metadata"].get("annotations") or {})
    as_the_node(guest, driver, verify)


def test_a_drain_a_budget_blocks_changes_nothing_on_the_machine(real_cluster: RealCluster, tmp_path: Path) -> None:
    rc = real_cluster
    node, ns, slots = world(rc, ("train-0", {"labels": {"app": "train"}}))
    rc.pdb(ns, "train", "train", allowed=0)
    guest = guest_of(rc, tmp_path / "g", node, joined=False)
    assert guest.step("driver", *driver_args(spec(rc, node, OLD, slots))).returncode == 0
    join(rc, guest, node)
    driver = guest.step("driver", *driver_args(spec(rc, node, NEW, slots)))
    assert driver.returncode == 1
    assert driver.stderr.startswith(
        f"rollout: pods on {node}: expected none left within 30s, saw {ns}/train-0 (a PodDisruptionBudget refuses its "
        "eviction); nothing on the machine was changed yet"
    ), driver.stderr
    assert "Cannot evict pod as it would violate the pod's disruption budget" in driver.stderr
    assert guest.installed("nvidia-headless-580-server-open").startswith(OLD)  # type: ignore[union-attr]
    assert cordoned(rc, node) and held(rc, slots) == {SLOT0: node} and rc.pods(ns) == ["train-0"]


def a100(rc: RealCluster, node: str, slots: str) -> GuestBootstrapSpec:
    """An A100 worker's bootstrap spec, joined through the real API server, its slots in ``slots``."""
    return GuestBootstrapSpec.model_validate(
        {
            "nodeName": node, "gpus": [{"vendorDevice": "10de:20f1", "product": "NVIDIA-A100-PCIE-40GB"}],
            "driverMode": "host", "driverBranch": "580", "kernelModules": "open", "toolkit": True,
            "apiEndpoint": rc.server, "kubernetesMinor": 34,
            "rollout": {"drainTimeoutSeconds": 30, "namespace": slots},
        }
    )  # fmt: skip


def test_a_mig_geometry_change_drains_first_and_uncordons_after_success(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    rc = real_cluster
    node, ns, slots = world(rc, ("train-0", {}))
    rc.run("label", "node", node, "nvidia.com/mig.config=all-1g.5gb", "nvidia.com/mig.config.state=success")
    guest = guest_of(rc, tmp_path / "g", node)
    b = a100(rc, node, slots)
    begin = guest.run_bundle("mig", *mig_args(b, "begin", "all-3g.20gb", 60, "gpu-operator"))
    assert begin.returncode == 0, begin.stderr
    assert cordoned(rc, node) and rc.pods(ns) == [] and held(rc, slots) == {SLOT0: node}

    def mig_manager() -> None:  # the label patch lands, mig-manager reports pending, then success
        rc.run("label", "node", node, "--overwrite", "nvidia.com/mig.config=all-3g.20gb",
               "nvidia.com/mig.config.state=pending")  # fmt: skip
        time.sleep(0.5)
        rc.run("label", "node", node, "--overwrite", "nvidia.com/mig.config.state=success")

    guest.stub_script("sleep", "/bin/sleep 0.2")
    manager = threading.Thread(target=mig_manager)
    manager.start()
    end = guest.run_bundle("mig", *mig_args(b, "end", "all-3g.20gb", 60, "gpu-operator"))
    manager.join()
    assert end.returncode == 0, end.stderr
    assert f"mig: {node} runs all-3g.20gb (mig-manager: success)" in end.stdout
    assert not cordoned(rc, node) and held(rc, slots) == {}
    as_the_node(guest, begin, end)


def test_the_mig_end_step_waits_through_a_failure_of_a_mig_manager_without_the_geometrys_config_map(
    real_cluster: RealCluster, tmp_path: Path
) -> None:
    """A new custom geometry on day 2: the label lands first, the old mig-manager (its ConfigMap lacks the geometry)
    reports failed; the release then brings a pod with the new ConfigMap, which succeeds. The step, from its bundle,
    waits through the first report instead of failing on it."""
    rc = real_cluster
    node, _, slots = world(rc)
    operator = rc.unique("gpu-operator")
    rc.namespace(operator)
    rc.run("label", "node", node, "nvidia.com/mig.config=all-1g.5gb", "nvidia.com/mig.config.state=success")
    guest = guest_of(rc, tmp_path / "g", node)
    b = a100(rc, node, slots)
    wanted, old_map, new_map = "custom-0badc0de", "mig-parted-config-00000001", "mig-parted-config-00000002"
    assert guest.run_bundle("mig", *mig_args(b, "begin", wanted, 60, operator)).returncode == 0
    rc.apply(mig_manager_pod(operator, "mig-manager-old", node, old_map))
    rc.run("label", "node", node, "--overwrite", f"nvidia.com/mig.config={wanted}")  # the label patch
    rc.run("label", "node", node, "--overwrite", "nvidia.com/mig.config.state=failed")  # the old pod's run

    def release() -> None:  # the DaemonSet's new pod, then its run: pending, success
        time.sleep(1.0)
        rc.run("delete", "pod", "-n", operator, "mig-manager-old")
        rc.apply(mig_manager_pod(operator, "mig-manager-new", node, new_map))
        time.sleep(1.1)
        rc.run("label", "node", node, "--overwrite", "nvidia.com/mig.config.state=pending")
        rc.run("label", "node", node, "--overwrite", "nvidia.com/mig.config.state=success")

    guest.stub_script("sleep", "/bin/sleep 0.2")
    thread = threading.Thread(target=release)
    thread.start()
    end = guest.run_bundle("mig", *mig_args(b, "end", wanted, 60, operator, config_map=new_map))
    thread.join()
    assert end.returncode == 0, end.stderr
    assert f"mig: {node}: mig-manager's failed is not for {wanted} yet: mig-manager on {node} reads ConfigMap " \
        f"{old_map}, not {new_map} yet; waiting" in end.stdout  # fmt: skip
    assert f"mig: {node} runs {wanted} (mig-manager: success)" in end.stdout
    assert not cordoned(rc, node) and held(rc, slots) == {}
    as_the_node(guest, end)


def test_the_retirement_drain_deletes_its_own_node(real_cluster: RealCluster, tmp_path: Path) -> None:
    rc = real_cluster
    node, ns, _ = world(rc, ("infer", {}), ("device-plugin", {"owner": "DaemonSet"}))
    other = rc.unique("gpu-b")
    rc.node(other)
    rc.pod(ns, "other-node-pod", other)
    guest = guest_of(rc, tmp_path / "g", node)
    r = guest.run_bundle("drain", *drain_args(node, rc.server, DrainSpec.model_validate({"timeoutSeconds": 60}),
                                                kubeadm_reset=True))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"retire: cordoned {node}", f"retire: drained {node}", "retire: systemctl stop", f"retire: deleted Node {node}",
        "retire: kubeadm reset",
    ]  # fmt: skip
    assert rc.run("get", "node", node, "--ignore-not-found").stdout == "" and rc.get("node", other)
    assert rc.pods(ns) == ["device-plugin", "other-node-pod"]  # the DaemonSet's pod stays, the other node's too
    as_the_node(guest, r)
