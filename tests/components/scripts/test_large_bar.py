"""large_bar.sh against FakeHost's stateful ``qm`` (the kvm process's argv in /proc/<pid>/cmdline): a new VM
(created stopped) gets the OVMF MMIO window and then its first start, so it boots once; a running VM whose kvm
process lacks the window is restarted once, even when its config already has it (never "unchanged"); a running VM
that has it is left alone; a DHCP worker's address comes from the guest agent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.components.scripts.fakehost import WINDOW, FakeHost, mutating
from tests.support import external


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    h = FakeHost(tmp_path / "root")
    h.vm(2102, "gpu-a100-a")  # stopped, without args: as the provider creates a large-BAR worker in token mode
    return h


def qm_changes(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("qm") and not c.startswith(("qm config", "qm status"))]


def test_a_new_vm_gets_the_window_before_its_first_start(host: FakeHost) -> None:
    first = host.run("large_bar.sh", "2102", "65536")
    assert first.returncode == 0, first.stderr
    assert first.stdout == "large-bar: set; first start\n"
    assert f"args: {WINDOW}\n" in host.read("fake-vms/2102.conf")
    assert WINDOW in (host.running_args(2102) or "")
    assert qm_changes(first.calls) == [f"qm set 2102 --args {WINDOW}", "qm start 2102"]  # no shutdown: one boot
    second = host.run("large_bar.sh", "2102", "65536")
    assert second.returncode == 0 and second.stdout == "large-bar: unchanged\n"
    assert mutating(second.calls) == []


def test_a_running_vm_that_lost_the_window_restarts_once(host: FakeHost) -> None:
    host.vm(2102, "gpu-a100-a", running=True)
    r = host.run("large_bar.sh", "2102", "65536")
    assert r.returncode == 0 and r.stdout == "large-bar: set and restarted\n"
    assert qm_changes(r.calls) == [f"qm set 2102 --args {WINDOW}", "qm shutdown 2102 --timeout 180", "qm start 2102"]
    assert WINDOW in (host.running_args(2102) or "")


def test_a_running_vm_whose_config_has_the_window_but_its_process_not_is_restarted(host: FakeHost) -> None:
    # e.g. a run killed between qm set and the restart: the config says yes, the running QEMU says no
    host.vm(2102, "gpu-a100-a", running=True)
    host.write("fake-vms/2102.conf", f"boot: order=scsi0\nargs: {WINDOW}\n")
    assert WINDOW not in (host.running_args(2102) or "") and WINDOW in host.run_quietly("qm", "showcmd", "2102")
    r = host.run("large_bar.sh", "2102", "65536")
    assert r.returncode == 0 and r.stdout == "large-bar: restarted (it ran without the MMIO window)\n"
    assert qm_changes(r.calls) == ["qm shutdown 2102 --timeout 180", "qm start 2102"]
    assert WINDOW in (host.running_args(2102) or "")


def test_a_running_vm_with_the_window_whose_config_lost_it_is_not_restarted(host: FakeHost) -> None:
    host.vm(2102, "gpu-a100-a", args=WINDOW, running=True)
    host.write("fake-vms/2102.conf", "boot: order=scsi0\n")
    r = host.run("large_bar.sh", "2102", "65536")
    assert r.returncode == 0 and r.stdout == "large-bar: set (it already runs with it)\n"
    assert qm_changes(r.calls) == [f"qm set 2102 --args {WINDOW}"]


def test_a_shutdown_that_times_out_falls_back_to_stop(host: FakeHost) -> None:
    host.vm(2102, "gpu-a100-a", running=True)
    host.prepend("qm", '[ "$1" = shutdown ] && { echo "VM quit/powerdown failed - got timeout" >&2; exit 255; }')
    r = host.run("large_bar.sh", "2102", "65536")
    assert r.returncode == 0 and r.stdout == "large-bar: set and restarted\n"
    assert "qm stop 2102" in r.calls and WINDOW in (host.running_args(2102) or "")


def test_a_missing_vm_and_a_failing_start_say_where(host: FakeHost) -> None:
    r = host.run("large_bar.sh", "2103", "65536")
    assert r.returncode == 1 and r.stderr == (
        "large-bar: config: expected the config of VM 2103 (qm config), saw "
        "'Configuration file 'nodes/pve1/qemu-server/2103.conf' does not exist'\n"
    )
    host.fault(3)  # qm set, qm status... : id -u, qm config, qm set
    r = host.run("large_bar.sh", "2102", "65536")
    assert r.returncode == 1 and host.fault_hit() == f"qm set 2102 --args {WINDOW}"
    assert r.stderr.splitlines()[-1] == (
        'large-bar: qm set "$vmid" --args "$wanted" 1>&2 failed: expected exit 0, saw exit 1'
    )


def test_a_dhcp_worker_reports_the_address_the_agent_sees(host: FakeHost) -> None:
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


def test_bad_arguments_and_no_root_are_refused(host: FakeHost) -> None:
    assert host.run("large_bar.sh", "21;02", "65536").stderr == "large-bar: vmid: expected a number, saw '21;02'\n"
    host.stub("id", "1000")
    r = host.run("large_bar.sh", "2102", "65536")
    assert r.returncode == 1 and r.stderr.startswith("large-bar: user: expected root (qm set --args is root-only)")
    assert "saw uid 1000" in r.stderr and "authMode: password" in r.stderr
