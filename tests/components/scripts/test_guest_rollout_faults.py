"""Scenario (b) of the guest harness with the rollout on: a joined node (kubelet.conf, its Node in a FakeCluster, a
GPU pod on it) gets a driver bump, driver -> [reboot] -> verify with ``--rollout 1 ...``, acting as the node itself
(the kubelet.conf its join wrote; nothing on stdin), faulted at every stubbed command the two steps run (kubectl and
the drain's poll included) in every mode.

Each case is a "world": the guest under ``<case>/guest`` and its OWN API server state ``<case>/api.json`` (the
fake kubectl finds it next to the guest's root), so cases are independent and run two at a time. As in
guest_harness.py: the faulted step and the ones after it run again as the next `pulumi up` would (a reboot that
was scheduled happens, also after a kill), and the end state must be an uninterrupted run's: the guest's files and
running state, and the cluster's (node uncordoned, no rollout annotation, every slot ConfigMap free, the pods the
uninterrupted run left, and nothing but the machine's lock under the guest's /run). Then every step runs
once more: no mutating call (apt/kubeadm/... nor a kubectl write), no reboot, no API event. At every point of the
API server's event log the node is cordoned only while it holds a slot, and at most maxUnavailable (1) nodes are
cordoned. The dedup of equal states and the checkpoint shortcut are guest_harness.py's, with the cluster's state
in the key (``PGC_FAULT_EXHAUSTIVE=1`` turns them off).
"""

from __future__ import annotations

import re
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from tests.components.scripts.fakeguest import FakeGuest, mutating
from tests.components.scripts.fakekube import SLOT_NAMESPACE, FakeCluster, Pod, kubelet_conf
from tests.components.scripts.fakeroot import FAULT_MODES
from tests.components.scripts.guest_harness import (
    EXHAUSTIVE,
    INSIDE_INSTALL,
    ChainFailed,
    Step,
    StepReport,
    difference,
    digest,
    run,
    run_chain,
    state,
    summary,
)
from tests.components.scripts.test_guest_bootstrap_scripts import spec
from tests.components.scripts.test_guest_fault_injection import chain
from tests.components.scripts.test_rollout import KUBECONFIG
from tests.support import external

NODE, OTHER = "gpu-a10-1", "gpu-b"
SLOT = f"{SLOT_NAMESPACE}/proxmox-gpu-cluster-rollout-0"
ROLLOUT = {"maxUnavailable": 1, "waitSeconds": 0, "drainTimeoutSeconds": 60}
"""No waiting for a slot: only this node rolls, so a slot it cannot take is a failure to report, not to wait for."""
WRITES = {"create", "replace", "delete", "cordon", "uncordon", "annotate"}
"""kubectl verbs that change the cluster (create: a slot, or an Eviction)."""
_KUBECTL_FLAGS = re.compile(r" --kubeconfig \S+ --server \S+ --request-timeout=\S+")
"""What every kubectl call of cluster.py carries: left out of the case's name."""


def rollout_spec(version: str) -> GuestBootstrapSpec:
    return spec(driverVersion=version, apiEndpoint="k8s.example.test:6443", rollout=ROLLOUT)


def rollout_chain(b: GuestBootstrapSpec) -> list[Step]:
    """The bootstrap chain: only the join step reads secrets (its token); driver and verify read nothing on stdin."""
    steps = chain(b)
    assert all(not secrets for name, _, secrets in steps if name != "join"), steps
    return steps


@dataclass
class World:
    """A guest and its own API server: ``dir/guest`` and ``dir/api.json``."""

    guest: FakeGuest
    cluster: FakeCluster

    @property
    def dir(self) -> Path:
        return self.guest.root.parent

    def copy(self, dst: Path) -> World:
        guest = FakeGuest.copy(self.guest, dst / "guest")  # shares the stubs: kubectl finds dst/api.json
        for name in ("api.json", "expected-kubeconfig"):
            shutil.copy(self.dir / name, dst / name)
        return World(guest, FakeCluster(dst / "api.json", KUBECONFIG))

    def view(self) -> dict[str, Any]:
        """What the API server holds that the rollout depends on (not resourceVersions, times or the event log)."""
        s = self.cluster.state()
        return {
            "nodes": sorted(s["nodes"]), "cordoned": sorted(s["cordoned"]), "labels": s.get("labels", {}),
            "annotations": {n: a for n, a in s.get("annotations", {}).items() if a},
            "pods": sorted(f"{p['ns']}/{p['name']}@{p['node']}" for p in s["pods"]),
            "slots": {n: cm["data"].get("holder", "") for n, cm in sorted(s.get("configmaps", {}).items())},
        }  # fmt: skip

    def end_state(self) -> dict[str, str]:
        """The guest's state (as the harness compares it) and the cluster's view, in one dict."""
        return state(self.guest) | {f"api:{k}": repr(v) for k, v in self.view().items()}

    def key(self) -> str:
        """What a run's behaviour depends on."""
        return digest(self.end_state()) + self.guest.read("proc/sys/kernel/random/boot_id")


def new_world(root: Path) -> World:
    """A fresh guest provisioned with the old driver and joined as NODE, in a cluster where it runs a GPU pod."""
    guest = FakeGuest(root / "guest")
    cluster = FakeCluster(root / "api.json", KUBECONFIG, nodes=[NODE, OTHER])
    cluster.pods = [Pod("ml", "train-0", NODE), Pod("ml", "serve-0", OTHER)]
    cluster.save()
    cluster.install(guest)  # writes the fake API server (kubectl.py) into the shared stubs
    # Its own stub: the API server next to the guest's root, and no `exec`, so that a kill-after fault (an EXIT
    # trap in the stub's shell) still fires once kubectl's request is done.
    guest.stub_script(
        "kubectl",
        f'd=$(dirname "$PGC_ROOT"); python3 "{guest.bin}/kubectl.py" "$d/api.json" "$d/expected-kubeconfig" "$@"',
    )
    guest.stub_script("sleep", ":")  # the drain's poll between evictions and the next look: no time in the fake
    run_chain(guest, rollout_chain(rollout_spec("580.95.05")))
    assert guest.read("etc/kubernetes/kubelet.conf") == kubelet_conf(NODE)  # the join's: the node's own credential
    assert cluster.state()["events"] == []  # joined, never rolled
    return World(guest, cluster)


def invariant(world: World) -> str | None:
    """Over the API server's event log: a node is cordoned only while it holds the slot (so at most maxUnavailable
    nodes are cordoned at any time); None when it held, else where it did not."""
    out: set[str] = set()
    holder = None  # one slot (maxUnavailable 1): a lease event names its holder, a release frees it
    s = world.cluster.state()
    for i, (_, what, node) in enumerate(s["events"]):
        holder = node if what == "lease" else None if what == "release" else holder
        out = out | {node} if what == "cordon" else out - {node} if what == "uncordon" else out
        if len(out) > 1 or not out <= {holder}:
            return f"event {i} {what} {node}: cordoned {sorted(out)} while the slot is held by {holder}"
    return None if s.get("peak", 0) <= 1 else f"peak {s['peak']} nodes cordoned by a rollout"


def third_run(world: World, every: list[Step]) -> str | None:
    """Every step once more: None if none failed, changed the guest or the cluster, or scheduled a reboot."""
    before = len(world.cluster.state()["events"])
    for step in every:
        r = run(world.guest, step)
        if r.returncode != 0:
            return f"third run: {step[0]} exit {r.returncode}: {r.stderr.strip()[-400:]}"
        writes = [c for c in r.calls if c.startswith("kubectl ") and WRITES & set(c.split())]
        if mutating(r.calls) or writes or world.guest.reboot_scheduled():
            return (
                f"third run: {step[0]} changed {mutating(r.calls) + writes}, reboot: {world.guest.reboot_scheduled()}"
            )
    events = world.cluster.state()["events"][before:]
    return f"third run: API events {events}" if events else None


Select = Callable[[str, str, str], bool]
"""(step, the command at the injection point, mode) -> run this case."""


def inject(
    tmp: Path, select: Select = lambda step, command, mode: True
) -> tuple[dict[str, StepReport], dict[str, int]]:
    """Every injection point x mode of the bump's driver and verify steps (``select``-ed): a report per step, and
    how many of each step's injection points are kubectl calls."""
    every = rollout_chain(rollout_spec("580.105.08"))
    steps = [every[1], every[4]]  # the bump changes only the driver and verify steps' arguments
    ref = new_world(tmp / "ref")
    starts: list[World] = []
    calls: list[list[str]] = []
    checkpoints: list[str] = []
    for i, step in enumerate(steps):
        starts.append(ref.copy(tmp / f"start-{i}"))
        checkpoints.append(ref.key())
        calls.append(run_chain(ref.guest, [step])[0].calls)
    checkpoints.append(ref.key())
    want, view = ref.end_state(), ref.view()
    assert view["cordoned"] == [] and view["annotations"] == {} and view["slots"] == {SLOT: ""}, view
    assert view["pods"] == [f"ml/serve-0@{OTHER}"], view  # the uninterrupted run evicted the GPU pod
    assert [e[1] for e in ref.cluster.state()["events"]].count("cordon") == 1
    assert ref.guest.read("sys/module/nvidia/version").strip() == "580.105.08"
    kubectl_calls = [c for step_calls in calls for c in step_calls if c.startswith("kubectl ")]
    assert all(f"--kubeconfig {ref.guest.root}/etc/kubernetes/kubelet.conf " in c for c in kubectl_calls)
    assert [k for k in want if k.startswith("run/")] == [], list(want)  # no file under /run but the lock
    assert any(c.startswith("kubectl ") for c in calls[0]) and any(c.startswith("kubectl ") for c in calls[1])
    why = invariant(ref) or third_run(ref, every)
    assert why is None, f"the uninterrupted run: {why}"
    seen: dict[str, str | None] = {}
    lock = threading.Lock()

    def one(case: int, point: tuple[int, int, str]) -> str | None:
        """Case ``case``: step i faulted at command n in ``mode``; None when it converged, else why not."""
        i, n, mode = point
        step = steps[i]
        world = starts[i].copy(tmp / f"case-{case}")
        if mode == INSIDE_INSTALL:
            world.guest.kill_apt_after_unpack()
            faulted = run(world.guest, step)
            hit = "apt-get install (killed after unpacking)" if faulted.returncode == -9 else None
        else:
            world.guest.fault(n, mode)
            faulted = run(world.guest, step)
            hit = world.guest.fault_hit()
            world.guest.fault(None)
        if hit is None:
            return f"{step[0]} #{n} {mode}: the run never reached command {n}"
        hit = _KUBECTL_FLAGS.sub("", hit)
        if mode == "kill-after" and faulted.returncode != -9:
            return f"{step[0]} #{n} {hit!r} {mode}: the kill did not happen (exit {faulted.returncode})"
        if world.guest.reboot_scheduled():
            world.guest.reboot()
        start = i + (1 if faulted.returncode == 0 else 0)
        k = world.key() + str(start)
        with lock:
            known = k in seen
        if EXHAUSTIVE or not known:
            outcome = converge(world, steps, every, start, checkpoints, want)
            with lock:
                seen[k] = outcome
        outcome = seen[k] or invariant(world)
        shutil.rmtree(world.dir)
        return None if outcome is None else f"{step[0]} #{n} {hit!r} {mode}: {outcome}"

    cases = [
        (i, n, mode)
        for i, step in enumerate(steps)
        for n in range(1, len(calls[i]) + 1)
        for mode in FAULT_MODES
        if select(step[0], calls[i][n - 1], mode)
    ]
    installs = [any(c.startswith("apt-get") and " install " in c for c in step_calls) for step_calls in calls]
    cases += [
        (i, 0, INSIDE_INSTALL) for i in range(len(steps)) if installs[i] and select(steps[i][0], "", INSIDE_INSTALL)
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:  # the runs are subprocesses: two threads use both cores
        outcomes = list(pool.map(lambda c: one(*c), enumerate(cases)))
    reports = {step[0]: StepReport(points=len(calls[i])) for i, step in enumerate(steps)}
    for (i, _, _), outcome in zip(cases, outcomes, strict=True):
        report = reports[steps[i][0]]
        report.cases += 1
        report.converged += outcome is None
        report.failures += [outcome] if outcome else []
    kubectl = {step[0]: sum(c.startswith("kubectl ") for c in calls[i]) for i, step in enumerate(steps)}
    return reports, kubectl


def converge(
    world: World, steps: list[Step], every: list[Step], start: int, checkpoints: list[str], want: dict[str, str]
) -> str | None:
    """The next `pulumi up` from here (steps ``start``...): None when it reached ``want`` (guest and cluster) and
    a third run changes nothing, else why not."""
    for j in range(start, len(steps)):
        if not EXHAUSTIVE and world.key() == checkpoints[j]:
            return invariant(world)  # the uninterrupted run's state before step j: the rest is that run
        try:
            run_chain(world.guest, [steps[j]])
        except ChainFailed as e:
            return f"second run failed: {e}"
    got = world.end_state()
    if got != want:
        return f"end state differs: {difference(got, want)}"
    if not EXHAUSTIVE and world.key() == checkpoints[-1]:
        return invariant(world)
    return invariant(world) or third_run(world, every)


@pytest.fixture(autouse=True)
def _tools() -> None:
    # The fake kubectl and cluster.py run on the system interpreter, as python3 on an Ubuntu guest.
    external(Path("/usr/bin/python3"), "python3", "install it with: apt-get install python3")


def check(reports: dict[str, StepReport], kubectl: dict[str, int]) -> str:
    text = summary(reports) + "\nof which kubectl: " + ", ".join(f"{s}: {n}" for s, n in kubectl.items())
    print(f"driver bump with rollout\n{text}")  # the counts, with pytest -s
    assert all(r.points > 0 for r in reports.values()), text
    assert all(r.converged == r.cases for r in reports.values()), text
    return text


def test_a_driver_killed_right_after_the_drain_converges_with_the_rollout(tmp_path: Path) -> None:
    # The representative case: the node is cordoned and holds its slot, its pod is being evicted (killed before or
    # after the Eviction), the machine is not changed yet.
    reports, kubectl = inject(
        tmp_path, lambda step, command, mode: step == "driver" and "/eviction " in command and mode != "fail"
    )
    assert reports["driver"].cases == 2 and reports["verify"].cases == 0, summary(reports)
    check(reports, kubectl)


@pytest.mark.slow
def test_a_driver_bump_with_the_rollout_converges_from_every_fault(tmp_path: Path) -> None:
    reports, kubectl = inject(tmp_path)
    text = check(reports, kubectl)
    assert kubectl["driver"] > 0 and kubectl["verify"] > 0, text
    assert all(r.cases >= 3 * r.points for r in reports.values()), text
