"""The URNs of the repository's stacks and of every example program are pinned: a change that renames, re-parents or retypes a resource changes its URN,
and Pulumi would then delete and recreate it (a worker VM included). Such a change must add ``aliases`` (or be a
deliberate, documented move); then regenerate the pins with

    PGC_UPDATE_URNS=1 python -m pytest tests/stacks/test_urns.py

This change (GpuCluster) moved the stacks' resources under the component once, before any release.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from proxmox_gpu_cluster.stacks.plan import find_program, plan
from tests.support import ROOT

PINS = ROOT / "tests" / "stacks" / "urns"
PROGRAMS = [ROOT, *sorted(p for p in (ROOT / "examples").iterdir() if (p / "Pulumi.yaml").exists())]
STACKS = [(d, f.name.split(".")[1]) for d in PROGRAMS for f in sorted(d.glob("Pulumi.*.yaml"))]


def pin_name(directory: Path, stack: str) -> str:
    return stack if directory == ROOT else f"{directory.name}.{stack}"


def urns(directory: Path, stack: str) -> list[str]:
    program = find_program(directory)
    document = yaml.safe_load((directory / f"Pulumi.{stack}.yaml").read_text())
    recording, _ = plan(stack, document, program.main, project=program.project)
    return sorted(r.urn for r in recording.resources)


@pytest.mark.parametrize(("directory", "stack"), STACKS, ids=[pin_name(d, s) for d, s in STACKS])
def test_urns_are_pinned(directory: Path, stack: str) -> None:
    current = urns(directory, stack)
    pin = PINS / f"{pin_name(directory, stack)}.txt"
    if os.environ.get("PGC_UPDATE_URNS"):
        pin.parent.mkdir(exist_ok=True)
        pin.write_text("".join(f"{u}\n" for u in current))
    pinned = pin.read_text().splitlines()
    gone = sorted(set(pinned) - set(current))
    new = sorted(set(current) - set(pinned))
    assert not gone and not new, (
        f"URNs of stack {stack} changed; add aliases for moved resources, or regenerate the pins if this is a "
        f"deliberate move (see this module's docstring).\ngone: {gone}\nnew: {new}"
    )


def test_every_stack_is_pinned() -> None:
    assert {p.stem for p in PINS.glob("*.txt")} == {pin_name(d, s) for d, s in STACKS}
    assert {"bare-metal-gpu-stack.dev", "single-gpu-vm.dev", "cluster-with-app.dev"} <= {
        p.stem for p in PINS.glob("*.txt")
    }
