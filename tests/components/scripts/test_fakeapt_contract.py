"""The fake guest's dpkg-query answers the steps' queries in the real one's shape (dpkg 1.21, this machine's: the
steps' formats, each on a single package and, for names, on a pattern). Found by the change matrix in the fake world
(tests/stacks/test_change_matrix_world.py): a single package asked for its name answered its version, so the driver
step's swap of the kernel-module kind asked apt-get to remove "<version>-"."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.components.scripts.fakeguest import FakeGuest

FORMATS = {
    "${db:Status-Abbrev} ${Package}\n": r"[a-z][a-zA-Z] {2}{name}",
    "${db:Status-Abbrev} ${Version}\n": r"[a-z][a-zA-Z] {2}[0-9][^ ]*",
}


def shape(fmt: str, name: str) -> re.Pattern[str]:
    return re.compile(FORMATS[fmt].replace("{name}", re.escape(name)))


def real(*args: str) -> str:
    if shutil.which("dpkg-query") is None:
        pytest.skip("no dpkg-query on this machine (install dpkg)")
    return subprocess.run(["dpkg-query", "-W", *args], capture_output=True, text=True, check=True).stdout


def fake(guest: FakeGuest, *args: str) -> str:
    r = guest.run_stdin('dpkg-query -W "$@"', *args)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_single_package_answers_in_the_format_asked(fmt: str, tmp_path: Path) -> None:
    guest = FakeGuest(tmp_path / "g")
    guest.write("var/lib/fake-dpkg/nvidia-headless-580-server-open", "580.95.05-0ubuntu0.24.04.2")
    assert shape(fmt, "bash").fullmatch(real(f"-f={fmt}", "bash").strip())
    assert shape(fmt, "nvidia-headless-580-server-open").fullmatch(
        fake(guest, f"-f={fmt}", "nvidia-headless-580-server-open").strip()
    )


def test_a_pattern_answers_each_package_by_name(tmp_path: Path) -> None:
    fmt = "${db:Status-Abbrev} ${Package}\n"
    guest = FakeGuest(tmp_path / "g")
    names = real(f"-f={fmt}", "bas*").splitlines()
    assert names and all(re.fullmatch(r"[a-z][a-zA-Z] {2}bas[^ ]*", line) for line in names)
    lines = fake(guest, f"-f={fmt}", "linux-image-*").splitlines()
    assert lines and all(re.fullmatch(r"[a-z][a-zA-Z] {2}linux-image-[^ ]+", line) for line in lines)
