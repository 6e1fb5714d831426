"""Every shipped shell script is shellcheck-clean and runs with `set -euo pipefail`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from components.guest_scripts import STEPS, step_script
from tests.components.scripts.fakeroot import SCRIPTS
from tests.support import external

SHELL_SCRIPTS = sorted(SCRIPTS.glob("*.sh"))


def test_there_are_scripts() -> None:
    assert {p.name for p in SHELL_SCRIPTS} >= {"host_prep.sh", "host_verify.sh"}


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_clean(script: Path) -> None:
    shellcheck = external(Path("/usr/bin/shellcheck"), "shellcheck", "install it with: apt-get install shellcheck")
    proc = subprocess.run(
        [str(shellcheck), "--severity=style", str(script)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_strict_mode(script: Path) -> None:
    lines = script.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert "set -euo pipefail" in lines


def test_shellcheck_would_catch_a_problem(tmp_path: Path) -> None:
    shellcheck = external(Path("/usr/bin/shellcheck"), "shellcheck", "install it with: apt-get install shellcheck")
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nset -euo pipefail\nrm -rf $1/*\n")
    assert subprocess.run([str(shellcheck), str(bad)], capture_output=True, check=False).returncode != 0


@pytest.mark.parametrize("step", STEPS)
def test_guest_steps_as_sent_are_shellcheck_clean(step: str) -> None:
    # What the guest runs is guest_lib.sh + the step: check that text too, not only the files one by one.
    shellcheck = external(Path("/usr/bin/shellcheck"), "shellcheck", "install it with: apt-get install shellcheck")
    proc = subprocess.run(
        [str(shellcheck), "--severity=style", "--shell=bash", "-"],
        input=step_script(step), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("step", STEPS)
def test_guest_steps_run_everything_from_main_with_stdin_closed(step: str) -> None:
    lines = [line for line in step_script(step).splitlines() if line.strip()]
    assert lines[-1] == 'main "$@" </dev/null'
