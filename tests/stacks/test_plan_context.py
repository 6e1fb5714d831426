"""A changed secret with nothing else changed still says why, in the stack file's words (stacks/plan/context.py)."""

from __future__ import annotations

import copy
from typing import Any

from proxmox_gpu_cluster.core.capacity import capacity_table
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.stacks.plan import plan_document
from proxmox_gpu_cluster.stacks.plan.context import SHOWN, context_of, spec_changes, spec_view
from proxmox_gpu_cluster.stacks.plan.diff import change_rows, diff
from tests.stacks.test_plan_values import SECRETS, base_spec, new_digest_key, plan_with
from tests.support import plan_stack


def with_specs(raw: dict[str, Any], key: bytes) -> dict[str, Any]:
    document = plan_with(raw, SECRETS, key)
    document["specs"] = spec_view([("", load_spec(raw))])
    return document


def test_a_plan_document_carries_the_validated_spec_and_no_secret() -> None:
    raw = base_spec()
    document = plan_document("t", plan_stack(raw), capacity_table(load_spec(raw)), load_spec(raw))
    assert document["specs"] == spec_view([("", load_spec(raw))])
    assert document["specs"][""]["proxmox"]["nodes"][0]["name"] == raw["proxmox"]["nodes"][0]["name"]
    assert not [v for v in SECRETS.values() if v in str(document["specs"])]


def test_a_host_with_a_new_address_names_it_beside_every_secret_connection_change() -> None:
    raw = base_spec()
    for node in raw["proxmox"]["nodes"]:
        node["hostPrep"] = True
    key = new_digest_key()
    before = with_specs(raw, key)
    moved = copy.deepcopy(raw)
    node = moved["proxmox"]["nodes"][0]
    old_address, node["sshAddress"] = node["sshAddress"], "10.99.0.7"
    after = with_specs(moved, key)
    secret = [c for c in diff(before, after) if any("connection: changed (secret)" in v for v in c.values)]
    assert secret and all(node["name"] in c.name or "-" in c.name for c in secret)
    why = f"proxmox.nodes[{node['name']}].sshAddress: {old_address} → 10.99.0.7"
    for change in secret:
        line = next(row for row in change_rows(change) if "connection: changed (secret)" in row)
        assert why in line, line
        assert "[secret" not in line


def test_without_specs_on_either_side_there_is_no_context_never_a_wrong_one() -> None:
    key = new_digest_key()
    raw = base_spec()
    moved = copy.deepcopy(raw)
    moved["proxmox"]["nodes"][0]["sshAddress"] = "10.99.0.7"
    before, after = plan_with(raw, SECRETS, key), with_specs(moved, key)  # an older revision's plan has no specs
    assert spec_changes(before, after) == {}
    for change in diff(before, after):
        assert not [v for v in change.values if "stack file" in v]


def spec(nodes: list[dict[str, Any]], workers: list[dict[str, Any]], **rest: Any) -> dict[str, Any]:
    return {"specs": {"": {"proxmox": {"nodes": nodes}, "workers": workers, **rest}}}


def test_named_items_pair_by_name_and_a_worker_carries_its_hosts_changes() -> None:
    nodes = [{"name": "pve-a", "sshAddress": "10.0.0.1"}, {"name": "pve-b", "sshAddress": "10.0.0.2"}]
    workers = [{"name": "gpu-1", "node": "pve-b", "cores": 8}, {"name": "gpu-2", "node": "pve-a", "cores": 8}]
    # the same items in another order, pve-b renumbered, gpu-2 resized
    new_nodes = [{"name": "pve-b", "sshAddress": "10.0.0.9"}, {"name": "pve-a", "sshAddress": "10.0.0.1"}]
    new_workers = [{"name": "gpu-2", "node": "pve-a", "cores": 16}, {"name": "gpu-1", "node": "pve-b", "cores": 8}]
    changes = spec_changes(spec(nodes, workers), spec(new_nodes, new_workers))
    assert changes["pve-b"] == ["cluster.proxmox.nodes[pve-b].sshAddress: 10.0.0.2 → 10.0.0.9"]
    assert changes["gpu-1"] == changes["pve-b"]  # its steps reach the guest through the host
    assert changes["gpu-2"] == ["cluster.workers[gpu-2].cores: 8 → 16"]
    assert "pve-a" not in changes and "" not in changes


def test_the_longest_machine_name_wins_and_cluster_wide_changes_are_the_fallback() -> None:
    changes = {"gpu-a": ["a"], "gpu-a-b": ["ab"], "": ["guest.sshUser: ubuntu → admin"]}
    assert context_of("cluster-gpu-a-b-bootstrap-join", changes) == "with the stack file's ab"
    assert context_of("cluster-gpu-a-bootstrap-join", changes) == "with the stack file's a"
    assert context_of("cluster-gpu-c-bootstrap-join", changes) == "with the stack file's guest.sshUser: ubuntu → admin"
    assert context_of("cluster-gpu-c-bootstrap-join", {"gpu-a": ["a"]}) == ""
    many = {"": [f"x{i}: 1 → 2" for i in range(SHOWN + 2)]}
    assert context_of("cluster-operator", many).endswith(f"x{SHOWN - 1}: 1 → 2 and 2 more")


def test_a_spec_value_with_control_characters_is_shown_escaped_and_bounded() -> None:
    before = spec([{"name": "pve-a", "sshAddress": "a"}], [], guest={"note": "x"})
    after = spec([{"name": "pve-a", "sshAddress": "a"}], [], guest={"note": "line\x1b[31m" + "y" * 200})
    (line,) = spec_changes(before, after)[""]
    assert "\x1b" not in line and "\\x1b" in line and len(line) < 140
