"""Every shipped shell script is shellcheck-clean and runs with `set -euo pipefail`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from proxmox_gpu_cluster.render.agent_bundle import KINDS, bundle_files
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


INSTALLED = {step: dict(bundle_files(step))["step.sh"].decode() for kind in KINDS.values() for step in kind}
"""Every step's script as the node agent installs it on a machine: the prologue, the helpers and the step."""


@pytest.mark.parametrize("name", sorted(INSTALLED))
def test_scripts_as_installed_are_shellcheck_clean(name: str) -> None:
    # What a machine runs is the prologue + guest_lib.sh + the step: check that text too, not only the files.
    shellcheck = external(Path("/usr/bin/shellcheck"), "shellcheck", "install it with: apt-get install shellcheck")
    proc = subprocess.run(
        [str(shellcheck), "--severity=style", "--shell=bash", "-"],
        input=INSTALLED[name], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("name", sorted(INSTALLED))
def test_scripts_run_everything_from_main_with_stdin_closed(name: str) -> None:
    # Only the prologue reads stdin (the secrets); every step's work runs from main, whose stdin is /dev/null.
    # The whole script is one brace group (agent_bundle.whole: a file cut short is a syntax error).
    lines = [line for line in INSTALLED[name].splitlines() if line.strip()]
    assert (lines[0], lines[-2], lines[-1]) == ("{", 'main "$@" </dev/null', "}")
