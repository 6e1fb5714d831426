"""What the engine adds to the providers' diffs (stacks/plan/engine.py): protection inherited and enforced on
removals, replacements and the dependents of a delete-first replacement; retainOnDelete."""

from __future__ import annotations

import copy
import shlex
from typing import Any

import yaml

from proxmox_gpu_cluster.stacks.plan import plan, plan_document
from proxmox_gpu_cluster.stacks.plan.diff import change_rows, diff
from proxmox_gpu_cluster.stacks.plan.engine import effective, engine_urns, unprotect_command
from proxmox_gpu_cluster.stacks.plan.inputs import find_program
from tests.stacks.test_plan_values import SECRETS, base_spec, new_digest_key, one, plan_with, res
from tests.support import ROOT

# --- protection -----------------------------------------------------------------------------------------------


def test_removing_a_protected_resource_or_a_child_of_one_fails_with_the_quoted_unprotect_command() -> None:
    parent = res("w", "pgc:x:Worker", {}, protect=True)
    child = res("vm", "proxmoxve:index/vmLegacy:VmLegacy", {"vmId": 1}, parent=parent["urn"])
    child["urn"] = "urn:pulumi:t::p::pgc:x:Worker$proxmoxve:index/vmLegacy:VmLegacy::vm"  # a child's, with its $
    loose = res("cm", "kubernetes:core/v1:ConfigMap", {"data": {}})
    changes = {c.name: c for c in diff({"resources": [parent, child, loose]}, {"resources": []})}
    assert changes["w"].protected and changes["vm"].protected and not changes["cm"].protected
    assert changes["vm"].unprotect == f"pulumi state unprotect '{child['urn']}'"  # $ and :: stay literal
    assert any(r.strip().startswith("will fail: protected (run first: pulumi state unprotect '") for r in
               change_rows(changes["vm"]))  # fmt: skip


def test_replacing_a_protected_resource_fails_unless_the_same_change_unprotects_it() -> None:
    vm = res("vm", "proxmoxve:index/vmLegacy:VmLegacy", {"vmId": 1, "nodeName": "a"}, protect=True)
    stays = one(vm, {"vmId": 1, "nodeName": "b"})
    assert stays.action == "replace" and stays.protected and stays.fails
    lifted = one(vm, {"vmId": 1, "nodeName": "b"}, protect=False)
    assert lifted.action == "replace" and not lifted.protected and not lifted.fails
    updated = one(vm, {"vmId": 1, "nodeName": "a", "cores": 4})
    assert updated.action == "update" and not updated.protected


def test_a_retained_resource_is_only_forgotten() -> None:
    parent = res("g", "pgc:x:Group", {}, retainOnDelete=True)
    child = res("f", "proxmoxve:download/file:File", {"url": "u"}, parent=parent["urn"])
    (group, file) = diff({"resources": [parent, child]}, {"resources": []})
    assert group.retained and file.retained and not file.fails
    assert any("only dropped from the Pulumi state" in r for r in change_rows(file))


def test_inheritance_follows_the_parent_chain() -> None:
    top = res("top", "pgc:x:Cluster", {}, protect=True)
    mid = res("mid", "pgc:x:Worker", {}, parent=top["urn"])
    leaf = res("leaf", "command:remote:Command", {}, parent=mid["urn"])
    free = res("free", "command:remote:Command", {})
    flags = effective({"resources": [leaf, mid, top, free]}, "protect")
    assert {u: flags[u] for u in (leaf["urn"], mid["urn"], top["urn"], free["urn"])} == {
        leaf["urn"]: True, mid["urn"]: True, top["urn"]: True, free["urn"]: False,
    }  # fmt: skip
    assert unprotect_command("urn:a$b::c d") == "pulumi state unprotect 'urn:a$b::c d'"


PROVIDER = "urn:pulumi:t::p::pulumi:providers:proxmoxve::prov"


def boot_and_vm(**vm_options: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    snippet = dict(res("vd", "proxmoxve:index/fileLegacy:FileLegacy", {"sourceRaw": {"data": "a"}},
                       deleteBeforeReplace=True), provider=PROVIDER)  # fmt: skip
    vm = dict(res("vm", "proxmoxve:index/vmLegacy:VmLegacy",
                  {"initialization": {"vendorDataFileId": "vd-id", "type": "nocloud"}, "description": "x"},
                  **{"protect": True, **vm_options}),
              provider=PROVIDER, propertyDependencies={"initialization": [snippet["urn"]]})  # fmt: skip
    step = dict(res("step", "command:remote:Command", {"create": "c"}, replaceWith=[vm["urn"]]), provider="c")
    return snippet, vm, step


def replaced_vendor_data(*resources: dict[str, Any]) -> dict[str, Any]:
    before = {"resources": list(resources)}
    after = copy.deepcopy(before)
    after["resources"][0]["inputs"]["sourceRaw"]["data"] = "b"
    return {c.name: c for c in diff(before, after)}


def test_a_delete_first_replacement_takes_its_dependents_whose_input_would_force_a_replace() -> None:
    changes = replaced_vendor_data(*boot_and_vm())
    assert changes["vd"].action == "replace" and changes["vd"].delete_first
    vm = changes["vm"]
    assert vm.action == "replace" and vm.delete_first and vm.protected  # refused whatever the program says
    assert "its initialization comes from vd, replaced delete-first" in vm.replace_reasons[0]
    assert changes["step"].action == "replace"  # replaceWith the VM
    assert any("will fail: protected, and replaced as a dependent" in r for r in change_rows(vm))


def test_a_dependent_is_left_alone_when_its_ignore_changes_cover_the_input_or_the_input_forces_nothing() -> None:
    ignored = replaced_vendor_data(*boot_and_vm(ignoreChanges=["initialization"]))
    assert set(ignored) == {"vd"}
    snippet, vm, _ = boot_and_vm()
    vm["propertyDependencies"] = {"description": [snippet["urn"]]}  # an input no rule replaces for
    assert set(replaced_vendor_data(snippet, vm)) == {"vd"}
    snippet, vm, _ = boot_and_vm()
    snippet["options"] = {}  # create first: dependents are updated to the new one, not deleted
    assert set(replaced_vendor_data(snippet, vm)) == {"vd"}


def test_a_vendor_data_change_in_a_real_plan_replaces_the_snippet_and_no_vm() -> None:
    """The snippet is replaced delete-first (same name); its VMs reach it by a known volume id and an ordering edge,
    not by its output, so the engine has no dependent to delete first (WorkerBootFiles.vendor_data_file_id). Before
    that wiring this diff replaced every protected VM on the node, and `pulumi up` failed on them."""
    raw = base_spec()
    for worker in raw["workers"]:
        worker["protect"] = True
    key = new_digest_key()
    before = plan_with(raw, SECRETS, key)
    after = copy.deepcopy(before)
    snippets = [r for r in after["resources"] if r["name"].endswith("-vendor-data")]
    assert snippets and all(r["options"].get("deleteBeforeReplace") for r in snippets)
    snippets[0]["inputs"]["sourceRaw"]["data"] += "# one more line\n"
    changes = diff(before, after)
    assert [(c.name, c.action) for c in changes] == [(snippets[0]["name"], "replace")]
    vms = [r for r in before["resources"] if r["type"].endswith("VmLegacy")]
    assert vms and all(snippets[0]["urn"] in r["dependencies"] for r in vms if r["inputs"]["nodeName"] ==
                       snippets[0]["inputs"]["nodeName"])  # fmt: skip
    # The same VMs wired to the snippet's output are what the engine deletes first (and refuses: protected).
    for r in after["resources"]:
        if r["type"].endswith("VmLegacy") and r["inputs"]["nodeName"] == snippets[0]["inputs"]["nodeName"]:
            r["propertyDependencies"] = {"initialization": [snippets[0]["urn"]]}
    wired = copy.deepcopy(before)
    for r in wired["resources"]:
        if r["type"].endswith("VmLegacy") and r["inputs"]["nodeName"] == snippets[0]["inputs"]["nodeName"]:
            r["propertyDependencies"] = {"initialization": [snippets[0]["urn"]]}
    replaced = [c for c in diff(wired, after) if c.type.endswith("VmLegacy")]
    assert replaced and all(c.action == "replace" and c.protected for c in replaced)


def test_the_unprotect_command_names_the_urn_the_engine_stores() -> None:
    """The mock monitor's URN names only the parent's type; the engine's chains every ancestor's, as pinned."""
    program = find_program(ROOT)
    stack = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())
    documents = []
    for edit in (False, True):
        document = copy.deepcopy(stack)
        if edit:
            cluster = document["config"]["proxmox-gpu-cluster:cluster"]
            cluster["workers"] = cluster["workers"][1:]
        recording, capacity = plan("prod", document, program.main, project=program.project, placeholder_secrets=True)
        documents.append(plan_document("prod", recording, capacity, project=program.project))
    flagged = [c for c in diff(*documents) if c.protected]
    assert any(c.type.endswith("VmLegacy") for c in flagged)
    pinned = set((ROOT / "tests" / "stacks" / "urns" / "prod.txt").read_text().split())
    for change in flagged:
        urn = shlex.split(change.unprotect)[-1]
        assert urn in pinned and change.unprotect == unprotect_command(urn)
        assert engine_urns(documents[0])[change.urn] == urn
