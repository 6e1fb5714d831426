"""The plan package's front (stacks/plan/__init__.py): its entry points are the modules' own objects, fetched when
first asked for, so a module of the package imported alone does not pull in ``run`` (which imports it back)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import proxmox_gpu_cluster.stacks.plan as package
from proxmox_gpu_cluster.stacks.plan import inputs, run


def test_the_entry_points_are_the_modules_own() -> None:
    assert package.main is run.main and package.plan is run.plan and package.plan_document is run.plan_document
    assert package.find_program is inputs.find_program
    assert sorted(package.__all__) == sorted(package._WHERE)
    with pytest.raises(AttributeError, match="has no attribute 'plan_classes'"):
        _ = package.plan_classes


def test_a_module_of_the_package_imports_without_run() -> None:
    code = (
        "import sys, proxmox_gpu_cluster.stacks.cli_checks, proxmox_gpu_cluster.stacks.plan.classes\n"
        "print('proxmox_gpu_cluster.stacks.plan.run' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
