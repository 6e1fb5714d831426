"""The fair floor (benchmarks/fair_floor) registers the same graph as the project's plan of the same spec, so the
ratio plan_scale.py reports compares like with like; and it is a program of its own, not the project's code."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from proxmox_gpu_cluster.stacks.plan import plan
from tests.support import ROOT, plan_scale

BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def floor() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import fair_floor

        yield fair_floor
    finally:
        sys.path.remove(str(BENCHMARKS))


def _differences(plan_shape: dict[str, Counter[Any]], floor_shape: dict[str, Counter[Any]]) -> list[str]:
    out = []
    for aspect, counts in plan_shape.items():
        other = floor_shape[aspect]
        out += [f"{aspect}: plan only {k} x{n}" for k, n in (counts - other).items()]
        out += [f"{aspect}: floor only {k} x{n}" for k, n in (other - counts).items()]
    return out


def test_the_floor_registers_the_plans_graph(floor: ModuleType) -> None:
    # Nine workers: every GPU pattern of the bench spec twice, on two Proxmox nodes.
    spec = plan_scale().make_spec(9)
    recording, _ = plan(
        "bench", {"config": {"proxmox-gpu-cluster:cluster": spec}}, ROOT / "__main__.py", placeholder_secrets=True
    )
    floor_recording = floor.run_floor(spec)
    plan_shape = floor.graph_shape(recording.resources)
    floor_shape = floor.graph_shape(floor_recording.resources)
    problems = _differences(plan_shape, floor_shape)
    assert not problems, "the fair floor no longer matches the plan; adapt benchmarks/fair_floor:\n" + "\n".join(
        problems
    )
    assert sorted(floor_recording.outputs) == sorted(recording.outputs)
    # The comparison is not vacuous: per-worker roles collapse, and edges through inputs count.
    resources = plan_shape["resources"]
    assert resources[("command:remote:Command", "W-bootstrap-driver")] == 9
    assert resources[("proxmoxve:hardware/mapping/pci:Pci", "N-pci-PCI")] == 9
    edge = (("command:remote:Command", "W-bootstrap-driver"), ("proxmoxve:index/vmLegacy:VmLegacy", "W-vm"))
    assert plan_shape["dependencies"][edge] == 9  # through the connection's host, an output of the VM
    assert sum(plan_shape["dependencies"].values()) > 20 * 9


def test_the_shape_tells_a_missing_edge(floor: ModuleType) -> None:
    recording = floor.run_floor(plan_scale().make_spec(2))
    shape = floor.graph_shape(recording.resources)
    verify = next(r for r in recording.resources if r.name == "cluster-w0-bootstrap-verify")
    verify.dependencies = [d for d in verify.dependencies if not d.endswith("::cluster-w0-bootstrap-join")]
    changed = floor.graph_shape(recording.resources)
    assert _differences(shape, changed) == [
        "dependencies: plan only (('command:remote:Command', 'W-bootstrap-verify'), "
        "('command:remote:Command', 'W-bootstrap-join')) x1"
    ]


def test_the_floor_imports_nothing_of_the_project() -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import fair_floor; "
        "print(sorted(m for m in sys.modules if m.startswith('proxmox_gpu_cluster')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(BENCHMARKS)], capture_output=True, text=True, check=True, cwd=Path("/")
    ).stdout
    assert out.strip() == "[]"
