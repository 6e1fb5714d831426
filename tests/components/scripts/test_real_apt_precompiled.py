"""The driver step's choice of kernel module against the REAL apt and dpkg (realapt.py, aptrepo.py): Ubuntu's
precompiled, signed module for the running kernel when the archive has one built against the chosen build (no DKMS
build), DKMS otherwise, and a kernel update keeping the module either way: through the precompiled modules'
flavour metapackage while the archive's modules fit the held build, through DKMS once Ubuntu has moved on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from proxmox_gpu_cluster.render.guest_scripts import driver_args
from tests.components.scripts.aptrepo import (
    KERNELS,
    build,
    driver_source,
    flavour_metapackages,
    precompiled,
    precompiled_flavour,
)
from tests.components.scripts.realapt import RealAptGuest
from tests.components.scripts.test_guest_bootstrap_scripts import spec
from tests.components.scripts.test_real_apt import NEW, OLD, driver, family_at, modules_at, up

pytestmark = pytest.mark.slow


@pytest.fixture
def guest(tmp_path: Path, repo: Path) -> RealAptGuest:
    return RealAptGuest(tmp_path / "root", repo)


NEWER = "580.142.05-0ubuntu0.24.04.1"
"""A build Ubuntu publishes after the node pinned NEW (the archive's precompiled modules then follow it)."""


def publish(guest: RealAptGuest, repo: Path, tmp_path: Path, name: str, *extra: list) -> None:
    """The archive plus ``extra`` packages, as a new snapshot of the mirror the guest reads."""
    newer = tmp_path / name
    newer.mkdir()
    for deb in repo.glob("*.deb"):
        os.link(deb, newer / deb.name)
    guest.publish(build([p for group in extra for p in group], newer))


def dist_upgrade(guest: RealAptGuest) -> None:
    """What unattended-upgrades does (it installs a metapackage's new dependencies, as dist-upgrade does), then the
    kernel's postinst hooks and a boot into the new kernel."""
    r = guest.run_stdin("apt-get update -q && apt-get dist-upgrade -y -q\n")
    assert r.returncode == 0, r.stderr
    guest.write("fake-kernel", KERNELS[1] + "\n")
    guest.run_stdin("update-initramfs -u 2>/dev/null; update-grub 2>/dev/null\n")
    guest.reboot()


def test_the_archive_s_precompiled_module_is_used_without_a_dkms_build(guest: RealAptGuest) -> None:
    out, _ = driver(guest, driverVersion=up(NEW))
    assert f"module precompiled and signed (linux-modules-nvidia-580-server-open-{KERNELS[0]})" in out
    modules_at(guest, NEW, "precompiled")
    status = guest.status()
    assert "dkms" not in status and not [p for p in status if p.startswith("linux-headers")]  # nothing to build
    again = guest.step("driver", *driver_args(spec(driverVersion=up(NEW))))
    assert again.returncode == 0 and "reboot: not-needed" in again.stdout, again.stderr
    assert not [c for c in again.calls if c.startswith(("apt-get", "apt-mark hold", "dpkg --configure"))]


def test_a_build_without_precompiled_modules_gets_dkms(guest: RealAptGuest) -> None:
    out, _ = driver(guest, driverVersion=up(OLD))
    assert f"module built by DKMS (the archive has no precompiled one for kernel {KERNELS[0]} at {up(OLD)})" in out
    modules_at(guest, OLD, "dkms")


def test_a_kernel_update_brings_its_precompiled_module(guest: RealAptGuest, repo: Path, tmp_path: Path) -> None:
    driver(guest, driverVersion=up(NEW))
    # The archive publishes a new kernel, and its precompiled modules against the same build.
    publish(
        guest,
        repo,
        tmp_path,
        "kernel",
        flavour_metapackages(KERNELS[1]),
        precompiled_flavour("580", True, NEW, KERNELS[1]),
    )
    dist_upgrade(guest)
    assert guest.installed(f"linux-modules-nvidia-580-server-open-{KERNELS[1]}") is not None
    r = guest.step("driver", *driver_args(spec(driverVersion=up(NEW))))
    assert r.returncode == 0 and "reboot: not-needed" in r.stdout, r.stderr
    assert not [c for c in r.calls if c.startswith("apt-get install")]
    assert guest.read("sys/module/nvidia/version").strip() == up(NEW)


def test_once_ubuntu_moves_on_the_next_kernel_gets_the_module_from_dkms(
    guest: RealAptGuest, repo: Path, tmp_path: Path
) -> None:
    driver(guest, driverVersion=up(NEW))
    # Ubuntu publishes a newer build; the precompiled modules of every kernel now follow it, not the held one.
    moved = [driver_source("580", True, NEWER), *(precompiled("580", True, NEWER, k) for k in KERNELS)]
    publish(guest, repo, tmp_path, "newer", *moved, precompiled_flavour("580", True, NEWER, KERNELS[0]))
    run = guest.step("driver", *driver_args(spec(driverVersion=up(NEW))))  # the next run of the step
    assert run.returncode == 0 and "reboot: not-needed" in run.stdout, run.stderr
    assert "DKMS builds the module for this and every later kernel" in run.stdout
    family_at(guest, NEW, ("nvidia-dkms-580-server-open", "nvidia-headless-no-dkms-580-server-open"))
    # Then a new kernel (its precompiled module needs NEWER, which the hold keeps out): DKMS builds the held one.
    publish(guest, repo, tmp_path, "kernel", *moved, flavour_metapackages(KERNELS[1]))
    dist_upgrade(guest)
    assert guest.installed(f"linux-modules-nvidia-580-server-open-{KERNELS[1]}") is None
    assert guest.read(f"lib/modules/{KERNELS[1]}/updates/dkms/nvidia.ko").splitlines()[0] == up(NEW)
    again = guest.step("driver", *driver_args(spec(driverVersion=up(NEW))))
    assert again.returncode == 0 and "reboot: not-needed" in again.stdout, again.stderr
    assert guest.read("sys/module/nvidia/version").strip() == up(NEW)


def test_purge_removes_the_precompiled_modules_too(guest: RealAptGuest) -> None:
    driver(guest, driverVersion=up(NEW))
    r = guest.step("driver", *driver_args(spec(driverVersion=up(NEW))), "--purge")
    assert r.returncode == 0, r.stderr
    assert not [p for p in guest.status() if p.startswith(("linux-modules-nvidia", "nvidia-utils", "nvidia-headless"))]
    assert guest.holds() == []


@pytest.mark.parametrize("version", [OLD, NEW], ids=["dkms", "precompiled"])
def test_a_kernel_module_type_swap_at_the_same_build_reboots_into_the_other_kind(
    guest: RealAptGuest, version: str
) -> None:
    """kernelModuleType open -> proprietary -> open at one build: the packages swap (the kernel source packages
    conflict) and, since the loaded module is still the other kind at the same version, the node reboots once."""
    for modules, taint in (("open", "OE"), ("proprietary", "POE"), ("open", "OE")):
        args = driver_args(spec(driverVersion=up(version), kernelModules=modules))
        r = guest.step("driver", *args)
        assert r.returncode == 0, r.stderr
        if guest.read("sys/module/nvidia/taint").strip() != taint:  # the other kind still runs: a reboot
            assert "reboot: scheduled" in r.stdout and f"({modules})" in r.stdout, r.stdout
            guest.reboot()
            again = guest.step("driver", *args)
            assert again.returncode == 0 and "reboot: not-needed" in again.stdout, again.stderr
        assert guest.read("sys/module/nvidia/taint").strip() == taint
        assert guest.read("sys/module/nvidia/version").strip() == up(version)
        suffix = "-open" if modules == "open" else ""
        status = guest.status()
        assert status[f"nvidia-kernel-source-580-server{suffix}"].split()[1] == version
        other = "nvidia-kernel-source-580-server" + ("" if suffix else "-open")
        assert other not in status or not status[other].startswith(("ii", "hi"))
        lrm = [p for p, st in status.items() if p.startswith("linux-modules-nvidia-") and st.startswith(("ii", "hi"))]
        assert all(p.startswith(f"linux-modules-nvidia-580-server{suffix}-") for p in lrm), lrm
        assert all(("-open-" in p) == (modules == "open") for p in lrm), lrm
        held = set(guest.holds())
        assert not [h for h in held if h.startswith("nvidia-headless") and not h.endswith(suffix or "server")], held
