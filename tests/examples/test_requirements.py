"""Every example's requirements file works as written: pip, run where ``pulumi install`` runs it (the example's own
directory: pulumi's sdk/python/toolchain/pip.go sets the command's directory to the one holding requirements.txt),
installs this repository's package into a fresh virtual environment, and the installed package has everything the
example imports.

Each install runs in a copy of the repository (pip builds a local directory in place, writing ``build/`` and
``*.egg-info`` there), with ``--no-deps`` (the dependencies come from this test run's environment, as in
test_wheel.py). The build keeps pip's build isolation, as a user's ``pulumi install`` does: the project's
``build-system.requires`` (setuptools>=77) comes from the configured package index, like ``python -m build`` in
test_wheel.py; ``--no-build-isolation`` would build with the environment's own setuptools, and Python 3.11's
ensurepip (and so a fresh venv) brings 65.x, which cannot read this pyproject.toml's ``license`` field.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

from tests.support import ROOT

EXAMPLES = sorted(p.parent.name for p in (ROOT / "examples").glob("*/requirements.txt"))
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "components", "stacks", "examples")


def requirement_lines(example: str) -> list[str]:
    text = (ROOT / "examples" / example / "requirements.txt").read_text()
    return [line.split(" #")[0].strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def imported_modules(example: str) -> list[str]:
    tree = ast.parse((ROOT / "examples" / example / "__main__.py").read_text())
    found = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    found += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    return sorted({m for m in found if m.split(".")[0] == "proxmox_gpu_cluster"})


def test_every_example_has_a_requirements_file_naming_this_repository_by_a_path() -> None:
    assert set(EXAMPLES) == {p.name for p in (ROOT / "examples").iterdir() if (p / "Pulumi.yaml").exists()}
    for example in EXAMPLES:
        lines = requirement_lines(example)
        # A bare "proxmox-gpu-cluster" would be looked up on the package index, where it is not (or is someone else's).
        assert lines == ["../.."], (example, lines)
        assert ((ROOT / "examples" / example) / lines[0]).resolve() == ROOT
        assert imported_modules(example), example


def test_each_examples_requirements_install_the_package_from_the_examples_own_directory(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name in BUILD_INPUTS:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, repo / name, ignore=shutil.ignore_patterns("__pycache__", ".venv"))
        else:
            repo.mkdir(exist_ok=True)
            shutil.copy2(source, repo / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-input", "--quiet"]
    # What `pulumi install` does first (pip.go: --upgrade pip setuptools wheel), here only the build requirements.
    build_requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    subprocess.run([*pip, *build_requires], check=True, capture_output=True, text=True)
    deps = sysconfig.get_path("purelib")  # pulumi, pydantic, ...: this run's environment (a path, not a site dir)
    site = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    for example in EXAMPLES:
        installed = subprocess.run(
            [*pip, "--no-deps", "--no-build-isolation", "--force-reinstall", "-r", "requirements.txt"],
            cwd=repo / "examples" / example, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert installed.returncode == 0, f"{example}: pip install -r requirements.txt failed:\n{installed.stderr}"
        # Where the installed distribution came from (cwd and no PYTHONPATH: the development install stays out).
        origin = subprocess.run(
            [python, "-c", "from importlib.metadata import distribution as d; "
             "print(d('proxmox-gpu-cluster').read_text('direct_url.json'))"],
            cwd=tmp_path, capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert json.loads(origin.stdout)["url"] == repo.as_uri(), example
        modules = imported_modules(example)
        code = f"import importlib, proxmox_gpu_cluster; [importlib.import_module(m) for m in {modules!r}]; " \
            "print(proxmox_gpu_cluster.__file__)"  # fmt: skip
        imported = subprocess.run(
            [python, "-c", code], env={**os.environ, "PYTHONPATH": deps}, cwd=tmp_path,
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert imported.returncode == 0, f"{example}: {imported.stderr}"
        assert imported.stdout.strip() == f"{site}/proxmox_gpu_cluster/__init__.py", example
