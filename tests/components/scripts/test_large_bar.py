"""large_bar.sh with a stateful fake `qm`: a new VM (created stopped) gets the OVMF MMIO window and then its first
start, so it boots once; a running VM that lost the window is restarted once; a DHCP worker's address comes from
the guest agent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.components.scripts.fakeroot import FakeRoot
from tests.support import external

QM = """
state="$PGC_ROOT/vm-args" status="$PGC_ROOT/vm-status"
case "$1" in
config) echo "boot: order=scsi0"; if [ -f "$state" ]; then echo "args: $(cat "$state")"; fi ;;
set) printf '%s' "$4" > "$state" ;;
status) echo "status: $(cat "$status")" ;;
start) echo running > "$status" ;;
shutdown|stop) echo stopped > "$status" ;;
guest) cat "$PGC_ROOT/agent.json" 2>/dev/null || { echo "QEMU guest agent is not running" >&2; exit 2; } ;;
esac
"""
WINDOW = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=65536"


@pytest.fixture
def host(tmp_path: Path) -> FakeRoot:
    h = FakeRoot(tmp_path / "root")
    h.stub_script("qm", QM)
    h.stub("id", "0")
    h.write("vm-status", "stopped\n")  # as the provider creates a large-BAR worker in token mode
    return h


def qm_changes(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("qm") and not c.startswith(("qm config", "qm status"))]


def test_a_new_vm_gets_the_window_before_its_first_start(host: FakeRoot) -> None:
    first = host.run("large_bar.sh", "2102", "65536")
    assert first.returncode == 0, first.stderr
    assert first.stdout == "large-bar: set; first start\n"
    assert host.read("vm-args") == WINDOW and host.read("vm-status").strip() == "running"
    assert qm_changes(first.calls) == [f"qm set 2102 --args {WINDOW}", "qm start 2102"]  # no shutdown: one boot
    second = host.run("large_bar.sh", "2102", "65536")
    assert second.returncode == 0 and second.stdout == "large-bar: unchanged\n"
    assert qm_changes(second.calls) == []


def test_a_running_vm_that_lost_the_window_restarts_once(host: FakeRoot) -> None:
    host.write("vm-status", "running\n")
    r = host.run("large_bar.sh", "2102", "65536")
    assert r.returncode == 0 and r.stdout == "large-bar: set and restarted\n"
    assert qm_changes(r.calls) == [f"qm set 2102 --args {WINDOW}", "qm shutdown 2102 --timeout 180", "qm start 2102"]


def test_a_dhcp_worker_reports_the_address_the_agent_sees(host: FakeRoot) -> None:
    external(Path("/usr/bin/perl"), "perl", "install it with: apt-get install perl")
    interfaces = [
        {"name": "lo", "ip-addresses": [{"ip-address-type": "ipv4", "ip-address": "127.0.0.1"}]},
        {"name": "eth0", "ip-addresses": [{"ip-address-type": "ipv6", "ip-address": "fe80::1"},
                                          {"ip-address-type": "ipv4", "ip-address": "10.20.0.57"}]},
    ]  # fmt: skip
    host.write("agent.json", json.dumps(interfaces))
    r = host.run("large_bar.sh", "2102", "65536", "--address")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["large-bar: set; first start", "address: 10.20.0.57"]


def test_bad_arguments_and_no_root_are_refused(host: FakeRoot) -> None:
    assert "vmid: expected a number" in host.run("large_bar.sh", "21;02", "65536").stderr
    host.stub("id", "1000")
    r = host.run("large_bar.sh", "2102", "65536")
    assert r.returncode == 1 and "needs root" in r.stderr and "authMode: password" in r.stderr
