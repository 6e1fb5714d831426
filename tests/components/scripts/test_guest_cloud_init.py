"""The cloud-init step: Ubuntu 22.04 or 24.04 only, cloud-init finished (recoverable errors are not fatal), and
commands get /dev/null on stdin, never the script."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.components.scripts.fakeguest import FakeGuest


@pytest.fixture
def guest(tmp_path: Path) -> FakeGuest:
    return FakeGuest(tmp_path / "root")


def test_cloud_init_step_refuses_other_systems(guest: FakeGuest) -> None:
    guest.write("etc/os-release", 'ID=debian\nVERSION_ID="12"\n')
    r = guest.step("cloud-init")
    assert r.returncode == 1
    assert r.stderr.strip() == ("cloud-init: operating system: expected Ubuntu 22.04 or 24.04, saw 'debian 12'")


def test_cloud_init_recoverable_errors_are_not_fatal(guest: FakeGuest) -> None:
    guest.stub_script("cloud-init", 'echo "status: degraded done"; exit 2')
    assert guest.step("cloud-init").returncode == 0
    guest.stub_script("cloud-init", 'echo "status: error"; exit 1')
    r = guest.step("cloud-init")
    assert r.returncode == 1 and "expected done, saw exit 1: status: error" in r.stderr


def test_commands_get_dev_null_not_the_script_on_stdin(guest: FakeGuest) -> None:
    # The script itself arrives on stdin; a tool that read stdin must not be able to eat (or run) any of it.
    guest.stub_script("cloud-init", 'readlink /proc/$$/fd/0 > "$PGC_ROOT/cloud-init-stdin"; cat > /dev/null')
    r = guest.step("cloud-init")
    assert r.returncode == 0 and r.stdout.strip() == "cloud-init: done"
    assert guest.read("cloud-init-stdin").strip() == "/dev/null"


def test_ubuntu_2204_is_accepted(guest: FakeGuest) -> None:
    guest.write("etc/os-release", 'ID=ubuntu\nVERSION_ID="22.04"\n')
    assert guest.step("cloud-init").returncode == 0
