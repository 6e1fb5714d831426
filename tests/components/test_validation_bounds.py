"""Every numeric field of the spec, found by walking its JSON Schema (so a new field is covered without editing
this test), has both bounds, and a value beyond either (huge, hugely negative, or just negative) is one problem at
exactly that field's path: never a traceback, never accepted."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import pytest

from proxmox_gpu_cluster.core.errors import SpecError, format_loc
from proxmox_gpu_cluster.core.input_safety import budget_problem, escape_controls
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.stacks.json_schema import spec_schema
from tests.support import base_spec

Path_ = tuple[str | int, ...]
DICT_KEYS = {"resources": "nvidia.com/gpu", "mig": "1g.5gb"}
"""A key to put under a mapping of numbers, by the mapping's field name (else the schema's first allowed name)."""


def numeric_fields(schema: dict[str, Any], node: dict[str, Any], path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    """(path, the integer or number schema) of every numeric value the spec can hold."""
    if "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
    for branch in node.get("anyOf", []) + node.get("oneOf", []):
        yield from numeric_fields(schema, branch, path)
    kind = node.get("type")
    if kind in ("integer", "number"):
        yield path, node
    elif kind == "object":
        for name, child in node.get("properties", {}).items():
            yield from numeric_fields(schema, child, (*path, name))
        extra = node.get("additionalProperties") or next(iter(node.get("patternProperties", {}).values()), None)
        if isinstance(extra, dict) and extra:
            key = DICT_KEYS.get(str(path[-1])) or node.get("propertyNames", {}).get("enum", ["x"])[0]
            yield from numeric_fields(schema, extra, (*path, key))
    elif kind == "array" and isinstance(node.get("items"), dict):
        yield from numeric_fields(schema, node["items"], (*path, 0))


def bound(node: dict[str, Any], *names: str) -> float | None:
    """The bound ``names`` of a numeric schema, looking into anyOf branches (an int-or-percentage)."""
    for name in names:
        if name in node:
            return float(node[name])
    found = [bound(b, *names) for b in node.get("anyOf", []) if b.get("type") in ("integer", "number")]
    return next((b for b in found if b is not None), None)


FIELDS = sorted({format_loc(p): (p, n) for p, n in numeric_fields(spec_schema(), spec_schema())}.items())


def put(spec: dict[str, Any], path: Path_, value: Any) -> dict[str, Any]:
    """``spec`` with ``value`` at ``path``, creating (or reshaping) the mappings and lists on the way."""
    spec = copy.deepcopy(spec)
    here: Any = spec
    for i, step in enumerate(path[:-1]):
        want: type = list if isinstance(path[i + 1], int) else dict
        if isinstance(step, int):
            while len(here) <= step:
                here.append(want())
        child = here[step] if isinstance(step, int) else here.get(step)
        if isinstance(child, str) and want is dict and i > 0 and path[i - 1] == "gpus":
            child = {"ref": child}  # a GPU claim's shorthand
        elif not isinstance(child, want):
            child = want()
        here[step] = child
        here = child
    last = path[-1]
    if isinstance(last, int):
        while len(here) <= last:
            here.append(None)
    here[last] = value
    return spec


def test_the_walk_finds_every_numeric_field() -> None:
    names = {name for name, _ in FIELDS}
    assert len(FIELDS) >= 30, names
    for expected in ["workers[0].vmid", "workers[0].memoryMiB", "gpuOperator.driverUpgrade.maxUnavailable",
                     "gpuOperator.driverUpgrade.drain.timeoutSeconds", "quotas[0].resources.nvidia.com/gpu",
                     "workers[0].gpus[0].mig.1g.5gb", "kubevirt.nodes[0].gpus.A100-PCIE-40GB",
                     "gpuOperator.monitoring.alerts.criticalXids[0]", "priorityClasses[0].value"]:  # fmt: skip
        assert expected in names, sorted(names)


@pytest.mark.parametrize(("name", "field"), FIELDS, ids=[name for name, _ in FIELDS])
def test_every_numeric_field_is_bounded_both_ways(name: str, field: tuple[Path_, dict[str, Any]]) -> None:
    path, node = field
    low, high = bound(node, "minimum", "ge", "exclusiveMinimum"), bound(node, "maximum", "le", "exclusiveMaximum")
    assert low is not None and high is not None, f"{name}: no lower or upper bound in {node}"
    values = [10**30, -(10**30), math.inf, high + 1, low - 1]
    for value in values:
        with pytest.raises(SpecError) as info:
            load_spec(put(base_spec(), path, value))
        at_field = [p for p in info.value.problems if p.path == name]
        assert len(at_field) == 1, f"{name} = {value}: {info.value.lines}"
        assert "Input should be" in at_field[0].message or "expected" in at_field[0].message


def test_put_reaches_the_field() -> None:
    """The helper really places values where the walk says (else the test above would pass on other errors)."""
    spec = put(base_spec(), ("workers", 0, "gpus", 0, "mig", "1g.5gb"), 7)
    assert spec["workers"][0]["gpus"][0] == {"ref": "a100-0", "mig": {"1g.5gb": 7}}
    assert put(base_spec(), ("priorityClasses", 0, "value"), 5)["priorityClasses"] == [{"value": 5}]


def test_budget_problem_stops_bombs_and_cycles_without_recursing() -> None:
    shared: list[Any] = ["lol"] * 10
    for _ in range(8):
        shared = [shared] * 10  # 10**9 leaves through shared references, as YAML aliases build them
    assert budget_problem({"a": shared}) is not None and "more than" in str(budget_problem({"a": shared}))
    cycle: list[Any] = []
    cycle.append(cycle)
    assert "nested more than" in str(budget_problem(cycle))
    assert budget_problem(base_spec()) is None


def test_escape_controls_keeps_one_printable_line() -> None:
    assert escape_controls("a\x1b[31m\n\u2028\u202e\x85b") == "a\\x1b[31m\\x0a\\u2028\\u202e\\x85b"
    assert escape_controls("plain: ünïcode ✓") == "plain: ünïcode ✓"
