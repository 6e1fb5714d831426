"""Fault-injection harness for the guest bootstrap chain (cloud-init -> driver -> [reboot] -> runtime -> join ->
verify) against a FakeGuest.

For every step of a scenario and every stubbed command that step runs (its injection points, counted in an
uninterrupted run), in each mode of ``FakeRoot.fault`` (fail, kill, kill-after): start from the state the step
starts from, run it with the fault, reboot if a reboot was scheduled (a reboot scheduled before a kill still
happens), then run the chain again as the next ``pulumi up`` would: a step that succeeded is not run again, the
faulted one (if it failed) and every later one are, rebooting whenever a step scheduled it. Every step of that
second run must succeed; the end state (files, the running kernel's command line, loaded modules and versions,
device bindings, containerd's running config, holds, join state) must equal an uninterrupted run's; then every
step runs once more and must make no mutating call and schedule no reboot. A step that installs packages gets one
more case: its first ``apt-get install`` killed between unpacking and configuring.

Runs are deterministic functions of the guest's state (files, running state and boot id; not the lock's holder pid
or kubeadm's note of a temp file's name), and the harness uses it twice, to stay within the suite's time:
- a fault that leaves the same state as an earlier one (say ``kill`` at command n and ``kill-after`` at n-1 with
  nothing written in between) has the same outcome: it is counted as its own case but checked once;
- a second run that reaches exactly the state the uninterrupted run had before step k has converged: from there on
  it IS the uninterrupted run (whose end state and third run are checked once). Otherwise the second run goes on to
  the end, its end state is compared and every step runs a third time.
``PGC_FAULT_EXHAUSTIVE=1`` turns both off: every case runs its whole second and third run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.components.scripts.fakeguest import FakeGuest, mutating
from tests.components.scripts.fakeroot import FAULT_MODES, Result

Step = tuple[str, list[str], dict[str, str] | None]
"""A step's name, its arguments and the secrets on its stdin (None: none)."""
# Harness bookkeeping and what is volatile by nature (boot ids, the lock's holder pid, kubeadm's copy of the path
# of the join configuration, a temporary name): left out of the end-state comparison.
_VOLATILE = ("fake-boots", "proc/sys/kernel/random/boot_id", "join-config-path", "run/lock/")


def state(guest: FakeGuest, *, volatile: bool = False) -> dict[str, str]:
    """Every file (and symlink, as ``-> target``) under the guest's root but the stubs and the call log; without
    the volatile entries unless ``volatile``."""
    out: dict[str, str] = {}
    for path in sorted(guest.root.rglob("*")):
        rel = str(path.relative_to(guest.root))
        if rel.startswith(("_stubs", "calls.log", "fault.")) or (not volatile and rel.startswith(_VOLATILE)):
            continue
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = path.read_text()
    return out


def digest(values: dict[str, str]) -> str:
    h = hashlib.sha256()
    for key, value in values.items():
        h.update(f"{key}\0{value}\0".encode())
    return h.hexdigest()


class ChainFailed(Exception):
    pass


def run(guest: FakeGuest, step: Step) -> Result:
    name, args, secrets = step
    return guest.step(name, *args, secrets=secrets)


def run_chain(guest: FakeGuest, steps: list[Step]) -> list[Result]:
    """Run ``steps`` in order, each must succeed; reboot after any that scheduled a reboot."""
    results = []
    for step in steps:
        r = run(guest, step)
        if r.returncode != 0:
            raise ChainFailed(f"{step[0]} exit {r.returncode}: {r.stderr.strip()[-600:]}")
        results.append(r)
        if guest.reboot_scheduled():
            guest.reboot()
    return results


def idempotent(guest: FakeGuest, steps: list[Step]) -> str | None:
    """Run every step once more: None if none failed, made a mutating call or scheduled a reboot, else why."""
    for step in steps:
        r = run(guest, step)
        if r.returncode != 0:
            return f"third run: {step[0]} exit {r.returncode}: {r.stderr.strip()[-400:]}"
        if mutating(r.calls) or guest.reboot_scheduled():
            return f"third run: {step[0]} changed {mutating(r.calls)}, reboot scheduled: {guest.reboot_scheduled()}"
    return None


def difference(got: dict[str, str], want: dict[str, str]) -> str:
    keys = sorted(k for k in got.keys() | want.keys() if got.get(k) != want.get(k))
    return "; ".join(f"{k}: {want.get(k)!r} -> {got.get(k)!r}"[:300] for k in keys[:4])


@dataclass
class Scenario:
    name: str
    chain: list[Step]
    """The steps a `pulumi up` runs, in order."""
    every: list[Step]
    """Every step of the node with the scenario's arguments: the third run."""
    prepare: Callable[[FakeGuest], None] = lambda guest: None
    """Brings a fresh guest to the scenario's starting state."""


@dataclass
class StepReport:
    points: int = 0
    """Stubbed commands the step runs (injection points); cases: points x modes (+1 inside apt-get install)."""
    cases: int = 0
    converged: int = 0
    failures: list[str] = field(default_factory=list)


EXHAUSTIVE = os.environ.get("PGC_FAULT_EXHAUSTIVE") == "1"
INSIDE_INSTALL = "kill-inside-install"
"""One more case for a step that installs packages: its first apt-get install killed between unpacking and
configuring (dpkg iU, no module built), which no stub boundary reaches."""


def key(guest: FakeGuest) -> str:
    """What a run's behaviour depends on: the state and the boot id."""
    return digest(state(guest)) + guest.read("proc/sys/kernel/random/boot_id")


def inject(scenario: Scenario, tmp: Path) -> dict[str, StepReport]:
    """Every injection point x mode of every step of ``scenario``; a report per step."""
    base = FakeGuest(tmp / "base")
    scenario.prepare(base)
    ref = FakeGuest.copy(base, tmp / "ref")
    starts: list[FakeGuest] = []
    points: list[int] = []
    checkpoints: list[str] = []
    installs: list[bool] = []
    for i, step in enumerate(scenario.chain):
        starts.append(FakeGuest.copy(ref, tmp / f"start-{i}"))
        checkpoints.append(key(ref))
        calls = run_chain(ref, [step])[0].calls
        points.append(len(calls))
        installs.append(any(c.startswith("apt-get") and " install " in c for c in calls))
    checkpoints.append(key(ref))
    want = state(ref)
    why = idempotent(ref, scenario.every)
    assert why is None, f"{scenario.name}: the uninterrupted run is not idempotent: {why}"
    seen: dict[str, str | None] = {}
    lock = threading.Lock()

    def one(i: int, n: int, mode: str, case: int) -> str | None:
        """Case ``case``: step i faulted at command n in ``mode``; None when it converged, else why not."""
        step = scenario.chain[i]
        guest = FakeGuest.copy(starts[i], tmp / f"case-{case}")
        if mode == INSIDE_INSTALL:
            guest.kill_apt_after_unpack()
            faulted = run(guest, step)
            hit = "apt-get install (killed after unpacking)" if faulted.returncode == -9 else None
        else:
            guest.fault(n, mode)
            faulted = run(guest, step)
            hit = guest.fault_hit()
            guest.fault(None)
        if hit is None:
            return f"{step[0]} #{n} {mode}: the run never reached command {n}"
        if guest.reboot_scheduled():
            guest.reboot()
        start = i + (1 if faulted.returncode == 0 else 0)
        k = key(guest) + str(start)
        with lock:
            known = k in seen
        if EXHAUSTIVE or not known:
            outcome = converge(guest, scenario, start, checkpoints, want)
            with lock:
                seen[k] = outcome
        shutil.rmtree(guest.root)
        return None if seen[k] is None else f"{step[0]} #{n} {hit!r} {mode}: {seen[k]}"

    cases = [(i, n, mode) for i in range(len(scenario.chain)) for n in range(1, points[i] + 1) for mode in FAULT_MODES]
    cases += [(i, 0, INSIDE_INSTALL) for i in range(len(scenario.chain)) if installs[i]]
    # Two at a time: the runs are subprocesses, so threads use both cores.
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(lambda c: one(*c[1], c[0]), enumerate(cases)))
    reports = {step[0]: StepReport(points=points[i]) for i, step in enumerate(scenario.chain)}
    for (i, _, _), outcome in zip(cases, outcomes, strict=True):
        report = reports[scenario.chain[i][0]]
        report.cases += 1
        if outcome is None:
            report.converged += 1
        else:
            report.failures.append(outcome)
    return reports


def converge(
    guest: FakeGuest, scenario: Scenario, start: int, checkpoints: list[str], want: dict[str, str]
) -> str | None:
    """The next `pulumi up` from here (steps ``start``...): None when it converged to ``want`` and a third run
    changes nothing, else why not."""
    for j in range(start, len(scenario.chain)):
        if not EXHAUSTIVE and key(guest) == checkpoints[j]:
            return None  # the uninterrupted run's state before step j: the rest is that run
        try:
            run_chain(guest, [scenario.chain[j]])
        except ChainFailed as e:
            return f"second run failed: {e}"
    got = state(guest)
    if got != want:
        return f"end state differs: {difference(got, want)}"
    if not EXHAUSTIVE and key(guest) == checkpoints[-1]:
        return None
    return idempotent(guest, scenario.every)


def summary(reports: dict[str, StepReport]) -> str:
    lines = [f"{s}: {r.points} points, {r.cases} cases, {r.converged} converged" for s, r in reports.items()]
    for r in reports.values():
        lines += r.failures[:8]
    return "\n".join(lines)
