"""Contract of the fake proxmox-boot-tool and boot model (fakehost.py, fakehost_tools.py): each behaviour host prep
relies on, with the source it follows. proxmox-kernel-helper is Proxmox's package, not in Debian, so it cannot run
here; the model follows its scripts (bin/proxmox-boot-tool: status, _status_detail, init_bootloader;
proxmox-boot/zz-proxmox-boot: update_esps, update_esp_func, copy_and_config_kernels; proxmox-boot/
000_proxmox_boot_header; proxmox-boot/functions: reexec_in_mountns, loop_esp_list) and pve-docs
system-booting.adoc ("Host Bootloader", "Determine which Bootloader is Used", "Secure Boot")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.components.scripts.fakehost import FakeHost

ESP = "fake-esp/1234-ABCD"


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "root")


def status(host: FakeHost) -> list[str]:
    return host.run_quietly("proxmox-boot-tool", "status").splitlines()


@pytest.mark.parametrize(
    ("firmware", "booted", "configured"),
    [
        # init_bootloader: legacy BIOS installs GRUB i386-pc with --boot-directory on the ESP (a grub directory);
        # UEFI with `init <partition> grub` (the installer with Secure Boot) GRUB's EFI image and a grub
        # directory; UEFI otherwise systemd-boot (bootctl install, loader/loader.conf). _status_detail prints
        # "uefi (versions: ...)" for a loader.conf and "grub (versions: ...)" for a grub directory.
        ("bios", "legacy bios", "grub (versions: 6.8.12-4-pve)"),
        ("secureboot", "uefi", "grub (versions: 6.8.12-4-pve)"),
        ("uefi", "uefi", "uefi (versions: 6.8.12-4-pve)"),
    ],
)
def test_status_reports_the_firmware_and_what_each_esp_is_set_up_for(
    host: FakeHost, firmware: str, booted: str, configured: str
) -> None:
    host.proxmox_boot(firmware)
    # status re-executes itself in a private mount namespace first (reexec_in_mountns), then: "System currently
    # booted with uefi|legacy bios" (from /sys/firmware/efi), one line per ESP.
    assert status(host) == [
        "Re-executing '/usr/sbin/proxmox-boot-tool' in new private mount namespace..",
        f"System currently booted with {booted}",
        f"1234-ABCD is configured with: {configured}",
    ]


def test_status_without_the_esp_list_exits_2(host: FakeHost) -> None:
    # status: "Exits with 0 if any ESP is configured, else with 2" (help text); --quiet prints nothing.
    out = host._call([str(host.bin / "proxmox-boot-tool"), "status"])
    assert out.returncode == 2 and out.stderr == "E: /etc/kernel/proxmox-boot-uuids does not exist.\n"
    out = host._call([str(host.bin / "proxmox-boot-tool"), "status", "--quiet"])
    assert out.returncode == 2 and out.stderr == ""


@pytest.mark.parametrize("firmware", ["bios", "secureboot"])
def test_refresh_on_a_grub_esp_generates_grub_from_etc_default_grub_not_etc_kernel_cmdline(
    host: FakeHost, firmware: str
) -> None:
    # update_esp_func: GRUB when the ESP holds EFI/proxmox/grubx64.efi or the node is not booted with UEFI; it
    # copies the kernel to the ESP and runs update-grub with the ESP bind-mounted on /boot. /etc/kernel/cmdline
    # only feeds systemd-boot's loader entries (copy_and_config_kernels).
    host.proxmox_boot(firmware)
    host.write("etc/kernel/cmdline", "root=ZFS=rpool/ROOT/pve-1 boot=zfs only_for_systemd_boot\n")
    host.write("etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet from_default_grub"\n')
    host.run_quietly("proxmox-boot-tool", "refresh")
    cfg = host.read(f"{ESP}/grub/grub.cfg")
    assert "from_default_grub" in cfg and "only_for_systemd_boot" not in cfg
    assert "\tlinux\t/vmlinuz-6.8.12-4-pve " in cfg  # the ESP is /boot for GRUB
    assert (host.root / ESP / "vmlinuz-6.8.12-4-pve").exists()
    assert not (host.root / ESP / "loader/entries").exists()
    host.reboot()  # the firmware boots the ESP's GRUB
    assert "from_default_grub" in host.read("proc/cmdline")


def test_refresh_on_a_systemd_boot_esp_takes_etc_kernel_cmdline(host: FakeHost) -> None:
    host.proxmox_boot("uefi")
    host.write("etc/kernel/cmdline", "root=ZFS=rpool/ROOT/pve-1 boot=zfs from_kernel_cmdline\nsecond line ignored\n")
    host.write("etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet only_for_grub"\n')
    host.run_quietly("proxmox-boot-tool", "refresh")
    entry = host.read(f"{ESP}/loader/entries/proxmox-6.8.12-4-pve.conf")
    assert "options  root=ZFS=rpool/ROOT/pve-1 boot=zfs from_kernel_cmdline\n" in entry
    assert not (host.root / ESP / "grub").exists()
    host.reboot()
    cmdline = host.read("proc/cmdline")
    assert "from_kernel_cmdline" in cmdline and "only_for_grub" not in cmdline


def test_refresh_refuses_a_kernel_cmdline_without_root(host: FakeHost) -> None:
    # update_esps: 'No root= parameter in /etc/kernel/cmdline found!', exit 1.
    host.proxmox_boot("bios")
    host.write("etc/kernel/cmdline", "boot=zfs\n")
    r = host._call([str(host.bin / "proxmox-boot-tool"), "refresh"])
    assert r.returncode == 1 and r.stderr.endswith("No root= parameter in /etc/kernel/cmdline found!\n")


def test_refresh_skips_an_esp_not_set_up_for_the_firmware(host: FakeHost) -> None:
    # update_esp_func: on UEFI without grubx64.efi an ESP needs loader.conf, otherwise a grub directory; else it
    # warns and skips the ESP (exit 0), and a listed ESP whose device is gone is skipped too.
    host.proxmox_boot("uefi")
    (host.root / ESP / "loader/loader.conf").unlink()
    host.write("etc/kernel/proxmox-boot-uuids", "1234-ABCD\n9999-0000\n")
    r = host._call([str(host.bin / "proxmox-boot-tool"), "refresh"])
    assert r.returncode == 0
    assert "/dev/disk/by-uuid/1234-ABCD contains no loader.conf - skipping" in r.stderr
    assert "WARN: /dev/disk/by-uuid/9999-0000 does not exist" in r.stderr


def test_update_grub_on_a_proxmox_boot_tool_node_runs_refresh(host: FakeHost) -> None:
    # 000_proxmox_boot_header: when `proxmox-boot-tool status --quiet` succeeds and neither dpkg nor refresh
    # (PVE_EFIBOOT_UNSHARED) called it, update-grub warns and runs refresh: /boot/grub/grub.cfg is not booted.
    host.proxmox_boot("bios")
    host.write("etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet direct"\n')
    r = host._call([str(host.bin / "update-grub")])
    assert r.returncode == 0 and "W: Running: 'proxmox-boot-tool refresh'." in r.stderr
    assert [c.strip() for c in r.calls] == ["update-grub", "proxmox-boot-tool refresh", "update-grub"]
    assert "direct" in host.read(f"{ESP}/grub/grub.cfg") and "direct" in host.read("boot/grub/grub.cfg")


def test_secure_boot_state_is_the_efi_variable(host: FakeHost) -> None:
    # efivarfs: 4 attribute bytes, then the value (Documentation/filesystems/efivarfs.rst); SecureBoot is 1 when on.
    var = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
    host.proxmox_boot("secureboot")
    assert (host.root / var).read_bytes()[4:] == b"\x01"
    host.proxmox_boot("uefi")
    assert (host.root / var).read_bytes()[4:] == b"\x00"
    host.proxmox_boot("bios")
    assert not (host.root / "sys/firmware/efi").exists()
