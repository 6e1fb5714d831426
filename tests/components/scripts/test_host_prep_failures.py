"""host_prep.sh and host_verify.sh when things go wrong: full disks and read-only files, failing update-grub /
update-initramfs / proxmox-boot-tool, a GRUB drop-in that overrides the arguments, a reboot that came back without
them, unexpected command failures (ERR trap), and two runs at once on one node (the lock)."""

from __future__ import annotations

import fcntl
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.components.scripts.fakehost import A10, BOOT, CLAIMS, GRUB, OLD_KERNEL, OWNER, FakeHost, mutating
from tests.components.scripts.fakeroot import _STEP_OF

LOCK = "run/lock/proxmox-gpu-cluster.lock"
BOOT_ID_2 = "59e06cf8-f390-5093-af2e-3685be593a25"  # the fake's second boot
LINE = r"^(host-prep|host-verify|large-bar): [^:]+: expected .+, saw .+$"


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    """An Intel node on Proxmox VE 8.1's kernel 6.5: its IOMMU is off until intel_iommu=on (the one case left in
    which host prep reboots for the IOMMU; test_host_iommu.py has the others)."""
    return FakeHost(tmp_path / "root", cpu="intel", kernel=OLD_KERNEL)


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def test_a_full_disk_fails_the_write_and_keeps_the_old_file(host: FakeHost) -> None:
    # ext4's delayed allocation reports ENOSPC at fsync: coreutils sync says so and exits 1
    host.stub_script(
        "sync",
        """case "$1" in *grub.pgc-*)
  echo "sync: error syncing '$1': No space left on device" >&2; exit 1 ;; esac
exec /usr/bin/sync "$@\"""",
    )
    r = host.prep(A10)
    assert r.returncode == 1
    assert last_line(r.stderr).startswith("host-prep: write: expected /etc/default/grub written, saw sync: error ")
    assert last_line(r.stderr).endswith(": No space left on device")
    assert host.read("etc/default/grub") == GRUB and not list((host.root / "etc/default").glob("grub.pgc-*"))
    assert not any(c.startswith(("update-grub", "systemd-run")) for c in r.calls)
    (host.bin / "sync").unlink()  # space freed: the next run writes, regenerates and reboots
    r = host.prep(A10)
    assert r.returncode == 0 and "changed: /etc/default/grub" in r.stdout and "update-grub " in r.calls
    host.reboot()
    assert "intel_iommu=on" in host.read("proc/cmdline")


def test_a_read_only_file_system_fails_naming_the_file(host: FakeHost) -> None:
    # Read-only below /etc: the agent's store (in the SSH user's home) is written, host prep's first file is not.
    host.stub_script(
        "mktemp",
        """case "$*" in *.pgc-*) ;; *) exec /usr/bin/mktemp "$@" ;; esac
echo "mktemp: failed to create file via template '$1': Read-only file system" >&2
exit 1""",
    )
    r = host.prep(A10)
    assert r.returncode == 1 and mutating(r.calls) == []
    line = last_line(r.stderr)
    # The owner's claim is the first file written (before any host-wide one).
    assert line.startswith(f"host-prep: write: expected a temporary file next to /{CLAIMS}/{OWNER}.conf, saw mktemp: ")
    assert line.endswith(f"/{OWNER}.conf.pgc-XXXXXX': Read-only file system")


def test_a_read_only_home_fails_in_one_line_before_anything_changes(host: FakeHost) -> None:
    # The whole root read-only: the agent cannot install the step's bundle into its store, and says so.
    host.stub_script(
        "mktemp",
        """echo "mktemp: failed to create directory via template '$2': Read-only file system" >&2
exit 1""",
    )
    r = host.prep(A10)
    assert r.returncode == 1 and mutating(r.calls) == []
    line = last_line(r.stderr)
    assert line.startswith("host-prep: agent: expected a new bundle directory in ") and "saw mktemp: " in line
    assert line.endswith(": Read-only file system")


@pytest.mark.parametrize(("tool", "name"), [("update-grub", "boot-loader"), ("update-initramfs", "initramfs")])
def test_a_failing_regeneration_says_so_and_is_redone(host: FakeHost, tool: str, name: str) -> None:
    real = (host.bin / tool).read_text()
    host.stub_script(tool, 'echo "E: mkinitramfs failure cpio 141 zstd -q -9 -T0 141" >&2; exit 1')
    r = host.prep(A10)
    assert r.returncode == 1 and not any(c.startswith("systemd-run") for c in r.calls)
    assert r.stderr.splitlines()[-2:] == [
        f"host-prep: {name}: expected '{tool}{' -u -k all' if name == 'initramfs' else ''}' to exit 0, saw exit 1 "
        "(the next run redoes it; its output follows)",
        "E: mkinitramfs failure cpio 141 zstd -q -9 -T0 141",
    ]
    assert (host.root / f"var/lib/proxmox-gpu-cluster/{name}-pending").exists()
    (host.bin / tool).write_text(real)
    r = host.prep(A10)
    assert r.returncode == 0 and any(c.startswith(tool) for c in r.calls) and "changed: " not in r.stdout
    host.reboot()
    assert host.driver_of("0000:41:00.0") == "vfio-pci" and host.verify(A10[0]).returncode == 0


def test_a_failing_proxmox_boot_tool_is_redone(host: FakeHost) -> None:
    host.proxmox_boot("uefi")
    real = (host.bin / "proxmox-boot-tool").read_text()
    host.prepend(
        "proxmox-boot-tool",
        """[ "$1" != refresh ] || { echo "mount: /var/tmp/espmounts/1234-ABCD: special device \
/dev/disk/by-uuid/1234-ABCD does not exist." >&2; exit 32; }""",
    )
    r = host.prep(A10)
    assert r.returncode == 1 and last_line(r.stderr).startswith("mount: /var/tmp/espmounts/1234-ABCD")
    assert r.stderr.splitlines()[-2].startswith(
        "host-prep: boot-loader: expected 'proxmox-boot-tool refresh' to exit 0, saw exit 32"
    )
    (host.bin / "proxmox-boot-tool").write_text(real)
    r = host.prep(A10)
    assert r.returncode == 0 and "proxmox-boot-tool refresh" in r.calls and r.stdout.startswith("reboot: scheduled")
    assert host.reboot_if_scheduled() and "intel_iommu=on" in host.read("proc/cmdline")


def test_a_grub_drop_in_that_overrides_the_arguments_fails_before_any_reboot(host: FakeHost) -> None:
    host.write("etc/default/grub.d/installer.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    r = host.prep(A10)
    assert r.returncode == 1 and not any(c.startswith("systemd-run") for c in r.calls)
    assert last_line(r.stderr) == (
        "host-prep: boot-config: expected intel_iommu=on in the first linux line of /boot/grub/grub.cfg "
        "after update-grub, saw '/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro quiet' (does a file in "
        "/etc/default/grub.d set GRUB_CMDLINE_LINUX_DEFAULT?)"
    )


def test_a_reboot_that_came_back_without_the_arguments_is_not_repeated(host: FakeHost) -> None:
    # The node boots with systemd-boot, but the spec says GRUB: the reboot boots the ESP entry, not grub.cfg.
    host.proxmox_boot("uefi")
    r = host.prep(A10, boot_loader="grub")
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith("reboot: scheduled")
    assert host.reboot_if_scheduled() and "intel_iommu=on" not in host.read("proc/cmdline")
    r = host.prep(A10, boot_loader="grub")
    assert r.returncode == 1 and mutating(r.calls) == []  # no second reboot
    line = last_line(r.stderr)
    assert line.startswith("host-prep: reboot: expected intel_iommu=on in /proc/cmdline after the reboot host ")
    assert "saw 'initrd=" in line and "not rebooting again" in line and "--boot-loader grub" in line
    r = host.verify(A10[0])  # what Pulumi runs right after the reboot
    assert r.returncode == 1 and last_line(r.stderr).startswith(
        "host-verify: iommu: expected entries in /sys/kernel/iommu_groups (an active IOMMU), saw none"
    )
    assert last_line(r.stderr).endswith(
        f"; the reboot host prep scheduled (in boot {BOOT_ID_2}) came back without it: the node boots something "
        "other than the configuration host prep generated (is its bootLoader right?)"
    )
    # Fixed (the boot loader it really uses): a new boot configuration is worth a new reboot, which works.
    r = host.prep(A10, boot_loader="auto")
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith("reboot: scheduled"), r.stderr
    assert host.reboot_if_scheduled() and "intel_iommu=on" in host.read("proc/cmdline")
    assert mutating(host.prep(A10).calls) == []


def test_an_unexpected_failure_names_the_command(host: FakeHost) -> None:
    (host.root / "proc/cmdline").unlink()
    r = host.prep(A10)
    assert r.returncode == 1
    assert last_line(r.stderr) == (
        'host-prep: running="$(cat "$ROOT/proc/cmdline")" failed: expected exit 0, saw exit 1'
    )
    r = host.verify(A10[0])
    assert r.returncode == 1
    assert last_line(r.stderr) == (
        'host-verify: running="$(cat "$ROOT/proc/cmdline")" failed: expected exit 0, saw exit 1'
    )


def run_with(host: FakeHost, script: str, *args: str, **env: str) -> subprocess.Popen[str]:
    base = {"PATH": f"{host.bin}:/usr/bin:/bin", "PGC_ROOT": str(host.root), "LC_ALL": "C"}
    bundle = host.install_bundle(_STEP_OF[script])  # the step as the node agent installs it
    return subprocess.Popen(["bash", str(bundle / "step.sh"), *args], env=base | env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip


PREP_ARGS = ("--owner", OWNER, "--cpu-vendor", "intel", "--boot-loader", "auto", "--acs-override", "0", "--reboot-policy", "when-idle",
             "--gpu", "0000:41:00=10de:2236")  # fmt: skip


def test_two_runs_at_once_take_turns(host: FakeHost) -> None:
    host.prepend("update-initramfs", "sleep 0.5")
    runs = [run_with(host, "host_prep.sh", *PREP_ARGS) for _ in range(2)]
    outs = [run.communicate(timeout=60) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outs
    calls = host.log.read_text().splitlines()
    # Unserialised, both would have seen the files differ and rebuilt; the second saw the first's result.
    assert sum(c.startswith("update-initramfs") for c in calls) == 1
    assert sum(c.startswith("update-grub") for c in calls) == 1


def test_a_held_lock_is_waited_for_then_the_wait_ends_naming_the_holder(host: FakeHost) -> None:
    lock = host.write(LOCK, "large-bar 2102 (pid 4242) since 2026-11-24T03:00:00Z\n")
    with lock.open("r+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        release = threading.Timer(1.0, fcntl.flock, (held, fcntl.LOCK_UN))
        release.start()
        started = time.monotonic()
        out, err = run_with(host, "host_prep.sh", *PREP_ARGS).communicate(timeout=60)
        release.join()
        assert time.monotonic() - started >= 0.9 and out.splitlines()[-1].startswith("reboot: scheduled"), err
        fcntl.flock(held, fcntl.LOCK_EX)  # held again, as a large-BAR step holds it, for longer than the wait
        lock.write_text("large-bar 2102 (pid 4242) since 2026-11-24T03:00:00Z\n")
        for script, args in [("host_prep.sh", PREP_ARGS), ("host_verify.sh", ("--gpu", "0000:41:00")),
                             ("large_bar.sh", ("2102", "65536"))]:  # fmt: skip
            run = run_with(host, script, *args, PGC_LOCK_WAIT="1")
            err = run.communicate(timeout=60)[1]
            step = script.removesuffix(".sh").replace("_", "-")
            assert run.returncode == 1, err
            assert err == (
                f"{step}: lock: expected /{LOCK} free within 1s, saw it held by large-bar 2102 (pid 4242) since "
                "2026-11-24T03:00:00Z\n"
            )


def test_every_failure_line_has_the_format(host: FakeHost) -> None:
    host.guests("VM 3101 gpu-a100-a running")
    for r in (host.prep(A10), host.prep(("0000:99:00", "10de:2236")), host.verify(A10[0])):
        assert r.returncode == 1 and re.match(LINE, last_line(r.stderr)), r.stderr
    assert BOOT in host.read("proc/cmdline")


@pytest.mark.parametrize("at", ["update-initramfs", "update-grub"])
def test_regression_killed_between_writing_the_files_and_regenerating(host: FakeHost, at: str) -> None:
    # Issue 23: killed after the files were written but before update-grub ran, later runs saw no file change,
    # never ran update-grub, yet rebooted every time into the old command line.
    host.fault(1 if at == "update-initramfs" else 2, "kill")
    r = host.prep(A10)
    assert r.returncode != 0 and host.fault_hit() is not None and host.fault_hit().startswith(at)  # type: ignore[union-attr]
    assert 'intel_iommu=on"' in host.read("etc/default/grub")  # the file is written
    host.fault(None)
    r = host.prep(A10)
    assert r.returncode == 0 and "update-grub " in r.calls and r.stdout.splitlines()[-1].startswith("reboot: scheduled")
    assert host.reboot_if_scheduled() and "intel_iommu=on" in host.read("proc/cmdline")
    assert host.driver_of("0000:41:00.0") == "vfio-pci"
    r = host.prep(A10)
    assert r.stdout == "reboot: not-needed\n" and mutating(r.calls) == []
