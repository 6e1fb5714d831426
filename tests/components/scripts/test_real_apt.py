"""The driver step against the REAL apt and dpkg (realapt.py) and an archive in the shape of Ubuntu's NVIDIA archive
(aptrepo.py, built once per session with dpkg-deb and apt-ftparchive): pin an older build, upgrade, downgrade, roll
back, hold, refuse a retired branch, repair a killed install, purge. Also the contract of the fake apt's downgrade
refusal (fakeguest_tools.py), checked against the real one. Slow: the archive takes ~10 s to build here."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from proxmox_gpu_cluster.render.guest_scripts import driver_args
from tests.components.scripts.aptrepo import (
    BUILDS,
    KERNELS,
    TOOLKIT_BUILDS,
    build,
    flavour_metapackages,
)
from tests.components.scripts.fakeguest import MUTATING, FakeGuest
from tests.components.scripts.fakeroot import SCRIPTS
from tests.components.scripts.realapt import RealAptGuest
from tests.components.scripts.test_guest_bootstrap_scripts import spec

pytestmark = pytest.mark.slow

OLD, MID, NEW = BUILDS["580"]
"""580.95.05, 580.105.08 and 580.126.20 (the newest the archive has)."""
FAMILY_OPEN = (
    "nvidia-headless-580-server-open",
    "nvidia-headless-no-dkms-580-server-open",
    "nvidia-dkms-580-server-open",
    "nvidia-kernel-source-580-server-open",
    "nvidia-utils-580-server",
    "libnvidia-compute-580-server",
    "nvidia-compute-utils-580-server",
    "libnvidia-cfg1-580-server",
    "nvidia-kernel-common-580-server",
)
"""The packages of one 580-server build a headless install of the open modules brings (aptrepo.driver_source)."""
PRECOMPILED_OPEN = (
    "nvidia-headless-no-dkms-580-server-open",
    *(p for p in FAMILY_OPEN if p not in ("nvidia-headless-580-server-open", "nvidia-dkms-580-server-open")),
)
"""The same build with Ubuntu's precompiled module: no DKMS metapackage, no nvidia-dkms."""
HOLDS = {
    "dkms": {"nvidia-headless-580-server-open", "nvidia-utils-580-server"},
    "precompiled": {"nvidia-headless-no-dkms-580-server-open", "nvidia-utils-580-server"},
}


def up(version: str) -> str:
    return version.split("-", maxsplit=1)[0]


@pytest.fixture
def guest(tmp_path: Path, repo: Path) -> RealAptGuest:
    return RealAptGuest(tmp_path / "root", repo)


def driver(guest: RealAptGuest, **overrides: object) -> tuple[str, str]:
    """Run the driver step, reboot when it asks and run it again (as the next run does; it must need nothing);
    (stdout, stderr) of the first run, which must succeed."""
    args = driver_args(spec(**overrides))
    r = guest.step("driver", *args)
    assert r.returncode == 0, r.stderr
    if guest.reboot_scheduled():
        guest.reboot()
        again = guest.step("driver", *args)
        assert again.returncode == 0 and "reboot: not-needed" in again.stdout, again.stderr
    return r.stdout, r.stderr


def family_at(guest: RealAptGuest, version: str, family: tuple[str, ...] = FAMILY_OPEN) -> None:
    status = guest.status()
    held = set(guest.holds())
    want = {p: f"{'h' if p in held else 'i'}i {version}" for p in family}  # held: "hi" (dpkg-query(1))
    assert {p: status.get(p) for p in family} == want
    assert guest.read("sys/module/nvidia/version").strip() == up(version)  # the DKMS-built module runs


def modules_at(guest: RealAptGuest, version: str, kind: str) -> None:
    """The node runs ``version`` with its module from DKMS or precompiled, and nothing of the other kind."""
    status, kernel = guest.status(), guest.read("fake-kernel").strip()
    lrm = [p for p in status if p.startswith("linux-modules-nvidia-")]
    dkms_ko = guest.root / f"lib/modules/{kernel}/updates/dkms/nvidia.ko"
    if kind == "dkms":
        family_at(guest, version)
        assert lrm == [] and dkms_ko.exists()
    else:
        family_at(guest, version, PRECOMPILED_OPEN)
        assert not [p for p in status if p.startswith(("nvidia-dkms", "nvidia-headless-580"))]
        assert sorted(lrm) == [f"linux-modules-nvidia-580-server-open-{k}" for k in (kernel, "generic")]
        assert not dkms_ko.exists()
        assert guest.read(f"lib/modules/{kernel}/kernel/nvidia-580srv-open/nvidia.ko").splitlines()[0] == up(version)
    assert set(guest.holds()) == HOLDS[kind]


def test_the_old_command_cannot_pin_an_older_build(guest: RealAptGuest) -> None:
    # What the step ran before: the driver and utilities at the pin, the rest left to apt. Real apt will not pick
    # an older build of an unversioned dependency by itself, so a pin stops working when a newer build appears.
    r = guest.run_stdin(
        f"apt-get update -q >/dev/null && apt-get install -y -q --allow-change-held-packages "
        f"nvidia-headless-580-server-open={OLD} nvidia-utils-580-server={OLD}\n"
    )
    assert r.returncode == 100
    assert "Unable to correct problems" in r.stderr
    assert f"nvidia-kernel-common-580-server-{up(OLD)}" in r.stdout  # utils' exact dependency, unmet


def test_pinning_an_older_build_installs_its_whole_family(guest: RealAptGuest) -> None:
    out, _ = driver(guest, driverVersion=up(OLD))
    assert f"driver: nvidia-headless-580-server-open {OLD} (installed)" in out
    family_at(guest, OLD)
    assert set(guest.holds()) == {"nvidia-headless-580-server-open", "nvidia-utils-580-server"}
    assert "nvidia-dkms-580-server" not in guest.status()  # the open modules only
    again = guest.step("driver", *driver_args(spec(driverVersion=up(OLD))))
    assert again.returncode == 0 and "reboot: not-needed" in again.stdout
    assert not [c for c in again.calls if c.startswith(("apt-get", "dpkg --configure", "apt-mark hold"))]


def test_upgrade_downgrade_and_roll_back_under_holds(guest: RealAptGuest) -> None:
    # The newest build has precompiled modules, the older ones only DKMS: each pin change also switches the kind.
    driver(guest, driverVersion=up(OLD))
    for version in (NEW, MID, NEW, OLD):  # up, down (below the newest), back up, down to the first
        out, _ = driver(guest, driverVersion=up(version))
        assert "(installed)" in out
        modules_at(guest, version, "precompiled" if version == NEW else "dkms")
    # What unattended-upgrades / apt-get upgrade would do: the held driver keeps its whole family where it is.
    r = guest.run_stdin("apt-get upgrade -y -q\n")
    assert r.returncode == 0, r.stderr
    family_at(guest, OLD)


def test_lowering_the_pin_needs_allow_downgrades_in_real_apt_and_in_the_fake(
    guest: RealAptGuest, tmp_path: Path
) -> None:
    # The contract of the fake apt (fakeguest_tools.py): the same command, the same refusal, as the real apt.
    driver(guest, driverVersion=up(MID))
    pkgs = " ".join(f"{p}={OLD}" for p in FAMILY_OPEN)
    real = guest.run_stdin(f"apt-get install -y -q --allow-change-held-packages {pkgs}\n")
    fake = FakeGuest(tmp_path / "fake")
    fake.run_stdin("apt-get install -y -q nvidia-utils-580-server=580.105.08-0ubuntu0.24.04.1\n")
    fake_down = fake.run_stdin(
        "apt-get install -y -q --allow-change-held-packages nvidia-utils-580-server=580.95.05-0ubuntu0.24.04.2\n"
    )
    line = "E: Packages were downgraded and -y was used without --allow-downgrades."
    assert (real.returncode, fake_down.returncode) == (100, 100)
    assert line in real.stderr and line in fake_down.stderr
    family_at(guest, MID)  # nothing changed


@pytest.mark.parametrize("version", [None, "565.57.01"], ids=["branch", "version"])
def test_a_retired_branch_is_refused_before_anything_is_installed(guest: RealAptGuest, version: str | None) -> None:
    r = guest.step("driver", *driver_args(spec(driverBranch="565", driverVersion=version)))
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == (
        "driver: nvidia-headless-565-server-open 565.57.01-0ubuntu1.24.04.1: expected the 565 driver, saw a "
        "transitional package to the 580 branch (nvidia-headless-580-server-open): branch 565 is retired; pin "
        "driverBranch 580"
    )
    assert not [c for c in r.calls if c.startswith("apt-get install")]
    assert not any(p.startswith(("nvidia", "libnvidia")) for p in guest.status())


def test_a_branch_pin_installs_the_newest_build_of_another_flavour(guest: RealAptGuest) -> None:
    out, _ = driver(guest, driverVersion=None, driverFlavor="desktop", kernelModules="proprietary")
    newest = BUILDS["580"][-1]
    family = ("nvidia-headless-no-dkms-580", "nvidia-kernel-source-580")
    family_at(guest, newest, (*family, "nvidia-utils-580", "libnvidia-compute-580", "nvidia-kernel-common-580"))
    assert set(guest.holds()) == {"nvidia-headless-no-dkms-580", "nvidia-utils-580"}
    assert {p for p in guest.status() if p.startswith("linux-modules-nvidia")} == {
        f"linux-modules-nvidia-580-{KERNELS[0]}",  # the proprietary modules, not the server flavour's
        "linux-modules-nvidia-580-generic",
    }
    assert "(installed)" in out and "module precompiled and signed" in out


def test_a_kill_between_unpacking_and_configuring_is_repaired(guest: RealAptGuest) -> None:
    guest.kill_apt_after_unpack()
    killed = guest.step("driver", *driver_args(spec()))
    assert killed.returncode == -9
    unpacked = {p: s for p, s in guest.status().items() if p in FAMILY_OPEN}
    assert unpacked and all(s.startswith("iU") for s in unpacked.values())  # dpkg's state, not a model's
    out, _ = driver(guest)
    assert "dpkg: finishing an interrupted install" in out
    family_at(guest, OLD)


def test_purge_removes_the_driver_and_its_holds_and_leaves_its_dependencies_to_autoremove(guest: RealAptGuest) -> None:
    driver(guest)
    manual = set(guest.run_stdin("apt-mark showmanual\n").stdout.split())
    # As a plain install would: only what was asked for is manual; the rest of the family are dependencies.
    assert {p for p in manual if "nvidia" in p} == {"nvidia-headless-580-server-open", "nvidia-utils-580-server"}
    r = guest.step("driver", *driver_args(spec()), "--purge")
    assert r.returncode == 0, r.stderr
    status = guest.status()
    assert "nvidia-headless-580-server-open" not in status and "nvidia-utils-580-server" not in status
    assert guest.holds() == []
    gone = guest.run_stdin("apt-get autoremove --purge -y -q\n")
    assert gone.returncode == 0, gone.stderr
    assert not [p for p in guest.status() if "nvidia" in p]
    assert not (guest.root / f"lib/modules/{KERNELS[0]}/updates/dkms/nvidia.ko").exists()  # dkms remove


def test_a_kernel_update_brings_its_headers_and_dkms_builds_the_module(
    guest: RealAptGuest, repo: Path, tmp_path: Path
) -> None:
    driver(guest, driverVersion=up(OLD))
    # The archive publishes a new kernel: the flavour metapackages now depend on its image and headers.
    newer = tmp_path / "repo-kernel"
    newer.mkdir()
    for deb in repo.glob("*.deb"):
        os.link(deb, newer / deb.name)
    guest.publish(build(flavour_metapackages(KERNELS[1]), newer))
    # What unattended-upgrades does (it installs a metapackage's new dependencies, as dist-upgrade does).
    r = guest.run_stdin("apt-get update -q && apt-get dist-upgrade -y -q\n")
    assert r.returncode == 0, r.stderr
    status = guest.status()
    assert status[f"linux-headers-{KERNELS[1]}"].startswith("ii ") and status[f"linux-image-{KERNELS[1]}"]
    family_at(guest, OLD)  # the held driver and its family stay
    assert guest.read(f"lib/modules/{KERNELS[1]}/updates/dkms/nvidia.ko").splitlines()[0] == up(OLD)
    guest.write("fake-kernel", KERNELS[1] + "\n")  # the kernel's postinst hooks: initramfs and grub.cfg
    guest.run_stdin("update-initramfs -u 2>/dev/null; update-grub 2>/dev/null\n")
    guest.reboot()
    r = guest.step("driver", *driver_args(spec(driverVersion=up(OLD))))
    assert r.returncode == 0 and "reboot: not-needed" in r.stdout, r.stderr
    assert not [c for c in r.calls if c.startswith("apt-get install")]
    assert guest.read("sys/module/nvidia/version").strip() == up(OLD)


def test_the_toolkit_pin_goes_down_and_up_under_holds(guest: RealAptGuest) -> None:
    # The runtime step's package work (guest_runtime.sh: the four toolkit packages at the pin, then held) through
    # guest_lib.sh's apt_install and hold, with the real apt: the lower pin is a downgrade of held packages.
    pkgs = (
        "nvidia-container-toolkit",
        "nvidia-container-toolkit-base",
        "libnvidia-container-tools",
        "libnvidia-container1",
    )
    lib = (SCRIPTS / "guest_lib.sh").read_text()
    for version in (TOOLKIT_BUILDS[1], TOOLKIT_BUILDS[0], TOOLKIT_BUILDS[1]):  # install, lower, raise again
        pinned = " ".join(f"{p}={version}" for p in pkgs)
        r = guest.run_stdin(f"{lib}\napt_install {pinned}\nhold {' '.join(pkgs)}\n")
        assert r.returncode == 0, r.stderr
        status = guest.status()
        assert {p: status[p] for p in pkgs} == {p: f"hi {version}" for p in pkgs}


def test_the_fake_apt_cache_answers_as_the_real_one(guest: RealAptGuest, tmp_path: Path) -> None:
    # The contract of the fake apt-cache (fakeguest_tools.py) for what the driver step asks it: a record per
    # version the archive has, nothing for a version it lacks, "E: No packages found" (exit 100) for a package it
    # does not know, madison newest first.
    fake = FakeGuest(tmp_path / "fake")
    guest.run_stdin("apt-get update -q\n")
    for tool in (guest, fake):
        hit = tool.run_stdin(f"apt-cache show nvidia-utils-580-server={OLD} nvidia-utils-580-server=1.0-1\n")
        assert hit.returncode == 0
        assert [line for line in hit.stdout.splitlines() if line.startswith(("Package:", "Version:"))] == [
            "Package: nvidia-utils-580-server",
            f"Version: {OLD}",
        ]
        miss = tool.run_stdin("apt-cache show nvidia-utils-580-server=1.0-1\n")
        assert (miss.returncode, miss.stdout.strip(), miss.stderr.strip()) == (0, "", "")
        unknown = tool.run_stdin("apt-cache show nvidia-utils-581-server=1.0-1\n")
        assert (unknown.returncode, unknown.stderr.strip()) == (100, "E: No packages found")
        madison = tool.run_stdin("apt-cache madison nvidia-utils-580-server\n").stdout.splitlines()
        versions = [line.split("|")[1].strip() for line in madison]
        assert versions == sorted(versions, key=lambda v: tuple(int(x) for x in up(v).split(".")), reverse=True)


@pytest.mark.parametrize(("start", "pin"), [(NEW, OLD), (OLD, NEW)], ids=["to-dkms", "to-precompiled"])
def test_a_kill_at_any_command_of_a_pin_change_converges(
    guest: RealAptGuest, tmp_path: Path, start: str, pin: str
) -> None:
    # The fault injection of guest_harness.py, for the driver step's package work with the real apt and dpkg: the
    # step killed at each command it runs (apt's own dpkg calls included), then run again as the next `pulumi up`
    # does, must reach the uninterrupted run's packages, holds and module, and a further run changes nothing. The
    # pin change also switches the module's kind (the newest build has precompiled modules, the oldest does not).
    driver(guest, driverVersion=up(start))
    args = driver_args(spec(driverVersion=up(pin)))
    ref = RealAptGuest.copy(guest, tmp_path / "ref")
    calls = ref.step("driver", *args).calls
    # Every command that changes something, apt's own dpkg runs among them (a kill at a read-only query is the
    # same as one at the next change); the whole list is guest_harness.py's work with the fake apt.
    points = [n for n, c in enumerate(calls, 1) if c.startswith(MUTATING) or c.startswith("dpkg --force-confdef")]
    if ref.reboot_scheduled():
        ref.reboot()
    want = (ref.status(), sorted(ref.holds()), ref.read("sys/module/nvidia/version"))
    failures = []
    assert len(points) > 5, calls
    for n in points:
        case = RealAptGuest.copy(guest, tmp_path / f"case-{n}")
        case.fault(n, "kill")
        case.step("driver", *args)
        hit = case.fault_hit()
        case.fault(None)
        for _ in range(2):  # the next run, and the boot it may schedule
            if case.reboot_scheduled():
                case.reboot()
            again = case.step("driver", *args)
            if again.returncode != 0:
                failures.append(f"#{n} {hit}: {again.stderr.strip()[-300:]}")
                break
        else:
            got = (case.status(), sorted(case.holds()), case.read("sys/module/nvidia/version"))
            if got != want or "reboot: not-needed" not in again.stdout:
                failures.append(f"#{n} {hit}: ended at {got[0].get('nvidia-utils-580-server')}, {got[1]}")
        shutil.rmtree(case.root)
    assert not failures, f"{len(failures)} of {len(points)} kills did not converge:\n" + "\n".join(failures)
