"""The URNs of the repository's stacks and of every example program are pinned: a change that renames, re-parents or retypes a resource changes its URN,
and Pulumi would then delete and recreate it (a worker VM included). Such a change must add ``aliases`` (or be a
deliberate, documented move); then regenerate the pins with

    PGC_UPDATE_URNS=1 python -m pytest tests/stacks/test_urns.py

A pin file lists every URN a deployed stack may hold: the current ones, and older ones that an alias still maps to
a current resource (regenerating keeps those and drops any that nothing maps). Pins use the engine's URN scheme:
the type part chains the types of all ancestors below the stack (``A$B$C``); the mock monitor abbreviates it to
the parent's type (``B$C``), so the URNs here are recomputed from the recorded tree.

GpuCluster moved the stacks' resources under the component once, before any release (before-gpucluster/).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from proxmox_gpu_cluster.stacks.plan import plan
from proxmox_gpu_cluster.stacks.plan.inputs import find_program
from proxmox_gpu_cluster.testing import RecordedResource, Recording
from tests.support import ROOT

PINS = ROOT / "tests" / "stacks" / "urns"
PROGRAMS = [ROOT, *sorted(p for p in (ROOT / "examples").iterdir() if (p / "Pulumi.yaml").exists())]
STACKS = [(d, f.name.split(".")[1]) for d in PROGRAMS for f in sorted(d.glob("Pulumi.*.yaml"))]


def pin_name(directory: Path, stack: str) -> str:
    return stack if directory == ROOT else f"{directory.name}.{stack}"


def recorded(directory: Path, stack: str) -> Recording:
    program = find_program(directory)
    document = yaml.safe_load((directory / f"Pulumi.{stack}.yaml").read_text())
    recording, _ = plan(stack, document, program.main, project=program.project, placeholder_secrets=True)
    return recording


def engine_urns(recording: Recording) -> dict[str, str]:
    """Recorded (mock) URN -> the URN the engine gives the same resource."""
    by_urn = {r.urn: r for r in recording.resources}
    out: dict[str, str] = {}

    def qualified(r: RecordedResource) -> str:
        parent = by_urn.get(r.parent)
        if parent is None or parent.type == "pulumi:pulumi:Stack":
            return r.type
        return f"{qualified(parent)}${r.type}"

    for r in recording.resources:
        head = r.urn.split("::")[:2]
        out[r.urn] = "::".join([*head, qualified(r), r.name]) if r.type != "pulumi:pulumi:Stack" else r.urn
    return out


@pytest.mark.parametrize(("directory", "stack"), STACKS, ids=[pin_name(d, s) for d, s in STACKS])
def test_urns_are_pinned(directory: Path, stack: str) -> None:
    recording = recorded(directory, stack)
    current = set(engine_urns(recording).values())
    project = find_program(directory).project
    mapped = old_urns(recording, stack, project)
    pin = PINS / f"{pin_name(directory, stack)}.txt"
    if os.environ.get("PGC_UPDATE_URNS"):
        kept = set(pin.read_text().splitlines()) & mapped if pin.exists() else set()
        pin.write_text("".join(f"{u}\n" for u in sorted(current | kept)))
    pinned = set(pin.read_text().splitlines())
    gone = sorted(pinned - current - mapped)
    new = sorted(current - pinned)
    assert not gone and not new, (
        f"URNs of stack {stack} changed; add aliases for moved resources, or regenerate the pins if this is a "
        f"deliberate move (see this module's docstring).\ngone: {gone}\nnew: {new}"
    )


def test_every_stack_is_pinned() -> None:
    assert {p.stem for p in PINS.glob("*.txt")} == {pin_name(d, s) for d, s in STACKS}  # before-gpucluster/ aside
    assert {"bare-metal-gpu-stack.dev", "single-gpu-vm.dev", "cluster-with-app.dev"} <= {
        p.stem for p in PINS.glob("*.txt")
    }


BEFORE = PINS / "before-gpucluster"


def old_urns(recording: Recording, stack: str, project: str) -> set[str]:
    """Every URN (engine scheme) the engine would match to a resource through its aliases: its own alias specs
    (a new name or type, no parent, another parent), and those it inherits from an aliased parent (a child named
    after its parent takes the parent's old name as prefix)."""
    by_urn = {r.urn: r for r in recording.resources}
    engine = engine_urns(recording)
    memo: dict[str, set[str]] = {}

    def of(r: RecordedResource) -> set[str]:
        if r.urn in memo:
            return memo[r.urn]
        found: set[str] = set()
        for alias in r.aliases:
            name, type_ = alias["name"] or r.name, alias["type"] or r.type
            # An empty parentUrn is the resource's own parent (a new name or type only); one the program does not
            # hold is a former parent's URN (in the engine's scheme: it was never registered by the mock).
            parent_urn = alias.get("parentUrn") or r.parent
            if alias.get("noParent"):
                found.add(f"urn:pulumi:{stack}::{project}::{type_}::{name}")
            elif parent_urn in engine or parent_urn.startswith(f"urn:pulumi:{stack}::{project}::"):
                parent_type = engine.get(parent_urn, parent_urn).split("::")[2]
                chain = type_ if parent_type == "pulumi:pulumi:Stack" else f"{parent_type}${type_}"
                found.add(f"urn:pulumi:{stack}::{project}::{chain}::{name}")
        parent = by_urn.get(r.parent)
        if parent is not None:
            for old_parent in of(parent):
                parent_type, parent_name = old_parent.split("::")[2], old_parent.split("::")[3]
                name = parent_name + r.name[len(parent.name) :] if r.name.startswith(parent.name) else r.name
                found.add(f"urn:pulumi:{stack}::{project}::{parent_type}${r.type}::{name}")
        memo[r.urn] = found
        return found

    return {urn for r in recording.resources for urn in of(r)}


@pytest.mark.parametrize("stack", ["dev", "prod", "kubevirt"])
def test_resources_moved_under_gpucluster_keep_their_identity(stack: str) -> None:
    """Before GpuCluster the stacks registered their resources at the root; the aliases map every one of those URNs
    to exactly one resource now, so `pulumi up` moves them instead of replacing VMs, mappings and releases."""
    document = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
    recording, _ = plan(stack, document, ROOT / "__main__.py", placeholder_secrets=True)
    # The mock qualifies a root resource's type with the stack's ("pulumi:pulumi:Stack$..."); the engine does not
    # (the root stack is never part of a type chain), and alias URNs follow the engine.
    pinned = (BEFORE / f"{stack}.txt").read_text().splitlines()
    before = {u.replace("::pulumi:pulumi:Stack$", "::") for u in pinned if "pulumi:pulumi:Stack::" not in u}
    mapped = old_urns(recording, stack, "proxmox-gpu-cluster")
    assert before - mapped == set()
    assert any("$proxmoxve:index/vmLegacy:VmLegacy::" in u for u in before)  # the VMs are among them


def test_the_alias_check_would_catch_a_missing_alias() -> None:
    document = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    recording, _ = plan("dev", document, ROOT / "__main__.py", placeholder_secrets=True)
    for r in recording.resources:
        if r.name == "cluster-gpu-a10-1":
            r.aliases = []  # as if this worker's VM component had been moved without one
    mapped = old_urns(recording, "dev", "proxmox-gpu-cluster")
    assert not any(u.endswith("VmLegacy::gpu-a10-1-vm") for u in mapped)
