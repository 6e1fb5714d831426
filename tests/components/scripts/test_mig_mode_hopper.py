"""Hopper's MIG mode is not persistent (issue 34, item 4): on H100/H200 enabling MIG mode needs no GPU reset and is
lost at every reboot, driver reload or VM restart (NVIDIA MIG User Guide, "Enable MIG Mode": on Hopper and later
"MIG mode ... does not persist across reboots" and needs no reset; "GPU Reset on Hopper+"); on A100/A30 it waits
for a GPU reset and then persists ("Deployment Considerations"). The contract of the fake NVML (fakemig.py) for both,
then the guest: with the host driver the MIG step installs a boot unit that sets the wanted mode before kubelet
starts (guest_mig_mode.sh mig_mode_boot); with the operator's driver container mig-manager restores it at its start.
"""

from __future__ import annotations

import subprocess

from tests.components.scripts import test_mig_mode as base
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakekube import FakeCluster
from tests.components.scripts.fakemig import install_mig, mig_manager, mig_state, restarts
from tests.components.scripts.fakeroot import FakeRoot
from tests.components.scripts.test_mig_mode import NEW, NODE, label_patch, phase, restart

# The A100 worker of test_mig_mode.py (joined, host driver, a fake cluster and its Proxmox node).
_tools, cluster, guest, host = base._tools, base.cluster, base.guest, base.host

UNIT = "etc/systemd/system/proxmox-gpu-cluster-mig-mode.service"


def smi(guest: FakeGuest, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PGC_ROOT": str(guest.root), "PATH": f"{guest.bin}:/usr/bin:/bin"}
    return subprocess.run([str(guest.bin / "nvidia-smi"), *args], env=env, capture_output=True, text=True, check=False)


def boot(guest: FakeGuest) -> None:
    """The guest reboots: the host driver loads (udev, for the NVIDIA GPU), then systemd starts the enabled units
    that are WantedBy=multi-user.target (systemd.unit(5), [Install]; `systemctl enable` links them there) in their
    Before=/After= order; the project's MIG unit is ordered before containerd and kubelet, which start after it."""
    guest.reboot()
    guest.write("sys/module/nvidia/version", "580.95.05\n")
    enabled = guest.root / "fake-systemd-enabled"
    env = {"PGC_ROOT": str(guest.root), "PATH": f"{guest.bin}:/usr/bin:/bin"}
    for unit in enabled.read_text().split() if enabled.exists() else []:
        path = guest.root / f"etc/systemd/system/{unit}.service"
        for line in path.read_text().splitlines() if path.exists() else []:
            if line.startswith("ExecStart="):
                command = guest.root / line.removeprefix("ExecStart=").lstrip("/")
                subprocess.run(["sh", str(command)], env=env, check=True, capture_output=True)


def test_contract_hopper_applies_at_once_and_forgets_at_every_boot(guest: FakeGuest, host: FakeRoot) -> None:
    install_mig(guest, {0: "Disabled", 1: "[N/A]"}, hopper=True)
    r = smi(guest, "-i", "0", "-mig", "1")
    # No reset needed on Hopper: NVML reports the mode current at once (nvidia-smi: "Enabled MIG Mode for GPU").
    assert r.returncode == 0 and r.stdout.startswith("Enabled MIG Mode for GPU 00000000:01:00.0")
    assert mig_state(guest)[0] == ("Enabled", "Enabled")
    boot(guest)  # a reboot of the guest: gone
    assert mig_state(guest)[0] == ("Disabled", "Disabled") and mig_state(guest)[1] == ("[N/A]", "[N/A]")
    assert smi(guest, "-i", "0", "-mig", "1").returncode == 0
    for command in (["shutdown", "210"], ["start", "210"]):  # a VM restart from Proxmox: gone too
        subprocess.run([str(host.bin / "qm"), *command], env={"PGC_ROOT": str(host.root)}, check=True)
    assert restarts(host) == 1 and mig_state(guest)[0] == ("Disabled", "Disabled")


def test_contract_ampere_waits_for_a_reset_and_keeps_the_mode(guest: FakeGuest, host: FakeRoot) -> None:
    r = smi(guest, "-i", "0", "-mig", "1")  # the fixture's A100
    assert r.returncode == 0 and "Warning: MIG mode is in pending enable state" in r.stdout
    assert mig_state(guest)[0] == ("Disabled", "Enabled")
    boot(guest)  # a guest reboot does not reset a passed-through GPU
    assert mig_state(guest)[0] == ("Disabled", "Enabled")
    for command in (["shutdown", "210"], ["start", "210"]):  # a new QEMU process: vfio resets the function
        subprocess.run([str(host.bin / "qm"), *command], env={"PGC_ROOT": str(host.root)}, check=True)
    assert mig_state(guest)[0] == ("Enabled", "Enabled")
    boot(guest)
    assert mig_state(guest)[0] == ("Enabled", "Enabled")  # persistent


def test_an_h100_worker_rebooted_comes_back_with_mig_mode_and_its_geometry(
    guest: FakeGuest, host: FakeRoot, cluster: FakeCluster
) -> None:
    install_mig(guest, {0: "Disabled", 1: "[N/A]"}, hopper=True)
    begin = phase(guest, "begin")
    assert begin.returncode == 0, begin.stderr
    assert "mig-restart: not-needed" in begin.stdout  # applied at once: no VM restart
    assert f"changed: /{UNIT}" in begin.stdout
    label_patch(cluster, guest)
    assert restart(host).returncode == 0 and restarts(host) == 0
    end = phase(guest, "end")
    assert end.returncode == 0, end.stderr
    assert f"mig: {NODE} runs {NEW} (mig-manager: success)" in end.stdout
    # Rebooted (maintenance, a crash, a kernel update): before kubelet and the device plugin start, the GPU runs
    # MIG mode again, so mig-manager's run at its start finds the mode and lays out the geometry: success.
    boot(guest)
    assert mig_state(guest)[0] == ("Enabled", "Enabled")
    assert mig_manager(cluster, guest, NODE) == "success"
    assert cluster.state()["labels"][NODE]["nvidia.com/mig.config"] == NEW
    # The next pulumi up changes nothing.
    for name in ("begin", "end"):
        rerun = phase(guest, name)
        assert rerun.returncode == 0, rerun.stderr
        assert "changed:" not in rerun.stdout and not [c for c in rerun.calls if " -mig " in c]


def test_the_boot_unit_changes_nothing_where_the_mode_persists(guest: FakeGuest, host: FakeRoot) -> None:
    # The A100 after its restart: enabled and current; the unit finds it so and calls no -mig.
    guest.write("fake-mig-resettable", "")
    assert phase(guest, "begin").returncode == 0
    assert (guest.root / UNIT).exists()
    log = guest.root / "calls.log"
    log.write_text("")
    boot(guest)
    assert mig_state(guest)[0] == ("Enabled", "Enabled")
    assert not [c for c in log.read_text().splitlines() if " -mig " in c]
