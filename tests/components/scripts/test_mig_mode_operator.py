"""MIG mode on a first provisioning in operator driver mode (issue 24 part 3, its last gap): no driver runs in the
guest before the join, so the driver step cannot set the mode; the operator (installed after the node's labels, so
alongside the mig-restart step) brings its driver container up, mig-manager sets the mode, which stays pending in
the VM, and reports failed. The restart step's guest side waits until it can decide (the driver container answers;
for a restart, mig-manager's report for the label), the VM restarts once from Proxmox, the container comes up
again, mig-manager reports success, and the end step waits for that report. Faked in time
(``fakemig.operator_world``: each guest ``sleep`` is a tick); run as machines run them (the agent bundles)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxmox_gpu_cluster.render.agent_bundle import installed_step
from proxmox_gpu_cluster.render.guest_scripts import mig_args
from proxmox_gpu_cluster.render.host_scripts import mig_restart_args
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakekube import FakeCluster, Pod, kubelet_conf
from tests.components.scripts.fakemig import (
    driver_answers,
    install_mig,
    install_vm,
    mig_reports,
    mig_state,
    operator_world,
    restarts,
    shutdowns,
    tick,
)
from tests.components.scripts.fakeroot import FakeRoot, Result
from tests.components.scripts.test_mig_mode import KUBECONFIG, NEW, NODE, RESTARTED, VMID, B
from tests.components.scripts.test_rollout import held
from tests.support import external

STEPS = ("begin", "restart", "end")
STATE = "nvidia.com/mig.config.state"
MUTATING = (" -mig ", "kubectl cordon", "kubectl uncordon", "kubectl annotate", "kubectl create", "kubectl replace",
            "qm shutdown", "qm start")  # fmt: skip
TIMEOUT = 60  # the guest steps' budget: 12 polls of 5 s (ticks)


class Chain:
    """A new worker in operator driver mode, joined, its Node without a MIG label yet (the operator is not
    installed), a workload pod landed since the join beside a DaemonSet's; one Proxmox node runs its VM.
    ``joined``: a worker running the label already, its driver container down (restarting) as the change begins,
    so begin cannot read the mode and holds nothing."""

    def __init__(self, root: Path, mode: str = "Disabled", *, joined: bool = False, **world: int) -> None:
        root.mkdir(parents=True)
        pods = [Pod("ml", "landed", NODE), Pod("gpu-operator", "dp", NODE, "DaemonSet")]
        self.cluster = FakeCluster(root / "api.json", KUBECONFIG, nodes=[NODE], pods=pods)
        if joined:
            self.cluster.labels = {NODE: {"nvidia.com/mig.config": NEW, STATE: "success"}}
        self.cluster.save()
        self.guest = FakeGuest(root / "guest")
        self.cluster.install(self.guest)
        self.guest.write("etc/kubernetes/kubelet.conf", kubelet_conf(NODE)).chmod(0o600)
        install_mig(self.guest, {0: mode, 1: "[N/A]"})
        operator_world(self.guest, self.cluster, NODE, **world)
        self.guest.install_bundle("mig")
        self.host = FakeRoot(root / "host")
        install_vm(self.host, self.guest, cluster=self.cluster, node=NODE)

    def run(self, step: str, timeout: int = TIMEOUT) -> Result:
        """One step as Pulumi runs it; once begin passed, the label patch (mig-manager reacts in its own time)."""
        args = mig_args(B, step, NEW, timeout, "gpu-operator")
        if step == "restart":
            guest_step = installed_step("ubuntu", "mig")
            return self.host.run_bundle("mig-restart", *mig_restart_args(VMID, NODE, 30, guest_step, args))
        result = self.guest.run_bundle("mig", *args)
        if step == "begin" and result.returncode == 0:
            self.cluster.set_labels(NODE, **{"nvidia.com/mig.config": NEW})
        return result

    def end_state(self) -> dict[str, Any]:
        state = self.cluster.state()
        marker = self.host.root / f"var/lib/proxmox-gpu-cluster/mig-restart-{VMID}"
        return {
            "cordoned": state["cordoned"], "held": held(self.cluster), "labels": state["labels"].get(NODE, {}),
            "annotations": state["annotations"].get(NODE, {}), "mig": mig_state(self.guest),
            "restarts": restarts(self.host), "vm": self.host.read("fake-vm-status").strip(), "marker": marker.exists(),
            "pods": sorted(p["name"] for p in state["pods"]),
            "unheld stops": [s for s in shutdowns(self.host) if s != {"pods": [], "held": True}],
        }  # fmt: skip

    def third(self) -> list[str]:
        """Every step again: what fails, or a mutating call."""
        runs = [self.run(s) for s in STEPS]
        return [r.stderr.strip() for r in runs if r.returncode] + [
            c for r in runs for c in r.calls if any(m in c for m in MUTATING)
        ]


WANT = {
    "cordoned": [], "held": {}, "labels": {"nvidia.com/mig.config": NEW, STATE: "success"}, "annotations": {},
    "mig": {0: ("Enabled", "Enabled"), 1: ("[N/A]", "[N/A]")}, "restarts": 1, "vm": "running", "marker": False,
    "pods": ["dp"], "unheld stops": [],
}  # fmt: skip


@pytest.fixture(autouse=True)
def _tools() -> None:
    external(Path("/usr/bin/python3"), "python3", "install it with: apt-get install python3")
    external(Path("/usr/bin/perl"), "perl", "install it with: apt-get install perl")


def test_a_first_provisioning_restarts_the_vm_once_and_waits_for_mig_managers_success(tmp_path: Path) -> None:
    chain = Chain(tmp_path / "c")
    begin = chain.run("begin")
    assert begin.returncode == 0, begin.stderr
    assert "mig-manager sets the MIG mode" in begin.stdout and "no geometry yet" in begin.stdout
    assert not [c for c in begin.calls if c.startswith(("kubectl cordon", "sleep"))]  # begin never waits for it
    assert not driver_answers(chain.guest)  # the restart step asks before the operator's driver container runs
    restart = chain.run("restart")
    assert restart.returncode == 0, restart.stderr
    out = restart.stdout
    assert "mig: waiting for the GPU Operator's driver container on gpu-a100-a (up to 60s)" in out
    assert "mig-restart: needed (GPU 0 MIG mode Disabled, Enabled pending a GPU reset)" in out
    assert f"mig: {NODE}: restarting for the MIG mode; mig-manager's state failed is from before it" in out
    assert f"mig-restart: VM {VMID} ({NODE}) restarted: its GPUs' MIG mode applied" in out
    assert [c for c in restart.calls if c.split()[1] in ("shutdown", "start")] == [
        f"qm shutdown {VMID} --timeout 300 --forceStop 1",
        f"qm start {VMID}",
    ]
    # mig-manager ran for the label before the restart (pending, then failed: the mode waits for a reset).
    assert mig_reports(chain.cluster) == [f"{NEW}=pending", f"{NEW}=failed"]
    assert chain.cluster.state()["annotations"][NODE][RESTARTED] == "failed"
    end = chain.run("end")
    assert end.returncode == 0, end.stderr
    assert f"mig: {NODE} runs {NEW} (mig-manager: success)" in end.stdout
    assert mig_reports(chain.cluster) == [f"{NEW}=pending", f"{NEW}=failed", f"{NEW}=success"]  # after the restart
    assert chain.end_state() == WANT
    assert chain.third() == [] and restarts(chain.host) == 1


def test_with_the_mode_already_right_nothing_restarts(tmp_path: Path) -> None:
    # The driver container not up yet when the restart step asks: it waits for it, finds the mode current and
    # decides at once (mig-manager's report is not needed for that).
    early = Chain(tmp_path / "early", mode="Enabled")
    assert early.run("begin").returncode == 0
    done = early.run("restart")
    assert done.returncode == 0, done.stderr
    assert "waiting for the GPU Operator's driver container" in done.stdout
    assert "not restarted: its GPUs run the wanted MIG mode" in done.stdout and restarts(early.host) == 0
    # Up and reconciled already: mig-manager reported success for the label.
    late = Chain(tmp_path / "late", mode="Enabled")
    assert late.run("begin").returncode == 0
    tick(late.guest, 6)
    assert mig_reports(late.cluster) == [f"{NEW}=success"]
    for chain in (early, late):
        runs = [chain.run(s) for s in STEPS[1:]] + [chain.run(s) for s in STEPS]
        assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
        assert not [c for r in runs for c in r.calls if any(m in c for m in MUTATING)] and restarts(chain.host) == 0
        assert RESTARTED not in chain.cluster.state()["annotations"].get(NODE, {})


def test_a_driver_container_that_never_answers_fails_the_restart_step_in_one_line(tmp_path: Path) -> None:
    chain = Chain(tmp_path / "c", driver_after=30)
    assert chain.run("begin").returncode == 0
    failed = chain.run("restart", timeout=10)
    assert failed.returncode == 1 and restarts(chain.host) == 0
    line = (
        f"mig: NVIDIA driver on {NODE}: expected the GPU Operator's driver container answering nvidia-smi within "
        "10s (kubectl -n gpu-operator get pods -l app=nvidia-driver-daemonset), saw no /run/nvidia/driver/usr/bin/"
        "nvidia-smi yet"
    )
    assert line in failed.stderr.splitlines()
    assert failed.stderr.splitlines()[-1] == (
        f"mig-restart: guest: expected exit code 0 from the MIG step in VM {VMID}, saw 1 (its message is above)"
    )
    tick(chain.guest, 27)  # its root is there, its module not loaded yet: nvidia-smi exits 9
    failed = chain.run("restart", timeout=0)
    assert "saw exit 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver" in failed.stderr
    # The next pulumi up, once the operator has it running: one restart, as on the clean path.
    assert [chain.run(s).returncode for s in STEPS[1:]] == [0, 0] and chain.end_state() == WANT
    assert chain.third() == []


def test_no_report_from_mig_manager_in_time_restarts_anyway(tmp_path: Path) -> None:
    chain = Chain(tmp_path / "c", manager_after=10)  # 3 + 10 ticks: more than the 12 the restart step may wait
    chain.cluster.change(lambda state: state.update(pods=[]))  # no pod to evict: the drain's polls take no ticks
    assert chain.run("begin").returncode == 0
    restart = chain.run("restart")
    assert restart.returncode == 0, restart.stderr
    assert f"mig: {NODE}: no report from mig-manager for {NEW} within 45s (state none); restarting" in restart.stdout
    assert mig_reports(chain.cluster) == [] and chain.cluster.state()["annotations"][NODE][RESTARTED] == "none"
    end = chain.run("end")
    assert end.returncode == 0, end.stderr
    assert mig_reports(chain.cluster) == [f"{NEW}=success"] and chain.end_state() == {**WANT, "pods": []}
    assert chain.third() == []
