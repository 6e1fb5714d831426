"""Fault injection over the host steps: for every stubbed command a chain of steps runs (each an injection point),
fail it, or SIGKILL the step before or after it; then run the chain again as the next ``pulumi up`` would (the
failed or killed step and those after it; a step that succeeded is not re-run), rebooting the fake whenever a
step scheduled a reboot (also when it was killed after scheduling it). The end state (files, /proc/cmdline, loaded
modules, drivers, VMs' kvm argv, number of boots) must equal an uninterrupted chain's, and a third run of every
step must change nothing and reboot nothing. Each test reports its counts per step in its assertion message."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.components.scripts.fakehost import A10, A100, OLD_KERNEL, FakeHost, mutating
from tests.components.scripts.fakeroot import FAULT_MODES, Result

Step = tuple[str, Callable[[FakeHost], Result]]


def up(host: FakeHost, steps: list[Step], start: int = 0) -> tuple[int, list[str]]:
    """One ``pulumi up`` from ``steps[start]``: (index of the step that failed or was killed, or len(steps); the
    step that ran each stubbed call, in order)."""
    owners: list[str] = []
    for i in range(start, len(steps)):
        name, run = steps[i]
        r = run(host)
        owners += [name] * len(r.calls)
        host.reboot_if_scheduled()
        if r.returncode != 0:
            return i, owners
    return len(steps), owners


@dataclass
class Report:
    boots: int = 0
    """Boots of the node in the uninterrupted chain (1: the fake's own; every faulted chain must match)."""
    points: Counter[str] = field(default_factory=Counter)
    converged: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        counts = ", ".join(
            f"{step}: {n} points x {len(FAULT_MODES)} modes, {self.converged[step]} converged, "
            f"{n * len(FAULT_MODES) - self.converged[step]} not"
            for step, n in self.points.items()
        )
        return counts + "".join(f"\n  {f}" for f in self.failures[:15])


def harness(tmp_path: Path, make: Callable[[Path], FakeHost], steps: list[Step]) -> Report:
    """Every injection point of the chain x every fault mode, each on a copy of the node ``make`` builds. Compared
    with the uninterrupted chain: right after the second up, everything but the step's own bookkeeping under
    /var/lib/proxmox-gpu-cluster (a re-run host prep clears a reboot record the uninterrupted chain, which does
    not re-run it, keeps until its next run); after the third run, everything."""
    template = make(tmp_path / "template")
    ref = template.clone(tmp_path / "ref")
    end, owners = up(ref, steps)
    expected = ref.state()
    for _, run in steps:
        run(ref)
    settled = ref.state()
    report = Report(boots=ref.boots, points=Counter(owners))

    def case(n: int, mode: str) -> list[str]:
        host = template.clone(tmp_path / f"{n}-{mode}")
        host.fault(n, mode)
        first, _ = up(host, steps)
        hit = host.fault_hit()
        host.fault(None)
        second = up(host, steps, first)[0] if first < len(steps) else first
        problems = []
        if second != end:
            problems.append(f"the second up ended at step {second}, an uninterrupted one at {end}")
        problems += differences(expected, host.state(), "after the second up", BOOKKEEPING)
        for name, run in steps:
            r = run(host)
            if mutating(r.calls) or host.reboot_if_scheduled():
                problems.append(f"third run of {name}: {mutating(r.calls)}, stdout {r.stdout.strip()!r}")
        problems += differences(settled, host.state(), "after the third run")
        return [f"#{n} {mode} at {hit!r}: " + "; ".join(problems)] if problems else []

    # The cases are independent (each its own copy of the node): two at a time, as the steps are subprocesses.
    cases = [(n, mode) for n in range(1, len(owners) + 1) for mode in FAULT_MODES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for (n, _), problems in zip(cases, pool.map(lambda c: case(*c), cases), strict=True):
            owner = owners[n - 1]
            if problems:
                report.failures += [f"{owner} {p}" for p in problems]
            else:
                report.converged[owner] += 1
    return report


BOOKKEEPING = "var/lib/proxmox-gpu-cluster/"


def differences(expected: dict[str, object], seen: dict[str, object], when: str, ignore: str = "\0") -> list[str]:
    files = expected["files"], seen["files"]
    assert isinstance(files[0], dict) and isinstance(files[1], dict)
    diff = {k for k in expected if k != "files" and seen[k] != expected[k]}
    diff |= {f for f in files[0].keys() | files[1].keys() if files[0].get(f) != files[1].get(f)}
    diff = {d for d in diff if not d.startswith(ignore)}
    return [f"{when}, the state differs in {sorted(diff)}"] if diff else []


def check(report: Report) -> None:
    assert not report.failures and sum(report.points.values()) > 0, report.summary()
    print(report.summary())  # the counts, with pytest -s


PREP: Step = ("host-prep", lambda h: h.prep(A10, A100))
VERIFY: Step = ("host-verify", lambda h: h.verify(A10[0], A100[0]))


def old_intel(root: Path) -> FakeHost:
    """Intel on Proxmox VE 8.1's kernel 6.5: the IOMMU is off until intel_iommu=on, so host prep reboots once."""
    return FakeHost(root, cpu="intel", kernel=OLD_KERNEL)


def test_fresh_intel_node_before_6_8_when_idle(tmp_path: Path) -> None:
    report = harness(tmp_path, old_intel, [PREP, VERIFY])
    check(report)
    assert report.boots == 2  # exactly one reboot, in every faulted chain too
    assert report.points["host-prep"] >= 5 and report.points["host-verify"] >= 2


@pytest.mark.slow
def test_fresh_amd_node_binds_at_runtime_and_never_reboots(tmp_path: Path) -> None:
    report = harness(tmp_path, FakeHost, [PREP, VERIFY])
    check(report)
    assert report.boots == 1  # the IOMMU is on by default: no reboot in any chain
    assert report.points["host-prep"] >= 6  # the runtime binding's sysfs writes are injection points too


def old_way_with_a_console_gpu(root: Path) -> FakeHost:
    from tests.components.scripts.test_host_iommu import prepared_the_old_way

    return prepared_the_old_way(root)


@pytest.mark.slow
def test_a_host_prepared_the_old_way_converges_without_a_reboot(tmp_path: Path) -> None:
    report = harness(tmp_path, old_way_with_a_console_gpu, [PREP, VERIFY])
    check(report)
    assert report.boots == 2  # the fixture's two boots: none from host prep


def zfs_node_with_a_running_vm(root: Path) -> FakeHost:
    host = old_intel(root)
    host.proxmox_boot("uefi")
    host.guests("VM 3101 gpu-a10-a running", "CT 200 dns running")
    return host


@pytest.mark.slow
def test_always_reboots_a_busy_systemd_boot_node(tmp_path: Path) -> None:
    prep: Step = ("host-prep", lambda h: h.prep(A10, policy="always"))
    report = harness(tmp_path, zfs_node_with_a_running_vm, [prep, ("host-verify", lambda h: h.verify(A10[0]))])
    check(report)
    assert report.boots == 3  # the fixture's own boots, then the one reboot


def zfs_node_on_legacy_bios(root: Path) -> FakeHost:
    """ZFS on legacy BIOS: proxmox-boot-tool with GRUB on the ESP, regenerated from /etc/default/grub by refresh."""
    host = old_intel(root)
    host.proxmox_boot("bios")
    return host


@pytest.mark.slow
def test_a_zfs_node_on_legacy_bios_reboots_once_into_the_arguments(tmp_path: Path) -> None:
    report = harness(tmp_path, zfs_node_on_legacy_bios, [PREP, VERIFY])
    check(report)
    assert report.boots == 3  # the fixture's own boots, then the one reboot, in every faulted chain too


def prepared_with_a_running_worker(root: Path) -> FakeHost:
    host = old_intel(root)
    assert host.prep(A10).returncode == 0
    host.reboot()
    host.guests("VM 3101 gpu-a10-a running")
    return host


@pytest.mark.slow
def test_a_new_gpu_on_a_busy_node_is_bound_live_and_when_idle_never_reboots_it(tmp_path: Path) -> None:
    report = harness(tmp_path, prepared_with_a_running_worker, [PREP, VERIFY])
    check(report)
    assert report.boots == 2  # the fake's first boot and the one after preparing the A10: none for the A100
    assert report.points["host-prep"] >= 6  # the runtime binding's sysfs writes are injection points too


def busy(root: Path) -> FakeHost:
    host = old_intel(root)
    host.guests("VM 3101 gpu-a10-a running", "CT 200 dns running")
    return host


@pytest.mark.slow
def test_when_idle_never_reboots_a_busy_node(tmp_path: Path) -> None:
    report = harness(tmp_path, busy, [PREP, VERIFY])
    check(report)  # the reference ends with host prep refusing; so does every faulted chain, without a reboot
    assert report.boots == 1


@pytest.mark.slow
def test_never_leaves_the_reboot_to_the_operator(tmp_path: Path) -> None:
    check(harness(tmp_path, old_intel, [("host-prep", lambda h: h.prep(A10, A100, policy="never")), VERIFY]))


@pytest.mark.slow
def test_iommu_pt_asked_on_an_amd_node_reboots_once(tmp_path: Path) -> None:
    prep: Step = ("host-prep", lambda h: h.prep(A10, A100, pt=True))
    report = harness(tmp_path, FakeHost, [prep, ("host-verify", lambda h: h.verify(A10[0], A100[0], pt=True))])
    check(report)
    assert report.boots == 2


DEV, PROD = "dev-1a2b3c4d", "prod-5e6f7a8b"
"""Two owners of one node (two stacks, or two clusters of one program): dev passes the A10 through, prod the A100."""


def dev_prepared(root: Path) -> FakeHost:
    """The Intel node on kernel 6.5 after dev's host prep and its reboot (intel_iommu=on)."""
    host = old_intel(root)
    assert host.prep(A10, owner=DEV).returncode == 0 and host.reboot_if_scheduled()
    return host


@pytest.mark.slow
def test_a_second_owner_joins_a_prepared_node(tmp_path: Path) -> None:
    # prod's run composes both claims and binds the A100 at runtime (no reboot); every fault is injected into prod's
    # run (and verify); dev's next run (its next pulumi up) then finds nothing to change.
    steps: list[Step] = [
        ("host-prep (second owner)", lambda h: h.prep(A100, owner=PROD)),
        ("host-verify", lambda h: h.verify(A10[0], A100[0])),
        ("host-prep (first owner again)", lambda h: h.prep(A10, owner=DEV)),
    ]
    report = harness(tmp_path, dev_prepared, steps)
    check(report)
    assert report.boots == 2  # the fake's boot and dev's reboot: none for prod
    assert report.points["host-prep (second owner)"] >= 5 and not report.points["host-prep (first owner again)"]


@pytest.mark.slow
def test_a_second_owner_wanting_iommu_pt_reboots_the_node_once(tmp_path: Path) -> None:
    steps: list[Step] = [
        ("host-prep (second owner)", lambda h: h.prep(A100, owner=PROD, pt=True)),
        ("host-verify", lambda h: h.verify(A10[0], A100[0], pt=True)),
        ("host-prep (first owner again)", lambda h: h.prep(A10, owner=DEV)),
    ]
    report = harness(tmp_path, dev_prepared, steps)
    check(report)
    assert report.boots == 3  # the fake's boot, dev's reboot, prod's reboot for iommu=pt
    assert report.points["host-prep (second owner)"] >= 5 and not report.points["host-prep (first owner again)"]


def both_prepared(root: Path) -> FakeHost:
    host = dev_prepared(root)
    assert host.prep(A100, owner=PROD).returncode == 0
    return host


@pytest.mark.slow
def test_a_release_then_the_other_owners_run(tmp_path: Path) -> None:
    # prod's claim released (its destroy): dev's next run drops the A100 from vfio.conf and the blacklist goes.
    steps: list[Step] = [
        ("release (second owner)", lambda h: h.release(PROD)),
        ("host-prep (first owner)", lambda h: h.prep(A10, owner=DEV)),
        ("host-verify", lambda h: h.verify(A10[0])),
    ]
    report = harness(tmp_path, both_prepared, steps)
    check(report)
    assert report.boots == 2 and report.points["host-prep (first owner)"] >= 1
