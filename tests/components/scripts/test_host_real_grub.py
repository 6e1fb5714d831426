"""Host prep against the real GRUB config generator (issue 34, section 2): Debian's update-grub / grub-mkconfig
(grub2-common, with /etc/grub.d from it) generates grub.cfg from the /etc/default/grub host prep wrote. It runs for
real, in a private mount namespace where the fake node's /etc/default and /boot are bind-mounted over the machine's
(grub-mkconfig reads the absolute /etc/default/grub, /etc/default/grub.d/*.cfg and /boot/vmlinuz-*); only
grub-probe, which asks the block layer what holds / and /boot, is a stub that answers for one ext4 root partition.
Proved: the arguments host prep writes reach the ``linux`` lines of the generated grub.cfg, and host prep's own
reading of it (the first ``linux`` line: the default entry) agrees with what the real generator wrote, also when a
drop-in in /etc/default/grub.d overrides or extends the variable."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.components.scripts.fakehost import A10, OLD_KERNEL, FakeHost, mutating
from tests.support import external

pytestmark = pytest.mark.slow  # the real grub-mkconfig and host prep: several seconds each

# grub-probe for one ext4 root on /dev/sda2 (grub-mkconfig asks for device, fs, fs_uuid, partuuid, then
# prepare_grub_to_access_device for drive, abstraction, partmap, hints).
GRUB_PROBE = """#!/bin/sh
target=""
for a in "$@"; do case "$a" in --target=*) target="${a#--target=}" ;; esac; done
case "$target" in
device) echo /dev/sda2 ;;
fs) echo ext2 ;;
fs_uuid) echo 0a1b2c3d-0000-4000-8000-000000000001 ;;
partuuid) echo 11111111-02 ;;
drive) echo "(hd0,gpt2)" ;;
*) echo ;;
esac
"""
# update-grub as the node runs it (Debian's /usr/sbin/update-grub: grub-mkconfig -o /boot/grub/grub.cfg), in a
# private mount namespace that shows the fake node's files at the absolute paths grub-mkconfig reads.
REAL_UPDATE_GRUB = """unshare --mount --propagation private sh -c '
mount --bind "$PGC_ROOT/etc/default" /etc/default && mount --bind "$PGC_ROOT/boot" /boot &&
mount --bind "$PGC_ROOT/_stubs/_grub-probe" /usr/sbin/grub-probe &&
PATH=/usr/sbin:/usr/bin:/sbin:/bin /usr/sbin/update-grub'"""


def unshare_works() -> None:
    r = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        external(Path("/nonexistent/unshare-mount"), "a private mount namespace (unshare --mount, as root)", r.stderr)


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    """Intel on kernel 6.5 on plain GRUB (ext4): its IOMMU is off until intel_iommu=on, so host prep must get the
    argument into grub.cfg; its update-grub is Debian's."""
    external(Path("/usr/sbin/grub-mkconfig"), "grub-mkconfig", "install it with: apt-get install grub2-common")
    external(
        Path("/etc/grub.d/10_linux"), "GRUB's /etc/grub.d/10_linux", "install it with: apt-get install grub2-common"
    )
    unshare_works()
    h = FakeHost(tmp_path / "root", cpu="intel", kernel=OLD_KERNEL)
    h.write("boot/vmlinuz-6.8.12-4-pve", "")  # 10_linux lists /boot/vmlinuz-* with their initrd.img-*
    probe = h.write("_stubs/_grub-probe", GRUB_PROBE)
    probe.chmod(0o755)
    h.stub_script("update-grub", REAL_UPDATE_GRUB)
    return h


def linux_lines(host: FakeHost) -> list[str]:
    return re.findall(r"^\s*linux\s+(.*)$", host.read("boot/grub/grub.cfg"), re.M)


def test_the_arguments_reach_the_real_grub_cfg_and_host_prep_reads_it_right(host: FakeHost) -> None:
    r = host.prep(A10)
    assert r.returncode == 0, r.stderr
    assert "Found linux image: /boot/vmlinuz-6.8.12-4-pve" in r.stderr  # the real generator's own words
    lines = linux_lines(host)
    assert len(lines) == 3  # the default entry, then the advanced submenu's normal and recovery entries
    assert all(line.split()[-3:] == ["quiet", "iommu=soft", "intel_iommu=on"] for line in lines[:2]), lines
    assert "intel_iommu=on" not in lines[2]  # recovery: GRUB_CMDLINE_LINUX only, as 10_linux writes it
    assert r.stdout.splitlines()[-1].startswith("reboot: scheduled")
    # The node boots the real default entry: the argument is active, and host prep, reading the same grub.cfg,
    # finds nothing to do (had its reading disagreed with the generator's output, it would regenerate or reboot).
    assert host.reboot_if_scheduled()
    assert host.read("proc/cmdline").split()[-1] == "intel_iommu=on"
    r = host.prep(A10)
    assert r.returncode == 0 and r.stdout.strip() == "reboot: not-needed" and mutating(r.calls) == [], r.stderr


def test_a_drop_in_that_overrides_the_variable_is_caught_from_the_real_output(host: FakeHost) -> None:
    host.write("etc/default/grub.d/installer.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    r = host.prep(A10)
    assert r.returncode == 1 and not any(c.startswith("systemd-run") for c in r.calls)
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "host-prep: boot-config: expected intel_iommu=on in the first linux line of /boot/grub/grub.cfg after "
            "update-grub, saw '/"
        )
    )
    assert all("intel_iommu=on" not in line for line in linux_lines(host))  # the real generator agrees


def test_a_drop_in_that_extends_the_variable_keeps_the_arguments(host: FakeHost) -> None:
    host.write(
        "etc/default/grub.d/extra.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT mitigations=auto"\n'
    )
    r = host.prep(A10)
    assert r.returncode == 0, r.stderr
    assert linux_lines(host)[0].split()[-2:] == ["intel_iommu=on", "mitigations=auto"]
    assert host.reboot_if_scheduled() and "intel_iommu=on" in host.read("proc/cmdline")
    assert mutating(host.prep(A10).calls) == []
