"""Fault injection over a first provisioning's MIG mode in operator driver mode (test_mig_mode_operator.py): the
guest's MIG begin step, the Proxmox-side mig-restart step (its own commands, and its guest side: the guest's MIG
step it runs through ``qm guest exec``) and the guest's MIG end step, each failed or killed (SIGKILL of its process
group) at every stubbed command it runs, then the chain run again as the next ``pulumi up`` would (a step that
passed is not run again; the failed step and those after it are). The operator's driver container and mig-manager
live on in the guest's time meanwhile. Asserted: the end state equals an uninterrupted run's (one VM restart, the
mode applied, mig-manager's success, the node schedulable, no annotation or marker left, the workload pod evicted
and the VM never stopped while the node ran it or held no rollout slot), and a third run of every step changes
nothing and restarts nothing. Also for a joined worker keeping its label whose driver container is down as the
change begins (its restart step holds the node)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.components.scripts.fakemig import exec_fault
from tests.components.scripts.fakeroot import FAULT_MODES, FakeRoot
from tests.components.scripts.test_mig_mode_operator import STEPS, WANT, Chain
from tests.support import external

SIDES = [("begin", "guest"), ("restart", "host"), ("restart", "guest-exec"), ("end", "guest")]
# first: a first provisioning with a workload pod landed since the join; joined: a worker keeping its label whose
# driver container is down as the change begins. In both the restart step holds the node (slot, cordon, drain).
CASES = [(case, step, side) for case in ("first", "joined") for step, side in SIDES]


@pytest.fixture(autouse=True)
def _tools() -> None:
    external(Path("/usr/bin/python3"), "python3", "install it with: apt-get install python3")
    external(Path("/usr/bin/perl"), "perl", "install it with: apt-get install perl")


def inject(chain: Chain, step: str, side: str, at: int | None, mode: str) -> FakeRoot:
    """Arm (or, with None, disarm) the fault; the machine whose ``fault_hit`` tells what it hit."""
    if side == "guest-exec":
        exec_fault(chain.guest, at, mode)
        return chain.guest
    machine = chain.host if side == "host" else chain.guest
    machine.fault(at, mode)
    return machine


def converge(chain: Chain, start: int) -> list[str]:
    """Run the chain from step ``start`` as the next pulumi up would; the failure of that run, if any."""
    for step in STEPS[start:]:
        result = chain.run(step)
        if result.returncode:
            return [f"{step}: {result.stderr.strip()}"]
    return []


@pytest.mark.slow
@pytest.mark.parametrize(("case", "step", "side"), CASES, ids=[f"{c}-{s}-{side}" for c, s, side in CASES])
def test_every_fault_on_the_operator_mode_path_converges(tmp_path: Path, case: str, step: str, side: str) -> None:
    joined = case == "joined"
    clean = Chain(tmp_path / "clean", joined=joined)
    assert converge(clean, 0) == [] and clean.end_state() == WANT
    index = STEPS.index(step)
    points = converged = 0
    bad: list[str] = []
    for mode in FAULT_MODES:
        n = 0
        while True:
            n += 1
            chain = Chain(tmp_path / f"{mode}-{n}", joined=joined)
            assert all(chain.run(s).returncode == 0 for s in STEPS[:index])
            machine = inject(chain, step, side, n, mode)
            chain.run(step)
            hit = machine.fault_hit()
            inject(chain, step, side, None, mode)
            if hit is None:
                break
            points += 1
            failures = converge(chain, index)
            third = chain.third()
            if failures or chain.end_state() != WANT or third:
                bad.append(f"{mode} at {n} ({hit}): {failures or third or chain.end_state()}")
            else:
                converged += 1
    report = f"{case} {step} ({side}): {converged}/{points} injection points converged"
    print(report)
    assert points > 0 and not bad, report + "\n" + "\n".join(bad)
