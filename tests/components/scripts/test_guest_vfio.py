"""KubeVirt (vm-passthrough) guests: the GPUs bound to vfio-pci at boot, the IOMMU kernel arguments through GRUB,
/dev/kvm required; one reboot, then nothing changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.render.guest_scripts import driver_args, verify_args
from tests.components.scripts.fakeguest import FakeGuest, mutating
from tests.components.scripts.test_guest_bootstrap_scripts import files, provision, spec


@pytest.fixture
def guest(tmp_path: Path) -> FakeGuest:
    return FakeGuest(tmp_path / "root")


def kubevirt_spec(**overrides: object) -> GuestBootstrapSpec:
    """A vm-passthrough worker VM: GPUs to vfio-pci, vIOMMU kernel arguments, /dev/kvm required."""
    values: dict[str, object] = {
        "driverMode": "vfio",
        "toolkit": False,
        "kernelArgs": ["intel_iommu=on", "iommu=pt"],
        "kvm": True,
    }
    return spec(**{**values, **overrides})


def test_vfio_guest_boots_once_with_the_iommu_and_hands_the_gpu_to_vfio_pci(guest: FakeGuest) -> None:
    calls, reboots = provision(guest, kubevirt_spec())
    assert reboots == 1  # the kernel arguments only take effect at boot
    assert "intel_iommu=on iommu=pt" in guest.read("proc/cmdline")
    assert guest.driver_of() == "vfio-pci"
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT:-} intel_iommu=on iommu=pt"' in guest.read(
        "etc/default/grub.d/90-proxmox-gpu-cluster.cfg"
    )
    assert "options vfio-pci ids=10de:2236" in guest.read("etc/modprobe.d/proxmox-gpu-cluster-vfio.conf")
    assert guest.read("etc/modules-load.d/proxmox-gpu-cluster-vfio.conf").split("\n")[1:] == [
        "vfio", "vfio_iommu_type1", "vfio_pci", ""
    ]  # fmt: skip
    assert [c.strip() for c in calls].count("update-grub") == 1
    # No NVIDIA driver and no toolkit on a passthrough node; containerd and kubeadm still.
    assert not [p for p in ("nvidia-headless-580-server-open", "nvidia-container-toolkit") if guest.installed(p)]
    assert guest.installed("kubeadm") is not None


def test_vfio_guest_second_run_changes_nothing(guest: FakeGuest) -> None:
    b = kubevirt_spec()
    provision(guest, b)
    before = files(guest)
    calls, reboots = provision(guest, b)
    assert (reboots, mutating(calls)) == (0, [])
    assert files(guest) == before and guest.driver_of() == "vfio-pci"


def test_vfio_guest_already_booted_with_the_iommu_binds_without_a_reboot(guest: FakeGuest) -> None:
    # A template that already boots with the arguments: loading vfio-pci binds the unbound GPU on the spot.
    guest.write("proc/cmdline", "BOOT_IMAGE=/vmlinuz ro intel_iommu=on iommu=pt\n")
    guest.write("sys/kernel/iommu_groups/0/type", "identity\n")
    calls, reboots = provision(guest, kubevirt_spec())
    assert reboots == 0 and guest.driver_of() == "vfio-pci"
    assert "modprobe vfio-pci" in calls


def test_leaving_vfio_mode_removes_the_binding_and_reboots_once(guest: FakeGuest) -> None:
    provision(guest, kubevirt_spec())
    r = guest.step("driver", *driver_args(spec(driverMode="operator", toolkit=False)))
    assert r.returncode == 0, r.stderr
    assert "changed: /etc/modprobe.d/proxmox-gpu-cluster-vfio.conf (removed)" in r.stdout
    assert "changed: /etc/default/grub.d/90-proxmox-gpu-cluster.cfg (removed)" in r.stdout
    assert "reboot: scheduled" in r.stdout  # vfio-pci still holds the GPU until the next boot
    guest.reboot()
    assert guest.driver_of() is None
    again = guest.step("driver", *driver_args(spec(driverMode="operator", toolkit=False)))
    assert "reboot: not-needed" in again.stdout and mutating(again.calls) == []


@pytest.mark.parametrize(
    ("breakage", "line"),
    [
        (lambda g: g.write("proc/cmdline", "BOOT_IMAGE=/vmlinuz ro\n"),
         "verify: kernel command line: expected intel_iommu=on, saw BOOT_IMAGE=/vmlinuz ro"),
        (lambda g: (g.root / "sys/bus/pci/devices/0000:00:10.0/driver").unlink(),
         "verify: vfio-pci: expected 1 x 10de:2236 bound to vfio-pci, saw drivers: none"),
        (lambda g: __import__("shutil").rmtree(g.root / "sys/kernel/iommu_groups"),
         "verify: IOMMU groups: expected at least one (is the VM's vIOMMU on?), saw none"),
        (lambda g: (g.root / "dev/kvm").unlink(),
         "verify: /dev/kvm: expected the KVM device (nested virtualization: cpu host, and "
         "nested=1 in the Proxmox node's kvm module), saw none"),
    ],
    ids=["kernel args", "vfio binding", "iommu groups", "kvm"],
)  # fmt: skip
def test_vfio_verify_failures_name_what_is_missing(guest: FakeGuest, breakage: object, line: str) -> None:
    b = kubevirt_spec()
    provision(guest, b)
    breakage(guest)  # type: ignore[operator]
    r = guest.step("verify", *verify_args(b))
    assert r.returncode == 1
    assert r.stderr.strip() == line


def test_bare_metal_amd_vfio_node_uses_its_own_iommu_arguments(guest: FakeGuest) -> None:
    b = kubevirt_spec(kernelArgs=["amd_iommu=on", "iommu=pt"])
    _, reboots = provision(guest, b)
    assert reboots == 1 and guest.driver_of() == "vfio-pci"
    assert guest.read("proc/cmdline").rstrip().endswith("amd_iommu=on iommu=pt")
    assert "intel_iommu" not in guest.read("etc/default/grub.d/90-proxmox-gpu-cluster.cfg")
