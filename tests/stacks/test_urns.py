"""The example stacks' URNs are pinned: a change that renames, re-parents or retypes a resource changes its URN,
and Pulumi would then delete and recreate it (a worker VM included). Such a change must add ``aliases`` (or be a
deliberate, documented move); then regenerate the pins with

    PGC_UPDATE_URNS=1 python -m pytest tests/stacks/test_urns.py
"""

from __future__ import annotations

import os

import pytest
import yaml

from proxmox_gpu_cluster.stacks.plan import plan
from tests.support import ROOT

PINS = ROOT / "tests" / "stacks" / "urns"
STACKS = sorted(p.name.split(".")[1] for p in ROOT.glob("Pulumi.*.yaml"))


def urns(stack: str) -> list[str]:
    document = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
    recording, _ = plan(stack, document, ROOT / "__main__.py")
    return sorted(r.urn for r in recording.resources)


@pytest.mark.parametrize("stack", STACKS)
def test_urns_are_pinned(stack: str) -> None:
    current = urns(stack)
    pin = PINS / f"{stack}.txt"
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
    assert {p.stem for p in PINS.glob("*.txt")} == set(STACKS)
