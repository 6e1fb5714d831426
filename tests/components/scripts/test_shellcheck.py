"""Every shipped shell script is shellcheck-clean and runs with `set -euo pipefail`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from proxmox_gpu_cluster.render.guest_scripts import STEPS, drain_script, mig_script, retire_stdin, step_script
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


SENT = {**{step: step_script(step) for step in STEPS}, "drain": drain_script(), "mig": mig_script()}
"""Every script text a guest runs as it is sent: the helpers + the step."""


@pytest.mark.parametrize("name", sorted(SENT))
def test_scripts_as_sent_are_shellcheck_clean(name: str) -> None:
    # What a guest runs is guest_lib.sh + the step: check that text too, not only the files one by one.
    shellcheck = external(Path("/usr/bin/shellcheck"), "shellcheck", "install it with: apt-get install shellcheck")
    proc = subprocess.run(
        [str(shellcheck), "--severity=style", "--shell=bash", "-"],
        input=SENT[name], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("name", sorted(SENT))
def test_scripts_run_everything_from_main_with_stdin_closed(name: str) -> None:
    lines = [line for line in SENT[name].splitlines() if line.strip()]
    assert lines[-1] == 'main "$@" </dev/null'


def test_retire_stdin_carries_its_values_verbatim_and_runs_from_main(tmp_path: Path) -> None:
    # The assignments at the top are data (shlex-quoted), not code: bash must read back exactly what was given,
    # even a value made to look like code, and the host script still runs only from main with stdin closed.
    hostile = "apiVersion: v1\n# '$(touch " + str(tmp_path / "pwned") + ")' `id` \\\" ${HOME}\n"
    text = retire_stdin(hostile)
    assert [line for line in text.splitlines() if line.strip()][-1] == 'main "$@" </dev/null'
    probe = (
        text[: text.rindex("#!/usr/bin/env bash")]
        + 'printf %s "$PGC_KUBECONFIG"; printf %s "$PGC_GUEST_SCRIPT" | wc -c\n'
    )
    proc = subprocess.run(["bash", "-s"], input=probe, capture_output=True, text=True, check=True)
    assert proc.stdout.startswith(hostile) and int(proc.stdout[len(hostile) :]) == len(drain_script().encode())
    assert not (tmp_path / "pwned").exists()
