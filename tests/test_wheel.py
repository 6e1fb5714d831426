"""The package as users get it: ``python -m build`` without warnings, a wheel that installs one import package
(never ``components`` or ``stacks``), an sdist with the docs and example stacks, and the offline plan run from
the installed wheel on a user's program that has its own ``components/`` package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support import ROOT

# Environment noise, not packaging problems: distutils says so when PYTHONDONTWRITEBYTECODE is set.
HARMLESS = ("byte-compiling is disabled",)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        cwd=out,  # not the repository: its build/ (the editable link tree) would shadow the build package
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result.stdout + result.stderr


def test_the_build_has_no_warnings(dist: tuple[Path, str]) -> None:
    _, log = dist
    warnings = [
        line for line in log.splitlines() if ("warning" in line.lower() or "ignored" in line.lower())
        and not any(h in line for h in HARMLESS)
    ]  # fmt: skip
    assert warnings == []


def test_the_wheel_installs_one_import_package_with_its_data(dist: tuple[Path, str]) -> None:
    (wheel,) = dist[0].glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read("proxmox_gpu_cluster-0.1.0.dist-info/METADATA").decode()
    assert {n.split("/")[0] for n in names} == {"proxmox_gpu_cluster", "proxmox_gpu_cluster-0.1.0.dist-info"}
    assert "proxmox_gpu_cluster/py.typed" in names
    assert "proxmox_gpu_cluster/scripts/host_prep.sh" in names
    assert "proxmox_gpu_cluster/stacks/plan/run.py" in names
    assert "proxmox_gpu_cluster/stacks/schemas/stack.schema.json" in names
    assert "License-Expression: Apache-2.0" in metadata
    assert "Requires-Dist: pulumi" in metadata


def test_the_sdist_carries_docs_and_example_stacks(dist: tuple[Path, str]) -> None:
    (sdist,) = dist[0].glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {"LICENSE", "docs/monitoring.md", "docs/kubevirt.md", "Pulumi.prod.yaml", "__main__.py"} <= names
    assert {
        f"examples/{e}/Pulumi.dev.yaml" for e in ("bare-metal-gpu-stack", "single-gpu-vm", "cluster-with-app")
    } <= names


USER_MAIN = """
import pulumi
import pulumi_kubernetes as kubernetes

from components.team import TEAM  # the user's own package called components
from proxmox_gpu_cluster.core.operator_spec import GpuOperatorSpec
from proxmox_gpu_cluster.gpu.gpu_node import GpuNodeLabels, GpuNodeLabelsArgs
from proxmox_gpu_cluster.render.gpu_stack import GpuStack
from proxmox_gpu_cluster.stacks.config import load_nodes

k8s = kubernetes.Provider("k8s", kubeconfig=pulumi.Config().require_secret("kubeconfig"))
stack = GpuStack(operator=GpuOperatorSpec(), nodes=tuple(load_nodes()))
GpuNodeLabels(f"{TEAM}-gpu-nodes", GpuNodeLabelsArgs(stack=stack), pulumi.ResourceOptions(provider=k8s))
"""


def test_the_installed_wheel_plans_a_users_program_with_its_own_components_package(
    dist: tuple[Path, str], tmp_path: Path
) -> None:
    (wheel,) = dist[0].glob("*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)  # a wheel install is an unpack into site-packages
    program = tmp_path / "team-program"
    (program / "components").mkdir(parents=True)
    (program / "components" / "__init__.py").write_text("")
    (program / "components" / "team.py").write_text('TEAM = "vision"\n')
    (program / "__main__.py").write_text(USER_MAIN)
    (program / "Pulumi.yaml").write_text("name: team-program\nruntime: python\n")
    (program / "Pulumi.dev.yaml").write_text(
        "config:\n  team-program:gpuNodes:\n    - {name: bm-1, gpus: {L4: 2}}\n"
        "  team-program:kubeconfig: {secure: v1:abc}\n"
    )
    # Dependencies (pulumi, pydantic, ...) come from this test run's environment; the package itself only from
    # the fresh environment's site-packages (the development install is a path hook this path does not load).
    deps = sysconfig.get_path("purelib")
    env = {**os.environ, "PYTHONPATH": deps}
    python = venv / "bin" / "python"
    where = subprocess.run(
        [str(python), "-c", "import proxmox_gpu_cluster, components.team; print(proxmox_gpu_cluster.__file__)"],
        cwd=program, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert where.stdout.startswith(str(site))
    result = subprocess.run(
        [str(python), "-m", "proxmox_gpu_cluster.plan", "--placeholder-secrets", "dev", "--json"],
        cwd=program, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    planned = json.loads(result.stdout)
    assert planned["project"] == "team-program"
    assert "vision-gpu-nodes-bm-1" in {r["name"] for r in planned["resources"]}
