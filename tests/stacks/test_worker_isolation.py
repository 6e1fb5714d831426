"""A worker's resources wait only for what that worker uses: its own GPUs' PCI mappings, its node's host prep and
boot files. Two workers never wait for each other, so one failing or replaced mapping, VM or bootstrap holds up
only its own worker.

The deliberate exceptions wait for the operator release, which waits for every node's labels (labels before the
operator, see GpuNodeLabels), so they are left out here: the capacity gates, and the MIG settle steps (the VM restart
and the end step), as a new custom geometry's ConfigMap reaches mig-manager only with the release.
"""

from __future__ import annotations

from typing import Any

import pytest

from proxmox_gpu_cluster.testing import RecordedResource, Recording
from tests.support import base_spec, plan_stack, prod_spec

GATES = (
    "proxmox-gpu-cluster:capacity_gate:NodeCapacityGates",
    "proxmox-gpu-cluster:capacity_gate:NodeCapacityGate",
    "proxmox-gpu-cluster:mig_rollout:MigSettle",
)


def owned(rec: Recording, raw: dict[str, Any]) -> dict[str, list[RecordedResource]]:
    """Worker -> its own resources: ``cluster-<worker>-...``, its label patch and its GPUs' mappings, gates
    aside."""
    out: dict[str, list[RecordedResource]] = {}
    gated = {g.urn for t in GATES for g in rec.of_type(t)}
    nodes = {n["name"]: n for n in raw["proxmox"]["nodes"]}
    for w in raw["workers"]:
        name, node = w["name"], nodes[w["node"]]
        claims = {c if isinstance(c, str) else c["ref"] for c in w["gpus"]}
        mappings = {f"cluster-{node['name']}-pci-{g['pciPath']}" for g in node["gpus"] if g["name"] in claims}
        out[name] = [
            r for r in rec.resources
            if (r.name.startswith(f"cluster-{name}-") or r.name in {f"cluster-gpu-nodes-{name}", *mappings})
            and r.urn not in gated and r.parent not in gated
        ]  # fmt: skip
        assert len([r for r in out[name] if r.name in mappings]) == len(claims)
    return out


@pytest.mark.parametrize("shape", ["base", "prod"])
def test_no_dependency_path_between_two_workers(shape: str) -> None:
    raw = base_spec() if shape == "base" else prod_spec()
    for node in raw["proxmox"]["nodes"]:
        node["hostPrep"] = True
    rec = plan_stack(raw)
    mine = owned(rec, raw)
    assert all(len(resources) >= 8 for resources in mine.values()), {w: len(r) for w, r in mine.items()}
    for a, resources in mine.items():
        for b, others in mine.items():
            if a != b:
                paths = [(r.name, o.name) for r in resources for o in others if rec.depends_on(r, o)]
                assert not paths, f"{a} waits for {b}: {paths[:3]}"


def test_a_vm_waits_for_its_own_mappings_only() -> None:
    raw = base_spec()
    rec = plan_stack(raw)
    by_urn = {r.urn: r for r in rec.resources}
    for vm in rec.of_type("proxmoxve:index/vmLegacy:VmLegacy"):
        mappings = {by_urn[d].name for d in vm.dependencies if by_urn[d].type.endswith("mapping/pci:Pci")}
        claimed = {h["mapping"] for h in vm.plain_inputs["hostpcis"]}
        assert len(mappings) == len(claimed) >= 1, (vm.name, mappings, claimed)


def test_the_mig_settle_steps_wait_for_other_workers_only_through_the_release() -> None:
    raw = base_spec()
    rec = plan_stack(raw)
    by_urn = {r.urn: r for r in rec.resources}
    workers = [w["name"] for w in raw["workers"]]
    settles = rec.of_type("proxmox-gpu-cluster:mig_rollout:MigSettle")
    assert len(settles) == 2
    for settle in settles:
        worker = settle.name.removeprefix("cluster-").removesuffix("-mig-settle")
        steps = [r for r in rec.resources if r.parent == settle.urn]
        assert sorted(s.name.rsplit("-", 1)[-1] for s in steps) == ["end", "restart"]
        for step in steps:
            direct = {by_urn[d].name for d in step.dependencies if d in by_urn}
            assert "cluster-gpu-operator-release" in direct or any(n.endswith("-mig-restart") for n in direct)
            others = {n for n in direct for w in workers if w != worker and f"-{w}-" in f"{n}-"}
            assert not others, f"{step.name} waits for {others}"
