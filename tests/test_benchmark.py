"""The scale benchmark runs and prints its table against the fair floor; the replay floor registers parents and
dependencies first."""

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
        [sys.executable, str(SCRIPT), "--sizes", "2", "--repeat", "1"], capture_output=True, text=True, check=True,
        cwd=ROOT,
    ).stdout.splitlines()  # fmt: skip
    header = out[0]
    assert "fair floor s" in header and "cpu ratio" in header and "replay floor s" in header
    assert "inputs KiB/worker" in header
    cells = out[1].split()
    assert len(cells) == 13 and cells[0] == "2"
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


def test_the_state_size_benchmark_prints_the_stacks_ssh_mode_and_the_other_one() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "state_size.py"), "--top", "3"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout.splitlines()  # fmt: skip
    assert out[0].split() == ["stack", "secrets", "ssh", "workers", "max", "KiB/worker", "mean", "KiB/worker"]
    rows = {(c[0], c[1], c[2]): (int(c[3]), float(c[4]), float(c[5])) for c in (line.split() for line in out[1:7])}
    # dev and prod use the ssh-agent: their own rows say agent, the extra realistic row the key in every connection.
    modes = (("plan", "agent"), ("realistic", "agent"), ("realistic", "key"))
    assert set(rows) == {(s, k, m) for s in ("dev", "prod") for k, m in modes}
    for stack in ("dev", "prod"):
        workers, plain_max, plain_mean = rows[(stack, "plan", "agent")]
        agent, key = rows[(stack, "realistic", "agent")], rows[(stack, "realistic", "key")]
        assert agent[0] == key[0] == workers and plain_mean <= plain_max
        assert agent[1] >= plain_max  # realistic secrets are no smaller than the placeholders
        # The 400-byte key is in at least 8 connections of the largest worker (about 11 with MIG and large-BAR).
        assert key[1] - agent[1] >= 8 * 400 / 1024, (stack, agent, key)
    assert any(line.startswith("dev/realistic/agent, worker ") for line in out)
    assert any(line.startswith("prod/realistic/key, worker ") for line in out)


def test_the_state_size_benchmark_counts_an_unknown_connection_as_a_known_one() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("state_size", ROOT / "benchmarks" / "state_size.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    known = {"host": "10.0.0.1", "user": "ubuntu", "privateKey": "s" * 400}
    resources = [
        {"name": "a", "type": "command:remote:Command", "inputs": {"create": "x", "connection": "[unknown]"}},
        {"name": "b", "type": "command:remote:Command", "inputs": {"create": "y", "connection": known}},
        {"name": "c", "type": "proxmoxve:index/vmLegacy:VmLegacy", "inputs": {"name": "[unknown]"}},
    ]
    filled = module.fill_unknown_connections(resources)
    assert filled[0]["inputs"] == {"create": "x", "connection": {**known, "host": "255.255.255.255"}}
    assert filled[1:] == resources[1:]
    assert module.fill_unknown_connections(resources[:1]) == resources[:1]  # nothing known: left as it is


def test_no_step_of_a_worker_carries_a_script_in_state() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("state_size", ROOT / "benchmarks" / "state_size.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    steps = [r for r in module.plan_inputs("prod", None) if r["type"] == "command:remote:Command"]
    assert steps
    carrying = [r["name"] for r in steps if "set -euo pipefail" in str(r["inputs"].get("stdin", ""))]
    assert carrying == []  # every script is on the machine (the node agent), none in state
