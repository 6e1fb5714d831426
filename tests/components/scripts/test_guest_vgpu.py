"""vm-vgpu guests: the verify step refuses a running kernel of 6.0 or later (the GPU Operator's KubeVirt vGPU path
uses mediated devices, which NVIDIA supports below kernel 6.0; components/core/vgpu.py), reading the kernel the
guest RUNS (uname -r), so a newer kernel only installed, not booted, does not count and one booted does."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.core.vgpu import MDEV_KERNEL_BELOW
from proxmox_gpu_cluster.render.guest_scripts import verify_args
from tests.components.scripts.fakeguest import KERNEL, FakeGuest, mutating
from tests.components.scripts.test_guest_bootstrap_scripts import provision, spec

JAMMY_GA = "5.15.0-126-generic"


@pytest.fixture
def guest(tmp_path: Path) -> FakeGuest:
    return FakeGuest(tmp_path / "root")


def vgpu_spec(**overrides: object) -> GuestBootstrapSpec:
    """A vm-vgpu worker VM as bootstrap_spec makes it: the GPU left to the operator's vGPU Manager, the vIOMMU on,
    /dev/kvm and a kernel below 6.0."""
    values: dict[str, object] = {
        "driverMode": "operator",
        "toolkit": False,
        "kernelArgs": ["intel_iommu=on", "iommu=pt"],
        "kvm": True,
        "kernelBelow": MDEV_KERNEL_BELOW,
    }
    return spec(**{**values, **overrides})


def test_vgpu_guest_on_the_jammy_ga_kernel_passes_and_a_second_run_changes_nothing(guest: FakeGuest) -> None:
    guest.write("fake-kernel", JAMMY_GA + "\n")
    b = vgpu_spec()
    args = verify_args(b)
    assert args[args.index("--kernel-below") + 1] == "6.0"
    _, reboots = provision(guest, b)
    assert reboots == 1  # the vIOMMU arguments
    r = guest.step("verify", *verify_args(b))
    assert r.returncode == 0, r.stderr
    assert "verify: ok: NVIDIA-A10" in r.stdout and mutating(r.calls) == []


def test_vgpu_guest_on_a_6_8_kernel_fails_verify_naming_the_kernel(guest: FakeGuest) -> None:
    # The fake guest boots Ubuntu's 6.8 kernel (24.04, or 22.04 with the HWE kernel): no mediated devices there.
    assert KERNEL.startswith("6.8.")
    b = vgpu_spec()
    provision(guest, vgpu_spec(kernelBelow=None))  # every step done, the same files
    r = guest.step("verify", *verify_args(b))
    assert r.returncode == 1
    assert r.stderr.strip() == (
        "verify: running kernel (uname -r): expected older than 6.0 (vm-vgpu: NVIDIA supports the GPU Operator's "
        f"KubeVirt vGPU, mediated devices, below kernel 6.0 only, e.g. Ubuntu 22.04's 5.15), saw {KERNEL}"
    )


def test_a_6_8_kernel_booted_later_fails_the_next_verify(guest: FakeGuest) -> None:
    # An HWE kernel installed by hand (linux-generic-hwe-22.04) fails verify once the guest runs it.
    guest.write("fake-kernel", JAMMY_GA + "\n")
    b = vgpu_spec()
    provision(guest, b)
    guest.kernel_update("6.8.0-60-generic")
    guest.reboot()
    r = guest.step("verify", *verify_args(b))
    assert r.returncode == 1 and r.stderr.strip().endswith("saw 6.8.0-60-generic")


def test_without_a_bound_the_kernel_is_not_checked(guest: FakeGuest) -> None:
    # Only vm-vgpu nodes get one (tests/components/test_vgpu.py): vm-passthrough is supported on Ubuntu 24.04
    # (GPU Operator 26.3.0 release notes).
    b = vgpu_spec(kernelBelow=None)
    assert "--kernel-below" not in verify_args(b)
    provision(guest, b)
    r = guest.step("verify", *verify_args(b))
    assert r.returncode == 0, r.stderr


def test_an_unreadable_release_or_bound_fails_with_a_line(guest: FakeGuest) -> None:
    guest.write("fake-kernel", "weird\n")
    r = guest.step("verify", *verify_args(vgpu_spec()))
    assert r.returncode == 1 and "verify: uname -r: expected a kernel release, saw weird" in r.stderr
