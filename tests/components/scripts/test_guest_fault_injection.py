"""Every guest bootstrap step converges from any state a fault leaves (see guest_harness.py): a first install with
the host driver, a driver bump on a joined node, a KubeVirt (vfio) guest. One test per scenario runs every step's
injection points in every mode; its message counts points, cases and converged ones per step (slow: `make
test-all`; ``PGC_FAULT_EXHAUSTIVE=1`` runs every case's whole second and third run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.render.guest_scripts import driver_args, join_args, runtime_args, verify_args
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.guest_harness import Scenario, Step, inject, run_chain, summary
from tests.components.scripts.test_guest_bootstrap_scripts import SECRETS, spec
from tests.components.scripts.test_guest_vfio import kubevirt_spec


def chain(b: GuestBootstrapSpec) -> list[Step]:
    return [
        ("cloud-init", [], None),
        ("driver", driver_args(b), None),
        ("runtime", runtime_args(b), None),
        ("join", join_args(b), SECRETS),
        ("verify", verify_args(b), None),
    ]


def check(scenario: Scenario, tmp: Path) -> None:
    reports = inject(scenario, tmp)
    text = summary(reports)
    print(f"{scenario.name}\n{text}")  # the counts, with pytest -s
    assert all(r.points > 0 for r in reports.values()), text
    assert all(r.converged == r.cases for r in reports.values()), text


@pytest.mark.slow
def test_a_first_install_with_the_host_driver_converges_from_every_fault(tmp_path: Path) -> None:
    steps = chain(spec())
    check(Scenario("first install", steps, steps), tmp_path)


@pytest.mark.slow
def test_a_driver_bump_on_a_joined_node_converges_from_every_fault(tmp_path: Path) -> None:
    def provisioned(guest: FakeGuest) -> None:
        run_chain(guest, chain(spec()))

    bumped = chain(spec(driverVersion="580.105.08"))
    # Only the driver and verify steps' arguments change: the next `pulumi up` runs those two.
    check(Scenario("driver bump", [bumped[1], bumped[4]], bumped, provisioned), tmp_path)


@pytest.mark.slow
def test_a_kubevirt_guest_converges_from_every_fault(tmp_path: Path) -> None:
    steps = chain(kubevirt_spec())
    check(Scenario("vfio guest", steps, steps), tmp_path)
