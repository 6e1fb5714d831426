"""Fault injection over large_bar.sh (see test_host_faults.py): every stubbed call x fail/kill/kill-after, then
the next ``pulumi up``; the VM must end with the window in its config AND in its running kvm process, started as
often as in an uninterrupted run, and a third run must change nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.components.scripts.fakehost import WINDOW, FakeHost
from tests.components.scripts.test_host_faults import Step, check, harness

LARGE_BAR: Step = ("large-bar", lambda h: h.run("large_bar.sh", "2102", "65536"))


def node(args: str | None, running: bool, config_args: str | None = None) -> Callable[[Path], FakeHost]:
    def make(root: Path) -> FakeHost:
        host = FakeHost(root)
        host.vm(2102, "gpu-a100-a", args=args, running=running)
        if config_args is not None:  # the config changed after the VM started
            host.write("fake-vms/2102.conf", f"boot: order=scsi0\n{config_args}")
        return host

    return make


@pytest.mark.slow
def test_a_new_vm_created_stopped(tmp_path: Path) -> None:
    report = harness(tmp_path, node(None, running=False), [LARGE_BAR])
    check(report)
    assert report.points["large-bar"] >= 5  # id, qm config, qm set, qm status, qm start, ...


def test_a_running_vm_without_the_window(tmp_path: Path) -> None:
    check(harness(tmp_path, node(None, running=True), [LARGE_BAR]))


@pytest.mark.slow
def test_a_running_vm_whose_config_has_the_window_but_its_process_not(tmp_path: Path) -> None:
    check(harness(tmp_path, node(None, running=True, config_args=f"args: {WINDOW}\n"), [LARGE_BAR]))


@pytest.mark.slow
def test_a_running_vm_with_the_window_whose_config_lost_it(tmp_path: Path) -> None:
    check(harness(tmp_path, node(WINDOW, running=True, config_args=""), [LARGE_BAR]))
