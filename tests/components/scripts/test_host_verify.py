"""host_verify.sh against a fake sysfs: IOMMU, interrupt remapping, kernel arguments, vfio-pci binding and
IOMMU-group isolation; each failure names its step, what was expected and what was seen."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.components.scripts.fakeroot import FakeRoot, Result

AMD_LOG = "[    0.9] AMD-Vi: Interrupt remapping enabled\n[    1.0] pci 0000:00:00.2: AMD-Vi: Found IOMMU cap 0x40\n"
ARGS = ["--kernel-arg", "iommu=pt"]  # the spec asks for iommuPassthrough; the IOMMU is checked where it runs


def device(host: FakeRoot, address: str, group: int, pci_class: str, driver: str | None = "vfio-pci") -> None:
    base = f"sys/bus/pci/devices/{address}"
    host.write(f"{base}/class", f"{pci_class}\n")
    host.link(f"{base}/iommu_group", str(host.root / f"sys/kernel/iommu_groups/{group}"))
    host.link(f"sys/kernel/iommu_groups/{group}/devices/{address}", str(host.root / base))
    if driver is not None:
        host.link(f"{base}/driver", str(host.root / f"sys/bus/pci/drivers/{driver}"))


@pytest.fixture
def host(tmp_path: Path) -> FakeRoot:
    h = FakeRoot(tmp_path / "root")
    h.stub("dmesg", AMD_LOG)
    h.stub("journalctl")
    h.write("proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz ro quiet iommu=pt\n")
    h.write("sys/class/iommu/ivhd0/device", "")
    device(h, "0000:41:00.0", 42, "0x030200")
    device(h, "0000:40:01.1", 42, "0x060400", driver="pcieport")  # the root port above it
    device(h, "0000:81:00.0", 50, "0x030200")
    device(h, "0000:81:00.1", 50, "0x040300")
    return h


def verify(host: FakeRoot, *gpus: str) -> Result:
    return host.run("host_verify.sh", *ARGS, *(a for g in gpus for a in ("--gpu", g)))


def test_a_prepared_host_passes_and_reports_groups(host: FakeRoot) -> None:
    r = verify(host, "0000:41:00", "0000:81:00")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["group 0000:41:00 42", "group 0000:81:00 50"]


def test_kernel_args_missing(host: FakeRoot) -> None:
    host.write("proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz ro quiet\n")
    r = verify(host, "0000:41:00")
    assert r.returncode == 1
    assert r.stderr.startswith("host-verify: kernel-args: expected iommu=pt in /proc/cmdline, saw BOOT_IMAGE")


def test_kernel_args_missing_while_host_prep_waits_for_a_reboot(host: FakeRoot) -> None:
    # rebootPolicy never (or guests in the way): host prep left the marker; verify says what is pending.
    host.write("proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz ro quiet\n")
    host.write("run/proxmox-gpu-cluster/reboot-required", "the running kernel lacks iommu=pt\n")
    r = verify(host, "0000:41:00")
    assert r.returncode == 1
    assert r.stderr.strip().endswith(
        "; host prep is waiting for a reboot (the running kernel lacks iommu=pt): reboot the node, "
        "then run pulumi up again"
    )


def test_acs_override_isolation_is_checked_after_the_reboot(host: FakeRoot) -> None:
    # With acsOverride the preflight defers: host verify runs the check on the groups the override produced.
    args = [*ARGS, "--kernel-arg", "pcie_acs_override=downstream,multifunction"]
    host.write("proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz ro iommu=pt pcie_acs_override=downstream,multifunction\n")
    assert host.run("host_verify.sh", *args, "--gpu", "0000:41:00").returncode == 0
    device(host, "0000:42:00.0", 42, "0x020000", driver="igb")  # the override did not split this group
    r = host.run("host_verify.sh", *args, "--gpu", "0000:41:00")
    assert r.returncode == 1 and "host-verify: isolation: expected IOMMU group 42 to hold only 0000:41:00" in r.stderr
    assert "0000:42:00.0" in r.stderr


def test_iommu_off(host: FakeRoot) -> None:
    # Words on the command line prove nothing (amd_iommu=on is no value): only the groups the IOMMU driver made do.
    host.write("proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz ro quiet amd_iommu=on iommu=pt\n")
    for link in (host.root / "sys/kernel/iommu_groups").rglob("*"):
        if link.is_symlink():
            link.unlink()
    for group in sorted((host.root / "sys/kernel/iommu_groups").glob("*/devices"), reverse=True):
        group.rmdir()
        group.parent.rmdir()
    host.stub("dmesg", "[    0.1] AMD-Vi: AMD IOMMUv2 functionality not available on this system\n")
    r = verify(host, "0000:41:00")
    assert r.returncode == 1 and r.stderr.strip() == (
        "host-verify: iommu: expected entries in /sys/kernel/iommu_groups (an active IOMMU), saw none (kernel log: "
        "[    0.1] AMD-Vi: AMD IOMMUv2 functionality not available on this system)"
    )


def test_interrupt_remapping_off(host: FakeRoot) -> None:
    host.stub("dmesg", "[    1.0] AMD-Vi: Found IOMMU cap 0x40\n")
    r = verify(host, "0000:41:00")
    assert r.returncode == 1 and r.stderr.startswith("host-verify: interrupt-remapping: expected")


def test_interrupt_remapping_found_in_the_journal_when_dmesg_wrapped(host: FakeRoot) -> None:
    host.stub("dmesg", "")
    host.stub("journalctl", "kernel: DMAR-IR: Enabled IRQ remapping in x2apic mode\n")
    assert verify(host, "0000:41:00").returncode == 0


def test_gpu_still_on_the_nvidia_driver(host: FakeRoot) -> None:
    (host.root / "sys/bus/pci/devices/0000:81:00.1/driver").unlink()
    host.link("sys/bus/pci/devices/0000:81:00.1/driver", str(host.root / "sys/bus/pci/drivers/snd_hda_intel"))
    r = verify(host, "0000:81:00")
    assert r.returncode == 1
    assert r.stderr.strip() == "host-verify: driver: expected 0000:81:00.1 bound to vfio-pci, saw snd_hda_intel"


def test_shared_group_names_the_other_devices(host: FakeRoot) -> None:
    device(host, "0000:42:00.0", 42, "0x020000", driver="igb")  # a NIC behind the same root port
    r = verify(host, "0000:41:00")
    assert r.returncode == 1
    assert "host-verify: isolation: expected IOMMU group 42 to hold only 0000:41:00 and bridges" in r.stderr
    assert "acsOverride" in r.stderr and r.stderr.strip().endswith("saw 0000:42:00.0")


def test_missing_gpu(host: FakeRoot) -> None:
    r = verify(host, "0000:99:00")
    assert r.returncode == 1 and "host-verify: devices: expected PCI device 0000:99:00.0" in r.stderr


def test_verify_changes_nothing(host: FakeRoot) -> None:
    before = host.snapshot()
    verify(host, "0000:41:00", "0000:81:00")
    after = host.snapshot()
    assert after.pop("run/lock/proxmox-gpu-cluster.lock").startswith("host-verify (pid ")  # the lock's holder line
    assert after == before


@pytest.mark.parametrize(("module", "value", "ok"), [("kvm_amd", "1", True), ("kvm_intel", "Y", True),
                                                      ("kvm_intel", "N", False), (None, None, False)])  # fmt: skip
def test_nested_virtualization_for_kubevirt_workers(
    host: FakeRoot, module: str | None, value: str | None, ok: bool
) -> None:
    if module is not None:
        host.write(f"sys/module/{module}/parameters/nested", f"{value}\n")
    r = host.run("host_verify.sh", *ARGS, "--gpu", "0000:41:00", "--nested", "1")
    assert (r.returncode == 0) is ok, r.stderr
    if not ok:
        assert r.stderr.startswith("host-verify: nested-virtualization: expected Y or 1 in /sys/module/")
        assert r.stderr.rstrip().endswith(f"saw {value or 'no kvm module'}")
    assert verify(host, "0000:41:00").returncode == 0  # without --nested nothing is asked of the module
