"""The MIG restart step never restarts a node with workloads outside a rollout slot (issue 24 part 3, rule 2).
Before the Proxmox-side restart stops the VM, the guest side holds the node for the change: a rollout slot (at
most maxUnavailable nodes out), the cordon and the drain, whatever begin did. Begin holds nothing when the node keeps
its geometry label and the operator's driver container is down then (the mode is unknown), nor on a first
provisioning (the node was schedulable since its join). ``fakemig.shutdowns`` records what the node ran at each
``qm shutdown``. Run as machines run them (the agent bundles), in the operator world's time."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec, RolloutSpec
from proxmox_gpu_cluster.render.agent_bundle import installed_step
from proxmox_gpu_cluster.render.guest_scripts import mig_args
from proxmox_gpu_cluster.render.host_scripts import mig_restart_args
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakekube import FakeCluster, Pod, kubelet_conf
from tests.components.scripts.fakemig import install_mig, install_vm, operator_world, restarts, shutdowns
from tests.components.scripts.fakeroot import FakeRoot, Result
from tests.components.scripts.test_mig_mode import KUBECONFIG, NEW, RESTARTED, SPEC
from tests.components.scripts.test_mig_mode_operator import WANT, Chain
from tests.components.scripts.test_rollout import held
from tests.support import external

TIMEOUT = 60  # the guest steps' budget: 12 polls of 5 s (ticks)
STATE = "nvidia.com/mig.config.state"
ROLLOUT = "proxmox-gpu-cluster.io/rollout"


@pytest.fixture(autouse=True)
def _tools() -> None:
    external(Path("/usr/bin/python3"), "python3", "install it with: apt-get install python3")
    external(Path("/usr/bin/perl"), "perl", "install it with: apt-get install perl")


class Worker:
    """A joined worker running ``NEW`` (its label stays), GPU 0 with MIG off to be turned on, a workload pod, the
    operator's driver container down (restarting) when the change begins; its VM on its own Proxmox node."""

    def __init__(self, root: Path, cluster: FakeCluster, node: str, vmid: int) -> None:
        self.node, self.vmid, self.cluster = node, vmid, cluster
        rollout = {"drainTimeoutSeconds": 60, "waitSeconds": 10}
        self.spec = GuestBootstrapSpec.model_validate({**SPEC, "nodeName": node, "migModes": ["0=1"],
                                                       "rollout": rollout})  # fmt: skip
        self.guest = FakeGuest(root / node)
        cluster.install(self.guest)
        self.guest.write("etc/kubernetes/kubelet.conf", kubelet_conf(node)).chmod(0o600)
        install_mig(self.guest, {0: "Disabled"})
        operator_world(self.guest, cluster, node)
        self.guest.install_bundle("mig")
        self.host = FakeRoot(root / f"{node}-host")
        install_vm(self.host, self.guest, cluster=cluster, node=node)

    def run(self, step: str) -> Result:
        args = mig_args(self.spec, step, NEW, TIMEOUT, "gpu-operator")
        if step == "restart":
            guest_step = installed_step("ubuntu", "mig")
            return self.host.run_bundle("mig-restart", *mig_restart_args(self.vmid, self.node, 30, guest_step, args))
        return self.guest.run_bundle("mig", *args)  # the label patch changes nothing: the geometry stays


def workers(root: Path, *names: str) -> tuple[FakeCluster, list[Worker]]:
    root.mkdir(parents=True)
    pods = [Pod("ml", f"train-{n}", n) for n in names] + [Pod("gpu-operator", f"dp-{n}", n, "DaemonSet") for n in names]
    cluster = FakeCluster(root / "api.json", KUBECONFIG, nodes=list(names), pods=pods)
    cluster.labels = {n: {"nvidia.com/mig.config": NEW, STATE: "success"} for n in names}
    cluster.save()
    return cluster, [Worker(root, cluster, n, 210 + i) for i, n in enumerate(names)]


def pods(cluster: FakeCluster, node: str) -> list[str]:
    return sorted(p["name"] for p in cluster.state()["pods"] if p["node"] == node)


def test_a_mode_change_under_an_unchanged_label_drains_in_the_restart_step(tmp_path: Path) -> None:
    cluster, (w,) = workers(tmp_path / "c", "gpu-a")
    begin = w.run("begin")
    assert begin.returncode == 0, begin.stderr
    assert "nothing to drain" in begin.stdout and cluster.state()["cordoned"] == []  # the mode unknown then
    restart = w.run("restart")
    assert restart.returncode == 0, restart.stderr
    assert "rollout: gpu-a took slot proxmox-gpu-cluster-rollout-0 (MIG mode for all-1g.5gb: VM restart)" in (
        restart.stdout
    )
    assert shutdowns(w.host) == [{"pods": [], "held": True}] and restarts(w.host) == 1
    # Each guest run may take its 60 s, the 10 s slot wait and the 60 s drain, and 60 s more.
    assert [c.split(" -- ")[0] for c in restart.calls if c.startswith("qm guest exec")] == [
        "qm guest exec 210 --timeout 190"
    ] * 2
    assert pods(cluster, "gpu-a") == ["dp-gpu-a"]  # evicted; the DaemonSet's pod stays
    assert held(cluster) == {"proxmox-gpu-cluster-rollout-0": "gpu-a"}
    end = w.run("end")
    assert end.returncode == 0, end.stderr
    state = cluster.state()
    assert state["cordoned"] == [] and held(cluster) == {} and state["annotations"].get("gpu-a", {}) == {}
    assert state["labels"]["gpu-a"][STATE] == "success"
    third = [w.run(s) for s in ("begin", "restart", "end")]
    assert [r.returncode for r in third] == [0, 0, 0] and restarts(w.host) == 1
    assert not [
        c
        for r in third
        for c in r.calls
        if c.startswith(("kubectl cordon", "kubectl annotate", "qm shutdown", "qm start"))
    ]


def test_two_nodes_needing_a_restart_take_turns_within_max_unavailable(tmp_path: Path) -> None:
    cluster, (a, b) = workers(tmp_path / "c", "gpu-a", "gpu-b")
    assert [w.run("begin").returncode for w in (a, b)] == [0, 0]
    assert a.run("restart").returncode == 0 and restarts(a.host) == 1
    waiting = b.run("restart")  # gpu-a holds the one slot until its end step
    assert waiting.returncode == 1 and restarts(b.host) == 0 and shutdowns(b.host) == []
    line = "rollout: slot for gpu-b: expected one of 1 free within 10s, saw held by gpu-a (cordoned by a rollout"
    assert any(x.startswith(line) for x in waiting.stderr.splitlines()), waiting.stderr
    assert waiting.stderr.splitlines()[-1].startswith("mig-restart: guest: expected exit code 0 from the MIG step")
    assert pods(cluster, "gpu-b") == ["dp-gpu-b", "train-gpu-b"] and cluster.state()["cordoned"] == ["gpu-a"]
    assert a.run("end").returncode == 0 and cluster.state()["cordoned"] == []
    again = b.run("restart")  # the next pulumi up
    assert again.returncode == 0, again.stderr
    assert shutdowns(b.host) == [{"pods": [], "held": True}] and restarts(b.host) == 1
    assert b.run("end").returncode == 0
    state = cluster.state()
    assert state["peak"] == 1 and state["cordoned"] == [] and held(cluster) == {}
    assert all(state["annotations"].get(n, {}) == {} for n in ("gpu-a", "gpu-b"))


def test_a_drain_a_budget_refuses_fails_the_restart_step_and_restarts_nothing(tmp_path: Path) -> None:
    root = tmp_path / "c"
    cluster, (w,) = workers(root, "gpu-a")
    cluster.change(lambda s: s["pods"].append({**vars(Pod("ml", "guarded", "gpu-a")), "pdb": True}))
    assert w.run("begin").returncode == 0
    failed = w.run("restart")
    assert failed.returncode == 1 and restarts(w.host) == 0 and shutdowns(w.host) == []
    line = "mig: pods on gpu-a: expected none left within 60s, saw ml/guarded (a PodDisruptionBudget refuses its"
    assert any(x.startswith(line) for x in failed.stderr.splitlines()), failed.stderr
    assert cluster.state()["cordoned"] == ["gpu-a"] and held(cluster) == {"proxmox-gpu-cluster-rollout-0": "gpu-a"}
    assert RESTARTED not in cluster.state()["annotations"].get("gpu-a", {})
    # Once the budget allows it, the next pulumi up drains and restarts once.
    cluster.change(lambda s: [p.update(pdb=False) for p in s["pods"]])
    assert w.run("restart").returncode == 0 and w.run("end").returncode == 0
    assert shutdowns(w.host) == [{"pods": [], "held": True}] and cluster.state()["cordoned"] == []


def test_a_first_provisioning_in_operator_mode_is_drained_before_the_restart(tmp_path: Path) -> None:
    chain = Chain(tmp_path / "c")  # a workload pod landed since the join
    assert sorted(p["name"] for p in chain.cluster.state()["pods"]) == ["dp", "landed"]
    for step in ("begin", "restart", "end"):
        result = chain.run(step)
        assert result.returncode == 0, result.stderr
    assert shutdowns(chain.host) == [{"pods": [], "held": True}]
    assert chain.end_state() == WANT and chain.cluster.state()["peak"] == 1
    assert chain.third() == []
    assert ROLLOUT not in chain.cluster.state()["annotations"].get("gpu-a100-a", {})


def test_the_restart_steps_bound_knows_the_rollout_defaults() -> None:
    """mig_restart.sh and vm_restart.sh bound a guest run with the slot wait and the drain (host_qm.sh,
    qm_hold_seconds), which the guest's arguments carry only when they differ from the defaults
    (render/guest_scripts.rollout_args)."""
    script = (Path(__file__).parents[3] / "components/scripts/host_qm.sh").read_text()
    defaults = RolloutSpec()
    assert f"qm_guest_arg --rollout-wait-seconds {defaults.wait_seconds} " in script
    assert f"qm_guest_arg --rollout-drain-timeout {defaults.drain_timeout_seconds} " in script
