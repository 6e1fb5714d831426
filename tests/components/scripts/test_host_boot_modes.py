"""Host prep on each way a Proxmox VE node boots (issue 34, item 1): the kernel arguments go into the file the boot
loader the node really uses is generated from, and the one reboot brings them. The installer puts a ZFS root's
kernels on ESPs that proxmox-boot-tool manages, and boots them with GRUB on legacy BIOS and with Secure Boot,
systemd-boot only on UEFI without it (pve-docs system-booting.adoc, "Host Bootloader"); refresh then regenerates
GRUB from /etc/default/grub and ignores /etc/kernel/cmdline. The fake proxmox-boot-tool is checked against its
sources in test_proxmox_boot_model.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.components.scripts.fakehost import A10, GRUB, OLD_KERNEL, FakeHost, mutating

ZFS_CMDLINE = "root=ZFS=rpool/ROOT/pve-1 boot=zfs\n"


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    """Intel on kernel 6.5: the IOMMU is off until intel_iommu=on is on the command line, so host prep must get the
    argument into what the node boots and reboot once."""
    return FakeHost(tmp_path / "root", cpu="intel", kernel=OLD_KERNEL)


def grub_line(host: FakeHost) -> str:
    return next(line for line in host.read("etc/default/grub").splitlines() if line.startswith("GRUB_CMDLINE_LINUX_D"))


def prepared_after_one_reboot(host: FakeHost) -> None:
    """The argument is active after the one reboot host prep scheduled; a further run changes and reboots nothing,
    and host verify agrees."""
    r = host.prep(A10)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1].startswith("reboot: scheduled"), r.stdout
    assert host.reboot_if_scheduled()
    assert " intel_iommu=on" in host.read("proc/cmdline")
    assert host.driver_of("0000:41:00.0") == "vfio-pci"
    r = host.prep(A10)
    assert r.returncode == 0 and r.stdout.strip() == "reboot: not-needed", r.stderr
    assert mutating(r.calls) == [] and not host.reboot_if_scheduled()
    assert host.verify(A10[0]).returncode == 0


@pytest.mark.parametrize("firmware", ["bios", "secureboot"])
def test_zfs_on_grub_gets_the_arguments_from_etc_default_grub(host: FakeHost, firmware: str) -> None:
    # Before: /etc/kernel/cmdline was taken to mean systemd-boot; refresh ignored it, the node rebooted without
    # the argument and host prep stopped with "not rebooting again".
    host.proxmox_boot(firmware)
    prepared_after_one_reboot(host)
    assert grub_line(host) == 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=soft intel_iommu=on"'
    assert host.read("etc/kernel/cmdline") == ZFS_CMDLINE  # not what GRUB boots from
    assert "intel_iommu=on" in host.read("fake-esp/1234-ABCD/grub/grub.cfg")


def test_zfs_on_grub_is_regenerated_with_proxmox_boot_tool(host: FakeHost) -> None:
    host.proxmox_boot("bios")
    r = host.prep(A10)
    assert r.returncode == 0, r.stderr
    assert r.calls[0] == "proxmox-boot-tool status"
    assert "proxmox-boot-tool refresh" in r.calls
    # refresh runs update-grub once, with the ESP as /boot; host prep runs none itself (/boot/grub/grub.cfg is not
    # what this node boots, and proxmox-kernel-helper's GRUB header would run refresh again).
    assert [c.strip() for c in r.calls].count("update-grub") == 1


def test_zfs_on_uefi_without_secure_boot_uses_systemd_boot(host: FakeHost) -> None:
    host.proxmox_boot("uefi")
    prepared_after_one_reboot(host)
    assert host.read("etc/kernel/cmdline") == "root=ZFS=rpool/ROOT/pve-1 boot=zfs intel_iommu=on\n"
    assert host.read("etc/default/grub") == GRUB


def test_plain_grub_uses_update_grub(host: FakeHost) -> None:
    prepared_after_one_reboot(host)
    assert grub_line(host) == 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=soft intel_iommu=on"'
    assert not (host.root / "etc/kernel").exists()


def test_an_explicit_grub_on_a_proxmox_boot_tool_node_is_refreshed_there(host: FakeHost) -> None:
    host.proxmox_boot("secureboot")
    r = host.prep(A10, boot_loader="grub")
    assert r.returncode == 0, r.stderr
    assert "proxmox-boot-tool status" not in r.calls and "proxmox-boot-tool refresh" in r.calls
    assert host.reboot_if_scheduled() and " intel_iommu=on" in host.read("proc/cmdline")


def test_a_grub_drop_in_that_overrides_the_arguments_fails_before_refresh(host: FakeHost) -> None:
    host.proxmox_boot("bios")
    host.write("etc/default/grub.d/installer.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    r = host.prep(A10)
    assert r.returncode == 1 and not any(c.startswith(("proxmox-boot-tool refresh", "systemd-run")) for c in r.calls)
    assert r.stderr.strip().splitlines()[-1] == (
        "host-prep: boot-config: expected intel_iommu=on in the kernel command line /etc/default/grub and "
        "/etc/default/grub.d/*.cfg give GRUB, saw 'quiet' (does a file in /etc/default/grub.d set "
        "GRUB_CMDLINE_LINUX_DEFAULT?)"
    )
    (host.root / "etc/default/grub.d/installer.cfg").unlink()
    prepared_after_one_reboot(host)


def test_an_esp_set_up_for_both_without_secure_boot_is_ambiguous(host: FakeHost) -> None:
    # loader.conf and a grub directory, no Secure Boot: refresh boots GRUB only if the ESP holds grubx64.efi,
    # which status does not show. Host prep refuses to guess (bootLoader can say).
    host.proxmox_boot("uefi")
    (host.root / "fake-esp/1234-ABCD/grub").mkdir()
    r = host.prep(A10)
    assert r.returncode == 1 and mutating(r.calls) == []
    assert r.stderr == (
        "host-prep: boot-loader: expected every ESP in 'proxmox-boot-tool status' set up for one boot loader (or "
        "bootLoader set), saw firmware 1 (1: uefi, 0: bios), ESPs '1234-ABCD: ambiguous'\n"
    )
    assert host.prep(A10, boot_loader="systemd-boot").returncode == 0


def test_with_secure_boot_an_esp_with_both_is_grub(host: FakeHost) -> None:
    host.proxmox_boot("secureboot")
    host.write("fake-esp/1234-ABCD/loader/loader.conf", "timeout 3\ndefault proxmox-*\n")  # left from before
    prepared_after_one_reboot(host)
    assert grub_line(host).endswith('intel_iommu=on"')


def test_esps_set_up_for_different_boot_loaders_fail(host: FakeHost) -> None:
    host.proxmox_boot("uefi")
    host.write("etc/kernel/proxmox-boot-uuids", "1234-ABCD\n5678-EF01\n")
    host.write("fake-esp/5678-EF01/EFI/proxmox/grubx64.efi", "")
    (host.root / "fake-esp/5678-EF01/grub").mkdir()
    r = host.prep(A10)
    assert r.returncode == 1 and r.stderr.endswith("ESPs '1234-ABCD: systemd-boot 5678-EF01: grub'\n")


def test_a_failing_status_fails_naming_it(host: FakeHost) -> None:
    host.proxmox_boot("bios")
    host.prepend("proxmox-boot-tool", '[ "$1" != status ] || { echo "unshare: unshare failed" >&2; exit 1; }')
    r = host.prep(A10)
    assert r.returncode == 1 and mutating(r.calls) == []
    assert r.stderr == (
        "host-prep: boot-loader: expected 'proxmox-boot-tool status' to exit 0 (/etc/kernel/proxmox-boot-uuids "
        "exists), saw exit 1: unshare: unshare failed\n"
    )
