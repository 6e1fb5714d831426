"""host_prep.sh against a fake root: first run writes the files and asks for one reboot, the second run (after
the simulated reboot) changes nothing and asks for none; unrelated lines survive; bad input fails by step."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.components.scripts.fakeroot import FakeRoot

GRUB = """# If you change this file, run 'update-grub' afterwards.
GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=soft"
GRUB_CMDLINE_LINUX=""
"""
BOOT = "BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro"
A10 = ["--gpu", "0000:41:00=10de:2236"]
STUBS = ("update-grub", "proxmox-boot-tool", "update-initramfs", "systemd-run")


def pci(host: FakeRoot, address: str, vendor: str, device: str) -> None:
    host.write(f"sys/bus/pci/devices/{address}/vendor", f"0x{vendor}\n")
    host.write(f"sys/bus/pci/devices/{address}/device", f"0x{device}\n")


@pytest.fixture
def host(tmp_path: Path) -> FakeRoot:
    h = FakeRoot(tmp_path / "root")
    for name in STUBS:
        h.stub(name)
    h.write("etc/default/grub", GRUB)
    h.write("etc/modules", "# /etc/modules\nbonding\n")
    h.write("etc/modprobe.d/pve-blacklist.conf", "blacklist nvidiafb\n")
    h.write("proc/cmdline", f"{BOOT} quiet iommu=soft\n")
    pci(h, "0000:41:00.0", "10de", "2236")  # A10
    pci(h, "0000:81:00.0", "10de", "20f1")  # A100 PCIe 40GB
    pci(h, "0000:81:00.1", "10de", "1aef")  # a second function on the same card
    return h


def reboot(host: FakeRoot) -> None:
    """What the scheduled reboot does: the kernel now runs with the configured arguments."""
    line = re.search(r'^GRUB_CMDLINE_LINUX_DEFAULT="(.*)"$', host.read("etc/default/grub"), re.M)
    assert line is not None
    host.write("proc/cmdline", f"{BOOT} {line.group(1)}\n")


def prep(host: FakeRoot, *extra: str, vendor: str = "amd") -> tuple[int, str, str, list[str]]:
    r = host.run("host_prep.sh", "--cpu-vendor", vendor, "--boot-loader", "auto", "--acs-override", "0", *extra)
    return r.returncode, r.stdout, r.stderr, r.calls


def test_first_run_configures_and_schedules_one_reboot(host: FakeRoot) -> None:
    code, out, err, calls = prep(host, *A10)
    assert code == 0, err
    assert sorted(line for line in out.splitlines() if line.startswith("changed: ")) == [
        "changed: /etc/default/grub",
        "changed: /etc/modprobe.d/blacklist-gpu-passthrough.conf",
        "changed: /etc/modprobe.d/vfio.conf",
        "changed: /etc/modules-load.d/vfio.conf",
    ]
    assert out.splitlines()[-1] == "reboot: scheduled"
    assert [c.split()[0] for c in calls] == ["update-initramfs", "update-grub", "systemd-run"]
    assert "update-initramfs -u -k all" in calls
    grub = host.read("etc/default/grub")
    # existing arguments kept, the conflicting iommu=soft replaced, all on one line, other lines untouched
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet amd_iommu=on iommu=pt"' in grub
    assert grub.replace('"quiet amd_iommu=on iommu=pt"', '"quiet iommu=soft"') == GRUB
    assert host.read("etc/modules-load.d/vfio.conf").split("\n")[1:] == ["vfio", "vfio_iommu_type1", "vfio_pci", ""]
    assert "vfio_virqfd" not in host.read("etc/modules-load.d/vfio.conf")
    blacklist = host.read("etc/modprobe.d/blacklist-gpu-passthrough.conf")
    for module in ("nouveau", "nvidia", "nvidiafb", "nvidia_drm"):
        assert f"blacklist {module}\n" in blacklist + "\n"
    vfio = host.read("etc/modprobe.d/vfio.conf")
    assert "options vfio-pci ids=10de:2236\n" in vfio
    assert "softdep nouveau pre: vfio-pci" in vfio and "softdep nvidia pre: vfio-pci" in vfio
    # unrelated files are untouched
    assert host.read("etc/modules") == "# /etc/modules\nbonding\n"
    assert host.read("etc/modprobe.d/pve-blacklist.conf") == "blacklist nvidiafb\n"


def test_second_run_after_reboot_changes_nothing(host: FakeRoot) -> None:
    assert prep(host, *A10)[0] == 0
    reboot(host)
    before = host.snapshot()
    code, out, err, calls = prep(host, *A10)
    assert code == 0, err
    assert out == "reboot: not-needed\n"
    assert calls == []
    assert host.snapshot() == before


def test_a_missed_reboot_is_asked_for_again_without_rewriting(host: FakeRoot) -> None:
    prep(host, *A10)
    before = host.snapshot()
    code, out, _, calls = prep(host, *A10)  # the node never rebooted
    assert code == 0 and out == "reboot: scheduled\n"
    assert [c.split()[0] for c in calls] == ["systemd-run"]
    assert host.snapshot() == before


def test_all_functions_of_the_card_are_bound(host: FakeRoot) -> None:
    code, _, err, _ = prep(host, *A10, "--gpu", "0000:81:00=10de:20f1")
    assert code == 0, err
    assert "options vfio-pci ids=10de:1aef,10de:20f1,10de:2236\n" in host.read("etc/modprobe.d/vfio.conf")


def test_intel_and_acs_override(host: FakeRoot) -> None:
    r = host.run("host_prep.sh", "--cpu-vendor", "intel", "--boot-loader", "grub", "--acs-override", "1", *A10)
    assert r.returncode == 0, r.stderr
    line = 'GRUB_CMDLINE_LINUX_DEFAULT="quiet intel_iommu=on iommu=pt pcie_acs_override=downstream,multifunction"'
    assert line in host.read("etc/default/grub")


def test_systemd_boot_is_detected(host: FakeRoot) -> None:
    host.write("etc/kernel/cmdline", "root=ZFS=rpool/ROOT/pve-1 boot=zfs\n")
    host.write("etc/kernel/proxmox-boot-uuids", "1234-ABCD\n")
    code, _out, err, calls = prep(host, *A10)
    assert code == 0, err
    assert host.read("etc/kernel/cmdline") == "root=ZFS=rpool/ROOT/pve-1 boot=zfs amd_iommu=on iommu=pt\n"
    assert host.read("etc/default/grub") == GRUB  # not the boot loader in use
    assert "proxmox-boot-tool refresh" in calls and not any(c.startswith("update-grub") for c in calls)
    host.write("proc/cmdline", "root=ZFS=rpool/ROOT/pve-1 boot=zfs amd_iommu=on iommu=pt\n")
    assert prep(host, *A10)[3] == []


def test_wrong_model_at_the_path_fails_the_step(host: FakeRoot) -> None:
    code, _, err, calls = prep(host, "--gpu", "0000:41:00=10de:20b5")
    assert code == 1
    assert err.strip() == "host-prep: vfio-ids: 0000:41:00.0 is 10de:2236, the spec expects 10de:20b5"
    assert not any(c.startswith("systemd-run") for c in calls)


def test_missing_device_fails_the_step(host: FakeRoot) -> None:
    code, _, err, _ = prep(host, "--gpu", "0000:99:00=10de:2236")
    assert code == 1 and "host-prep: vfio-ids: no PCI device at 0000:99:00.0" in err


def test_spec_strings_are_arguments_not_code(host: FakeRoot) -> None:
    # The component quotes every argument; even a hostile one is only ever data to the script.
    code, _, err, _calls = prep(host, "--gpu", "0000:41:00=$(touch /tmp/pwned)")
    assert code == 1 and "spec expects $(touch /tmp/pwned)" in err
    assert not Path("/tmp/pwned").exists()
