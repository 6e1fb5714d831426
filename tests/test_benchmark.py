"""The scale benchmark runs and prints its table; the floor registers parents and dependencies first."""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT, plan_scale

SCRIPT = ROOT / "benchmarks" / "plan_scale.py"


def test_registration_order_puts_parents_and_dependencies_first() -> None:
    def r(urn: str, parent: str | None = None, deps: tuple[str, ...] = ()) -> dict[str, object]:
        return {"urn": urn, "parent": parent, "dependencies": list(deps)}

    tree = [r("c", "b", ("x",)), r("b", "a"), r("a"), r("x", "a", ("b",))]
    order = [e["urn"] for e in plan_scale().registration_order(tree)]
    assert sorted(order) == ["a", "b", "c", "x"]
    assert order.index("a") < order.index("b") < order.index("x") < order.index("c")


def test_the_benchmark_prints_a_row_per_size() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "2"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout.splitlines()
    assert "ratio" in out[0] and "bare floor s" in out[0] and "inputs KiB/worker" in out[0]
    cells = out[1].split()
    assert len(cells) == 11 and cells[0] == "2"
    assert int(cells[1]) > 30  # resources
    assert all(float(c) > 0 for c in cells[2:])


def test_the_rollout_simulation_never_exceeds_its_slots() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "rollout_sim.py"), "--nodes", "3", "--max-unavailable", "2"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout.splitlines()  # fmt: skip
    assert out[0].startswith("assumed per node:") and "412 s" in out[0]
    nodes, slots, peak, rounds, _, minutes = out[2].split()
    assert (nodes, slots, peak, rounds) == ("3", "2", "2", "2")
    assert float(minutes) == round(2 * 412 / 60, 1)
