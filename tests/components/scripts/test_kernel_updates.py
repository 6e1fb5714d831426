"""Drivers that survive kernel updates: the driver step installs the kernel-tracking headers, so a kernel that
unattended-upgrades brings gets its headers and DKMS builds the NVIDIA module for it before the next boot. Tested
by simulating the update in the fake guest (the new image, the headers the metapackage pulls, DKMS's hook)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxmox_gpu_cluster.render.guest_scripts import driver_args, verify_args
from tests.components.scripts.fakeguest import FakeGuest, mutating
from tests.components.scripts.test_guest_bootstrap_scripts import provision, spec

NEW_KERNEL = "6.8.0-51-generic"


@pytest.fixture
def guest(tmp_path: Path) -> FakeGuest:
    return FakeGuest(tmp_path / "root")


def test_the_driver_step_installs_the_kernel_tracking_headers_unheld(guest: FakeGuest) -> None:
    provision(guest, spec())
    assert guest.installed("linux-headers-virtual") is not None  # the cloud image runs linux-image-virtual
    assert "linux-headers-virtual" not in guest.holds()  # it must follow the kernel


def test_a_kernel_update_keeps_the_module_after_the_reboot(guest: FakeGuest) -> None:
    b = spec()
    provision(guest, b)
    guest.kernel_update(NEW_KERNEL)
    assert (guest.root / f"lib/modules/{NEW_KERNEL}/updates/dkms/nvidia.ko").exists()  # built before the boot
    guest.reboot()
    assert guest.read("sys/module/nvidia/version").strip() == "580.95.05"
    verify = guest.step("verify", *verify_args(b))
    assert verify.returncode == 0, verify.stderr
    again = guest.step("driver", *driver_args(b))  # the next `pulumi up`: nothing to do, nothing to reboot
    assert again.returncode == 0 and "reboot: not-needed" in again.stdout and mutating(again.calls) == []


def test_without_the_tracking_headers_the_update_loses_the_module_and_the_driver_step_repairs_it(
    guest: FakeGuest,
) -> None:
    """What happened before this fix: only the running kernel's headers. The next boot has no nvidia module
    (verify fails); the driver step then installs the headers, DKMS builds the module and it loads, no reboot."""
    b = spec()
    provision(guest, b)
    guest.run_stdin("apt-get purge -y linux-headers-virtual\n")
    guest.kernel_update(NEW_KERNEL)
    guest.reboot()
    assert not (guest.root / "sys/module/nvidia").exists()
    broken = guest.step("verify", *verify_args(b))
    assert broken.returncode == 1 and "nvidia-smi" in broken.stderr
    repair = guest.step("driver", *driver_args(b))
    assert repair.returncode == 0, repair.stderr
    assert f"linux-headers-{NEW_KERNEL}" in repair.stdout and "reboot: not-needed" in repair.stdout
    assert guest.step("verify", *verify_args(b)).returncode == 0
