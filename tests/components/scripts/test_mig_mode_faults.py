"""Fault injection over a MIG mode change through the hypervisor: the guest's MIG begin step, the Proxmox-side
mig-restart step and the guest's MIG end step, each failed or killed (SIGKILL of its process group) at every stubbed
command it runs, then the chain run again as the next ``pulumi up`` would (a step that passed is not run again; the
failed step and those after it are). mig-manager reacts to the label patch and to every VM start. Asserted: the end
state equals an uninterrupted run's (one VM restart, the mode applied, the node uncordoned, its slot free, no
leftover annotation or marker, the VM never stopped while the node ran a workload or held no rollout slot: the
restart step's guest side holds the node again, whatever begin left), and a third run of every step changes nothing
and restarts nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxmox_gpu_cluster.render.agent_bundle import installed_step
from proxmox_gpu_cluster.render.guest_scripts import driver_args, mig_args
from proxmox_gpu_cluster.render.host_scripts import mig_restart_args
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakekube import FakeCluster, Pod, kubelet_conf
from tests.components.scripts.fakemig import (
    exec_fault,
    install_mig,
    install_vm,
    mig_manager,
    mig_state,
    restarts,
    shutdowns,
)
from tests.components.scripts.fakeroot import FAULT_MODES, FakeRoot, Result
from tests.components.scripts.test_mig_mode import KUBECONFIG, NEW, NODE, OLD, VMID, B
from tests.components.scripts.test_rollout import held
from tests.support import external

STEPS = ("begin", "restart", "end")
SIDES = [("begin", "guest"), ("restart", "host"), ("restart", "guest-exec"), ("end", "guest")]
MUTATING = (" -mig ", "kubectl cordon", "kubectl uncordon", "kubectl annotate", "kubectl create", "kubectl replace",
            "qm shutdown", "qm start")  # fmt: skip


class Chain:
    """One worker VM on one Proxmox node, its Node in a fake API server, before the change."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True)
        self.cluster = FakeCluster(root / "api.json", KUBECONFIG, nodes=[NODE], pods=[Pod("ml", "train-0", NODE)])
        self.cluster.labels = {NODE: {"nvidia.com/mig.config": OLD, "nvidia.com/mig.config.state": "success"}}
        self.cluster.save()
        self.guest = FakeGuest(root / "guest")
        self.cluster.install(self.guest)
        self.guest.write("etc/kubernetes/kubelet.conf", kubelet_conf(NODE)).chmod(0o600)
        self.guest.write("sys/module/nvidia/version", "580.95.05\n")
        self.guest.stub_script("sleep", ":")
        install_mig(self.guest, {0: "Disabled"})
        self.guest.install_bundle("mig")
        self.host = FakeRoot(root / "host")
        install_vm(self.host, self.guest, cluster=self.cluster, node=NODE)

    def run(self, step: str, timeout: int = 1) -> Result:
        """One step as Pulumi runs it, with what happens around it: the label patch (and mig-manager's run) once
        begin passed, and mig-manager's run after every VM start."""
        if step == "restart":
            before = restarts(self.host)
            args = mig_args(B, "restart", NEW, timeout, "gpu-operator")
            guest_step = installed_step("ubuntu", "mig")
            result = self.host.run_bundle("mig-restart", *mig_restart_args(VMID, NODE, 5, guest_step, args))
            if restarts(self.host) != before:  # the VM booted: mig-manager's pod runs again
                mig_manager(self.cluster, self.guest, NODE)
            return result
        result = self.guest.run_bundle("mig", *mig_args(B, step, NEW, timeout, "gpu-operator"))
        if step == "begin" and result.returncode == 0:
            self.cluster.set_labels(NODE, **{"nvidia.com/mig.config": NEW})
            mig_manager(self.cluster, self.guest, NODE)
        return result

    def fault(self, step: str, at: int | None, mode: str = "fail", side: str = "") -> FakeRoot:
        if side == "guest-exec":  # the restart step's guest side (it holds the node), run through qm guest exec
            exec_fault(self.guest, at, mode)
            return self.guest
        machine = self.host if step == "restart" else self.guest
        machine.fault(at, mode)
        return machine

    def end_state(self) -> dict[str, Any]:
        state = self.cluster.state()
        marker = self.host.root / f"var/lib/proxmox-gpu-cluster/mig-restart-{VMID}"
        return {
            "cordoned": state["cordoned"], "held": held(self.cluster), "labels": state["labels"][NODE],
            "annotations": state["annotations"].get(NODE, {}), "mig": mig_state(self.guest),
            "restarts": restarts(self.host), "vm": self.host.read("fake-vm-status").strip(), "marker": marker.exists(),
            "pods": sorted(p["name"] for p in state["pods"]),
            "unheld stops": [s for s in shutdowns(self.host) if s != {"pods": [], "held": True}],
        }  # fmt: skip


def converge(chain: Chain, start: int) -> list[str]:
    """Run the chain from step ``start`` as the next pulumi up would; the failures of that run."""
    failures = []
    for step in STEPS[start:]:
        result = chain.run(step)
        if result.returncode:
            failures.append(f"{step}: {result.stderr.strip()}")
            break
    return failures


@pytest.fixture(autouse=True)
def _tools() -> None:
    external(Path("/usr/bin/python3"), "python3", "install it with: apt-get install python3")
    external(Path("/usr/bin/perl"), "perl", "install it with: apt-get install perl")


def uninterrupted(root: Path) -> dict[str, Any]:
    chain = Chain(root)
    assert converge(chain, 0) == []
    return chain.end_state()


@pytest.mark.slow
@pytest.mark.parametrize(("step", "side"), SIDES, ids=[f"{s}-{side}" for s, side in SIDES])
def test_every_fault_in_a_mig_mode_step_converges(tmp_path: Path, step: str, side: str) -> None:
    want = uninterrupted(tmp_path / "clean")
    assert want["restarts"] == 1 and want["cordoned"] == [] and want["mig"] == {0: ("Enabled", "Enabled")}
    assert want["pods"] == [] and want["unheld stops"] == []  # the VM stopped drained, inside the node's slot
    index = STEPS.index(step)
    points = converged = 0
    bad: list[str] = []
    for mode in FAULT_MODES:
        n = 0
        while True:
            n += 1
            chain = Chain(tmp_path / f"{mode}-{n}")
            assert all(chain.run(s).returncode == 0 for s in STEPS[:index])
            machine = chain.fault(step, n, mode, side)
            chain.run(step)
            hit = machine.fault_hit()
            chain.fault(step, None, mode, side)
            if hit is None:
                break
            points += 1
            failures = converge(chain, index)
            third = [chain.run(s) for s in STEPS]
            changed = [c for r in third for c in r.calls if any(m in c for m in MUTATING)]
            if failures or chain.end_state() != want or changed or any(r.returncode for r in third):
                bad.append(f"{mode} at {n} ({hit}): {failures or changed or chain.end_state()}")
            else:
                converged += 1
    report = f"{step} ({side}): {converged}/{points} injection points converged"
    print(report)
    assert points > 0 and not bad, report + "\n" + "\n".join(bad)


def test_a_restart_killed_once_the_vm_is_stopped_starts_it_next_time(tmp_path: Path) -> None:
    probe = Chain(tmp_path / "probe")
    assert probe.run("begin").returncode == 0
    at = next(i for i, c in enumerate(probe.run("restart").calls, 1) if c.startswith("qm shutdown"))
    chain = Chain(tmp_path / "chain")
    assert chain.run("begin").returncode == 0
    chain.fault("restart", at, "kill-after")
    killed = chain.run("restart")
    chain.fault("restart", None)
    assert killed.returncode != 0 and chain.host.read("fake-vm-status").strip() == "stopped"
    assert converge(chain, 1) == [] and converge(probe, 2) == []
    assert chain.end_state() == probe.end_state() and chain.end_state()["restarts"] == 1


@pytest.mark.slow
def test_every_fault_in_the_driver_steps_mig_mode_converges(tmp_path: Path) -> None:
    """The driver step of a new worker with --mig-mode, failed or killed at each command from its first MIG query
    on (the commands before it are the driver harness's, tests/components/scripts/test_guest_fault_injection.py),
    then run again: the mode ends pending as after an uninterrupted run, and a third run calls no nvidia-smi -mig."""

    def fresh(name: str) -> FakeGuest:
        g = FakeGuest(tmp_path / name)
        install_mig(g, {0: "Disabled"})
        return g

    clean = fresh("clean")
    calls = clean.run_bundle("driver", *driver_args(B)).calls
    first = next(i for i, c in enumerate(calls, 1) if c.startswith("nvidia-smi --query-gpu"))
    want = mig_state(clean)
    assert want == {0: ("Disabled", "Enabled")}
    points = converged = 0
    bad: list[str] = []
    for mode in FAULT_MODES:
        for n in range(first, len(calls) + 1):
            g = fresh(f"{mode}-{n}")
            g.fault(n, mode)
            g.run_bundle("driver", *driver_args(B))
            hit = g.fault_hit()
            g.fault(None)
            if hit is None:
                continue
            points += 1
            again, third = g.run_bundle("driver", *driver_args(B)), g.run_bundle("driver", *driver_args(B))
            if (
                again.returncode
                or third.returncode
                or mig_state(g) != want
                or [c for c in third.calls if " -mig " in c]
            ):
                bad.append(f"{mode} at {n} ({hit}): {again.stderr.strip() or mig_state(g)}")
            else:
                converged += 1
    report = f"driver (MIG mode part): {converged}/{points} injection points converged"
    print(report)
    assert points > 0 and not bad, report + "\n" + "\n".join(bad)
