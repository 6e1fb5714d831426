"""Plan diffs of routine spec edits: what each touches, and above all what it leaves alone (VMs, mappings, disks,
host prep), with the disruption summary a reviewer reads."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxmox_gpu_cluster.core.capacity import capacity_table
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.stacks.plan import main, plan_document
from proxmox_gpu_cluster.stacks.plan.diff import Change, cluster_prefix, diff, input_paths
from proxmox_gpu_cluster.stacks.plan.report import diff_document, render_diff, summary
from tests.support import ROOT, base_spec, external, plan_stack

LEFT_ALONE = ("vmLegacy:VmLegacy", "mapping/pci:Pci", "download/file:File", "fileLegacy:FileLegacy")


def document(raw: dict[str, Any]) -> dict[str, Any]:
    for node in raw["proxmox"]["nodes"]:
        node["hostPrep"] = True
    return plan_document("t", plan_stack(raw), capacity_table(load_spec(raw)))


BASE = base_spec()
BEFORE = document(copy.deepcopy(BASE))


def changes_for(edit: Any) -> tuple[list[Change], dict[str, Any]]:
    raw = copy.deepcopy(BASE)
    edit(raw)
    after = document(raw)
    changes = diff(BEFORE, after)
    assert not [c for c in changes if c.type.endswith(LEFT_ALONE)], "a routine edit touched a VM, mapping or disk"
    return changes, summary(changes, 1, cluster_prefix(after))


def names(changes: list[Change], action: str | None = None) -> set[str]:
    return {c.name for c in changes if action is None or c.action == action}


def test_time_slicing_replicas_touch_the_sharing_config_the_release_and_that_nodes_label() -> None:
    changes, s = changes_for(lambda raw: raw["workers"][2]["timeSlicing"].update(replicas=8))
    # the sharing ConfigMap (content-named, so recreated), the release values naming it, the node's label, and the
    # node's capacity gate that checks the new count; nothing else
    assert names(changes) == {"cluster-gpu-operator-device-plugin-config", "cluster-gpu-operator-release",
                              "cluster-gpu-nodes-ts-1", "cluster-ts-1-capacity-check"}  # fmt: skip
    assert s["configMapsRecreated"] == ["cluster-gpu-operator-device-plugin-config"]
    assert s["nodesRolled"] == [] and s["hostPrepRuns"] == [] and s["vmsReplacedOrDestroyed"] == []


def test_one_nodes_mig_geometry_rolls_that_node_only() -> None:
    changes, s = changes_for(lambda raw: raw["workers"][1]["gpus"][0].update(mig={"7g.40gb": 1}))
    assert "cluster-gpu-nodes-mig-2" in names(changes)
    assert {"cluster-mig-2-mig-begin", "cluster-mig-2-mig-end"} <= names(changes)
    # mig-1's end step runs again for the custom ConfigMap's new name, a no-op on a node no change cordoned.
    assert not any(
        n.startswith(("cluster-mig-1-", "cluster-ts-1-")) for n in names(changes) - {"cluster-mig-1-mig-end"}
    )
    assert s["nodesRolled"] == ["mig-2"] and s["rollingRounds"] == 1


def test_a_driver_bump_rolls_every_host_driver_node() -> None:
    changes, s = changes_for(lambda raw: raw["gpuOperator"].update(driverVersion="580.105.08"))
    drivers = {c.name for c in changes if c.name.endswith("-bootstrap-driver")}
    assert drivers == {
        "cluster-mig-1-bootstrap-driver",
        "cluster-mig-2-bootstrap-driver",
        "cluster-ts-1-bootstrap-driver",
    }
    assert next(c for c in changes if c.name == "cluster-ts-1-bootstrap-driver").action == "update"  # not replaced
    assert s["nodesRolled"] == ["mig-1", "mig-2", "ts-1"] and s["rollingRounds"] == 3
    assert "3 GPU node(s) drained and changed, 1 at a time (3 round(s)): mig-1, mig-2, ts-1" in render_diff(
        changes, 1, "cluster-"
    )


@pytest.mark.parametrize("edit", ["add", "remove"])
def test_adding_or_removing_a_worker_never_touches_host_prep(edit: str) -> None:
    def change(raw: dict[str, Any]) -> None:
        if edit == "remove":
            raw["workers"].pop(0)
        else:  # on pve1's spare A10, declared (and so prepared and mapped) already
            raw["workers"].append({"name": "a10-9", "vmid": 2099, "node": "pve1", "gpus": ["a10-0"]})

    raw = copy.deepcopy(BASE)
    change(raw)
    changes = diff(BEFORE, document(raw))
    touched = [c for c in changes if c.action in ("update", "replace")]
    assert not [c for c in touched if "host-prep" in c.name or c.type.endswith(LEFT_ALONE)]
    own = [c for c in changes if c.action == ("remove" if edit == "remove" else "add")]
    assert own and all("-mig-1" in c.name or "-a10-9" in c.name for c in own)


def test_replacement_follows_force_new_inputs_triggers_and_replace_with() -> None:
    def res(urn: str, type_: str, inputs: dict[str, Any], **options: Any) -> dict[str, Any]:
        return {"urn": urn, "type": type_, "name": urn, "inputs": inputs, "options": options}

    before = {"resources": [
        res("vm", "proxmoxve:index/vmLegacy:VmLegacy", {"vmId": 1, "cores": 2, "hostpcis": [{"id": "a"}]},
            ignoreChanges=["hostpcis[*].id"]),
        res("step", "command:remote:Command", {"create": "x"}, replaceWith=["vm"]),
        res("wait", "command:local:Command", {"triggers": ["a"]}),
        res("gone", "kubernetes:core/v1:ConfigMap", {}),
    ]}  # fmt: skip
    after = copy.deepcopy(before)
    after["resources"][0]["inputs"].update(vmId=2, hostpcis=[{"id": "b"}])
    after["resources"][2]["inputs"]["triggers"] = ["b"]
    after["resources"].pop()
    changes = {c.name: c for c in diff(before, after)}
    vm = changes["vm"]
    assert (vm.action, vm.paths, vm.values, vm.replace_reasons) == ("replace", ("vmId",), ("vmId: 1 → 2",), ("vmId",))
    assert changes["step"].action == "replace"  # its VM is replaced, so it runs again on the new one
    assert changes["wait"].action == "replace" and changes["gone"].action == "remove"
    assert diff_document(list(changes.values()))["summary"]["vmsReplacedOrDestroyed"] == ["vm"]


def test_input_paths() -> None:
    assert list(input_paths({"a": {"b": [1, {"c": 2}]}, "d": 1}, {"a": {"b": [1, {"c": 3}]}, "d": 1})) == ["a.b[1].c"]
    assert list(input_paths({"a": [1]}, {"a": [1, 2]})) == ["a"]
    assert list(input_paths({}, {})) == []


def test_the_markdown_form_is_a_pr_comment() -> None:
    changes, _ = changes_for(lambda raw: raw["gpuOperator"].update(driverVersion="580.105.08"))
    text = render_diff(changes, 1, "cluster-", markdown=True)
    assert text.startswith("### Offline plan diff\n\n- ")
    assert "```diff\n~  command:remote:Command cluster-mig-1-bootstrap-driver  (create" in text


def bumped(path: Path) -> Path:
    document = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    document["config"]["proxmox-gpu-cluster:cluster"]["gpuOperator"]["driverVersion"] = "580.105.08"
    path.write_text(yaml.safe_dump(document))
    return path


def test_the_cli_compares_the_stack_file_with_another(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = bumped(tmp_path / "Pulumi.next.yaml")
    assert main(["--placeholder-secrets", "dev", "--main", str(ROOT), "--diff-config", str(other)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("0 to add, 4 to update, 0 to replace, 0 to remove\n")
    assert "2 GPU node(s) drained and changed, 1 at a time (2 round(s)): gpu-a10-1, gpu-a100-1" in text
    assert main(["--placeholder-secrets", "dev", "--main", str(ROOT), "--diff-config", str(other), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["summary"]["nodesRolled"] == ["gpu-a10-1", "gpu-a100-1"]
    assert {c["action"] for c in document["changes"]} == {"update"}


def test_the_cli_compares_with_a_git_revision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    git = external(Path("/usr/bin/git"), "git", "install it with: apt-get install git")
    stack = tmp_path / "Pulumi.dev.yaml"
    stack.write_text((ROOT / "Pulumi.dev.yaml").read_text())
    for command in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run([str(git), "-C", str(tmp_path), *command], check=True)
    bumped(stack)
    assert (
        main(
            [
                "--placeholder-secrets",
                "dev",
                "--main",
                str(ROOT),
                "--config",
                str(stack),
                "--diff-base",
                "HEAD",
                "--markdown",
            ]
        )
        == 0
    )
    out = capsys.readouterr()
    assert "- 2 GPU node(s) drained and changed" in out.out
    # The program is not in the stack file's repository: no base revision of the code, the current one plans both.
    assert f"{ROOT / '__main__.py'} is outside {tmp_path.resolve()}: the base stack file is planned with" in out.err
    assert (
        main(["--placeholder-secrets", "dev", "--main", str(ROOT), "--config", str(stack), "--diff-base", "nope"]) == 2
    )
    assert capsys.readouterr().err == f"--diff-base nope: no such commit in {tmp_path.resolve()}\n"


def test_a_script_change_re_runs_exactly_its_steps_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from proxmox_gpu_cluster.render import agent_bundle

    old_fp = agent_bundle.fingerprint("join")
    original = agent_bundle._text
    monkeypatch.setattr(agent_bundle, "_text", lambda p, n: original(p, n) + ("\n:\n" if n == "guest_join.sh" else ""))
    agent_bundle.bundle_files.cache_clear()
    agent_bundle.materialize.cache_clear()
    try:
        new_fp = agent_bundle.fingerprint("join")
        after = document(copy.deepcopy(BASE))
    finally:
        monkeypatch.undo()
        agent_bundle.bundle_files.cache_clear()
        agent_bundle.materialize.cache_clear()
    changes = diff(BEFORE, after)
    workers = ("mig-1", "mig-2", "ts-1")
    # Each guest's agent copy gets the new bundle, each join runs it, and verify after it (it uncordons what the
    # join may cordon: --after); no other step, no VM, nothing on the hosts.
    steps = ("agent", "join", "verify")
    assert names(changes, "update") == {f"cluster-{w}-bootstrap-{s}" for w in workers for s in steps}
    assert not [c for c in changes if c.action != "update"]
    s = summary(changes, 1, cluster_prefix(after))
    assert s["agentSteps"] == {f"join {old_fp}→{new_fp}": [f"{w}-bootstrap-join" for w in workers]}
    assert s["nodesRolled"] == [] and s["hostPrepRuns"] == []
    text = render_diff(changes, 1, cluster_prefix(after))
    assert (
        f"Node agent: join {old_fp}→{new_fp} re-runs on 3 machine(s) (what it runs changed): mig-1-bootstrap-join"
        in text
    )
    assert f"cluster-ts-1-bootstrap-join  (create)  [agent join {old_fp}→{new_fp}]" in text


def test_a_spec_edit_re_runs_no_agent_step_for_its_code() -> None:
    changes, s = changes_for(lambda raw: raw["workers"][2]["timeSlicing"].update(replicas=8))
    assert s["agentSteps"] == {}
    assert "Node agent: no step runs again for a change of what it runs" in render_diff(changes)
