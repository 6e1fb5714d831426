"""The program under the real Pulumi CLI (tools/recipes/pulumi.sh): the CLI and language host are the pinned ones,
and the components ask the engine for the minimum CLI before anything registers."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from proxmox_gpu_cluster.engine_version import MINIMUM_CLI
from tests import pulumi_real

pytestmark = pytest.mark.slow  # each preview starts the CLI, the language host and Python: seconds each

ROOT = Path(__file__).resolve().parents[2]


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.lstrip("v").split("-")[0].split("."))


def recipe_version() -> str:
    match = re.search(r"^VERSION=(\S+)$", (ROOT / "tools" / "recipes" / "pulumi.sh").read_text(), re.M)
    assert match, "tools/recipes/pulumi.sh pins no VERSION"
    return match.group(1)


def test_the_built_cli_is_the_pinned_version_and_not_older_than_the_minimum(tmp_path: Path) -> None:
    cli = pulumi_real.cli(tmp_path)
    proc = cli.pulumi(tmp_path, "version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == recipe_version()
    assert version(proc.stdout.strip()) >= version(MINIMUM_CLI)


def test_the_minimum_cli_is_stated_where_users_look() -> None:
    assert f"Pulumi CLI {MINIMUM_CLI}" in (ROOT / "README.md").read_text()
    assert f"Pulumi CLI {MINIMUM_CLI}" in (ROOT / "pyproject.toml").read_text()


PROBE = """\
import pulumi
from proxmox_gpu_cluster import engine_version
from proxmox_gpu_cluster.core.spec import PriorityClassSpec
from proxmox_gpu_cluster.gpu.priority_classes import GpuPriorityClasses, GpuPriorityClassesArgs

engine_version.MINIMUM_CLI = {minimum!r}
pulumi.export("checked", "yes")
if {component!r}:
    GpuPriorityClasses("probe", GpuPriorityClassesArgs(classes=[PriorityClassSpec(name="gpu-high", value=1000)]))
else:
    engine_version.require_cli()
"""


def preview(tmp_path: Path, minimum: str, component: bool) -> subprocess.CompletedProcess[str]:
    cli = pulumi_real.cli(tmp_path)
    folder = pulumi_real.project(tmp_path / "probe", PROBE.format(minimum=minimum, component=component))
    return cli.program(folder, "probe", "preview")


def test_a_cli_older_than_the_minimum_is_refused_in_one_line_before_anything_registers(tmp_path: Path) -> None:
    # The running CLI stands in for an old one by asking it for a version it is not: the refusal is the engine's
    # own answer to RequirePulumiVersion, not a model of it.
    proc = preview(tmp_path, "99.0.0", component=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    diagnostics = proc.stdout[proc.stdout.index("Diagnostics:") :].split("Resources:")[0].splitlines()
    errors = [line.strip().removeprefix("error: ") for line in diagnostics if line.strip().startswith("error: ")]
    ours = errors[0]
    assert ours.startswith("proxmox-gpu-cluster needs the Pulumi CLI 99.0.0 or later (the replaceWith resource"), out
    assert f"Pulumi CLI version {recipe_version().lstrip('v')} does not satisfy" in ours, out  # the engine's answer
    # The SDK's inline language server (automation/_server.py) also returns a RunError as the run's error, which
    # the engine repeats (resource/deploy/program_source.go); the language host exits instead. Nothing else.
    assert errors[1:] in ([], [f"an unhandled error occurred: {ours}"]), out
    assert "Traceback" not in out
    assert "GpuPriorityClasses" not in out, out  # refused before the component registered


def test_the_pinned_cli_passes_the_check(tmp_path: Path) -> None:
    # (The component itself would need the Kubernetes provider plugin: the check is called directly.)
    proc = preview(tmp_path, MINIMUM_CLI, component=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "checked" in proc.stdout, proc.stdout
