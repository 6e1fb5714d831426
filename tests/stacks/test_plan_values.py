"""The values a plan diff shows (old → new, escaped and bounded), secrets as keyed fingerprints that never leak,
protection as the engine enforces it, and replacement by each provider's own rules (stacks/plan/diff.py,
stacks/plan/values.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from proxmox_gpu_cluster import GpuCluster, export
from proxmox_gpu_cluster.core.capacity import capacity_table
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.stacks.config import load
from proxmox_gpu_cluster.stacks.plan import plan_document
from proxmox_gpu_cluster.stacks.plan.diff import Change, change_rows, diff, path_text, property_path
from proxmox_gpu_cluster.stacks.plan.report import diff_document, render_diff
from proxmox_gpu_cluster.stacks.plan.values import (
    DIFF_LINES,
    INLINE,
    MISSING,
    SECRET_KEY_ENV,
    digest_key_from_env,
    new_digest_key,
    show,
    value_lines,
)
from proxmox_gpu_cluster.testing import SECRET_SIG, SECRET_VALUE, RecordingMocks, redact, run
from proxmox_gpu_cluster.testing_pci import pci_invokes
from tests.support import SECRETS, base_spec, stack_args, stack_config

STACK = "urn:pulumi:t::p::pulumi:pulumi:Stack::p-t"


def res(name: str, type_: str, inputs: dict[str, Any], parent: str = STACK, **options: Any) -> dict[str, Any]:
    urn = f"urn:pulumi:t::p::{type_}::{name}"
    return {"urn": urn, "type": type_, "name": name, "parent": parent, "inputs": inputs, "options": options}


def one(before: dict[str, Any], after_inputs: dict[str, Any], **after_options: Any) -> Change:
    """The single change of one resource whose inputs (and options) become these."""
    after = copy.deepcopy(before)
    after["inputs"] = after_inputs
    after["options"] = {**before["options"], **after_options}
    (change,) = diff({"resources": [before]}, {"resources": [after]})
    return change


# --- values ---------------------------------------------------------------------------------------------------


def test_scalars_and_small_structures_are_shown_inline_old_to_new() -> None:
    assert value_lines("spec.hard.cpu", "8", "16") == ['spec.hard.cpu: "8" → "16"']
    assert value_lines("cores", 8, 16.0) == ["cores: 8 → 16.0"]
    assert value_lines("tags", ["a"], ["a", "b"]) == ['tags: ["a"] → ["a", "b"]']
    assert value_lines("labels", {"b": 1, "a": 2}, None) == ['labels: {"a": 2, "b": 1} → null']
    assert value_lines("environment.X", MISSING, "[unknown]") == ["environment.X: (none) → (known after apply)"]


def test_control_and_bidi_characters_are_escaped_never_emitted() -> None:
    nasty = "ok\x1b[2J\u202eevil\rline\u2028x"
    (line,) = value_lines("description", "plain", nasty)
    assert "\x1b" not in line and "\u202e" not in line and "\r" not in line and "\u2028" not in line
    assert "\\u202e" in line and "\\u2028" in line
    multi = value_lines("create", "a\nb\n", "a\n\x1b]8;;evil\x07\nb\n")
    assert not any(ch in "".join(multi) for ch in "\x1b\x07")
    assert "  +\\x1b]8;;evil\\x07" in multi
    # a key (a label name) is escaped in the path too
    assert path_text(["metadata", "labels", "a\u202eb"]) == 'metadata.labels["a\\u202eb"]'


def test_long_text_is_a_unified_diff_of_its_lines_and_cut_when_too_long() -> None:
    old = "\n".join(f"line {i}" for i in range(200))
    new = old.replace("line 5\n", "line five\n")
    lines = value_lines("sourceRaw.data", old, new)
    assert lines[0] == "sourceRaw.data:" and "  -line 5" in lines and "  +line five" in lines
    assert len(lines) < 10  # only the hunk around the change
    everything = value_lines("data", old, "\n".join(f"other {i}" for i in range(200)))
    assert len(everything) == 1 + DIFF_LINES + 1 and everything[-1].endswith("more diff lines cut")
    assert show("x" * (INLINE + 50)).endswith("… (52 more chars)")


# --- secrets --------------------------------------------------------------------------------------------------


def envelope(value: Any) -> dict[str, Any]:
    return {SECRET_SIG: SECRET_VALUE, "value": value}


def test_redact_without_a_key_is_unchanged_and_with_one_is_a_keyed_fingerprint() -> None:
    inputs = {"connection": envelope({"host": "h", "password": "CANARY-1"}), "plain": 1}
    assert redact(inputs) == {"connection": "[secret]", "plain": 1}
    key, other_key = new_digest_key(), new_digest_key()
    first = redact(inputs, key)["connection"]
    assert first.startswith("[secret:") and "CANARY" not in first
    assert redact(copy.deepcopy(inputs), key)["connection"] == first  # same value, same key: same fingerprint
    assert redact(inputs, other_key)["connection"] != first  # useless without the key
    changed = {"connection": envelope({"host": "h", "password": "CANARY-2"})}
    assert redact(changed, key)["connection"] != first
    assert redact({"s": envelope("[unknown]")}, key) == {"s": "[secret]"}  # unknown: not known to be unchanged


def test_the_key_comes_from_the_environment_and_a_bad_one_is_refused_without_echo() -> None:
    assert digest_key_from_env({}) is None
    assert digest_key_from_env({SECRET_KEY_ENV: "00" * 32}) == bytes(32)
    for bad in ("zz-not-hex-SECRETISH", "abcd"):
        with pytest.raises(ValueError, match=SECRET_KEY_ENV) as err:
            digest_key_from_env({SECRET_KEY_ENV: bad})
        assert bad not in str(err.value)


def test_a_changed_secret_says_so_with_its_non_secret_reason_and_an_unfingerprinted_one_may_have() -> None:
    before = res("join", "command:remote:Command", {"connection": "[secret:aaaa]", "create": "a"})
    change = one(before, {"connection": "[secret:bbbb]", "create": "b"})
    assert change.values == ("connection: changed (secret) (with create)", 'create: "a" → "b"')
    unchanged = one(before, {"connection": "[secret:aaaa]", "create": "b"})
    assert unchanged.paths == ("create",)
    old_base = one(res("j", "command:remote:Command", {"stdin": "[secret]"}), {"stdin": "[secret:cccc]"})
    assert old_base.values == ("stdin: may have changed (secret; not fingerprinted)",)


def plan_with(raw: dict[str, Any], secrets: dict[str, str], key: bytes | None) -> dict[str, Any]:
    config, keys = stack_config(raw, secrets)
    recording = run(
        lambda: export(GpuCluster("cluster", stack_args(*load()))),
        stack="test",
        config=config,
        secret_keys=keys,
        mocks=RecordingMocks(invokes=pci_invokes(load_spec(raw), None)),
    )
    return plan_document("t", recording, capacity_table(load_spec(raw)), secret_key=key)


def test_a_rotated_join_token_shows_as_changed_secret_and_never_leaks_in_any_rendering() -> None:
    raw = base_spec()
    key = new_digest_key()
    planted = "zq7.PLANTED-SECRET-VALUE-91"
    before = plan_with(raw, SECRETS, key)
    after = plan_with(raw, {**SECRETS, "kubeadmJoinToken": planted}, key)
    changes = diff(before, after)
    secret_lines = [v for c in changes for v in c.values if "(secret)" in v]
    assert secret_lines, "the token rotation is invisible"
    assert all("changed (secret)" in v for v in secret_lines)
    renderings = [
        render_diff(changes, 1, "cluster-"),
        render_diff(changes, 1, "cluster-", markdown=True),
        json.dumps(diff_document(changes, 1, "cluster-")),
        json.dumps(before),
        json.dumps(after),
    ]
    for text in renderings:
        assert planted not in text and "PLANTED" not in text and SECRETS["kubeadmJoinToken"] not in text
        assert key.hex() not in text
    # a base plan made without the key (an older revision's code): every secret it has may have changed
    older = diff(plan_with(raw, SECRETS, None), after)
    assert any("may have changed (secret; not fingerprinted)" in v for c in older for v in c.values)
    assert not any("changed (secret)" in v and "may have" not in v for c in older for v in c.values)


# --- replacement rules ----------------------------------------------------------------------------------------

JOB = res("smoke", "kubernetes:batch/v1:Job", {"metadata": {"namespace": "n"}, "spec": {
    "backoffLimit": 1, "template": {"spec": {"containers": [{"image": "cuda:12.8"}]}}}})  # fmt: skip


def edited(resource: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    inputs = copy.deepcopy(resource["inputs"])
    *head, last = property_path(path)
    target = inputs
    for part in head:
        target = target.setdefault(part, {}) if isinstance(part, str) else target[part]
    target[last] = value
    return inputs


@pytest.mark.parametrize(
    ("resource", "path", "value", "action"),
    [
        (JOB, "spec.template.spec.containers[0].image", "cuda:13", "replace"),  # diff.go: a Job's template
        (JOB, "spec.backoffLimit", 2, "update"),
        (JOB, "metadata.namespace", "other", "replace"),
        (res("q", "kubernetes:core/v1:ResourceQuota", {"spec": {"hard": {"a": "1"}}}), "spec.hard.a", "2", "update"),
        (
            res("q", "kubernetes:core/v1:ResourceQuota", {"spec": {"hard": {}}}),
            "spec.scopes",
            ["BestEffort"],
            "replace",
        ),
        (
            res("rb", "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", {"roleRef": {"name": "a"}}),
            "roleRef.name",
            "b",
            "replace",
        ),
        (
            res("np", "kubernetes:core/v1:NodePatch", {"metadata": {"name": "n", "labels": {}}}),
            'metadata.labels["nvidia.com/mig.config"]',
            "all-1g.5gb",
            "update",
        ),
        (res("np", "kubernetes:core/v1:NodePatch", {"metadata": {"name": "n"}}), "metadata.name", "m", "replace"),
        (
            res("ns", "kubernetes:core/v1:Namespace", {"metadata": {"name": "a", "labels": {}}}),
            "metadata.labels.x",
            "y",
            "update",
        ),
        (res("r", "kubernetes:helm.sh/v3:Release", {"name": "op", "values": {"a": 1}}), "values.a", 2, "update"),
        (res("r", "kubernetes:helm.sh/v3:Release", {"name": "op", "chart": "c"}), "name", "op2", "replace"),
        (res("r", "kubernetes:helm.sh/v3:Release", {"name": "op", "version": "v1"}), "version", "v2", "update"),
        (res("vm", "proxmoxve:index/vmLegacy:VmLegacy", {"nodeName": "a"}), "nodeName", "b", "replace"),
        (
            res("vm", "proxmoxve:index/vmLegacy:VmLegacy", {"nodeName": "a", "migrate": True}),
            "nodeName",
            "b",
            "update",
        ),  # vm.go: ForceNewIf node_name unless migrate
        (res("vm", "proxmoxve:index/vmLegacy:VmLegacy", {"cpu": {"cores": 8}}), "cpu.cores", 16, "update"),
        (
            res("vm", "proxmoxve:index/vmLegacy:VmLegacy", {"initialization": {"vendorDataFileId": "a"}}),
            "initialization.vendorDataFileId",
            "b",
            "replace",
        ),
        (
            res("vm", "proxmoxve:index/vmLegacy:VmLegacy", {"disks": [{"fileId": "a", "size": 1}]}),
            "disks[0].size",
            2,
            "update",
        ),
        (
            res("vm", "proxmoxve:index/vmLegacy:VmLegacy", {"disks": [{"fileId": "a", "size": 1}]}),
            "disks[0].fileId",
            "b",
            "replace",
        ),
        (
            res("f", "proxmoxve:index/fileLegacy:FileLegacy", {"sourceRaw": {"data": "a"}}),
            "sourceRaw.data",
            "b",
            "replace",
        ),
        (res("d", "proxmoxve:download/file:File", {"url": "a", "overwrite": False}), "overwrite", True, "update"),
        (res("d", "proxmoxve:download/file:File", {"url": "a"}), "url", "b", "replace"),
        (res("c", "command:remote:Command", {"create": "a", "delete": "x"}), "create", "b", "update"),
        (res("c", "command:remote:Command", {"create": "a", "delete": "x"}), "delete", "y", "update"),
        (res("c", "command:local:Command", {"triggers": ["a"]}), "triggers[0]", "b", "replace"),
        (res("c", "command:remote:CopyToRemote", {"triggers": ["a"]}), "triggers", ["a", "b"], "replace"),
    ],
)
def test_replacement_follows_each_providers_own_rules(
    resource: dict[str, Any], path: str, value: Any, action: str
) -> None:
    change = one(resource, edited(resource, path, value))
    assert change.action == action, change
    assert bool(change.replace_reasons) == (action == "replace")


def test_a_configmap_is_replaced_for_its_data_unless_the_provider_makes_them_mutable() -> None:
    provider = {"urn": "prov", "type": "pulumi:providers:kubernetes", "name": "k", "inputs": {}, "options": {}}
    cm = dict(res("cm", "kubernetes:core/v1:ConfigMap", {"metadata": {"name": "x"}, "data": {"a": "1"}}),
              provider="prov")  # fmt: skip
    changed = dict(cm, inputs={"metadata": {"name": "x"}, "data": {"a": "2"}})
    (replaced,) = [c for c in diff({"resources": [provider, cm]}, {"resources": [provider, changed]})]
    assert replaced.action == "replace" and replaced.delete_first  # same explicit name: delete first
    assert "delete first: the old one is gone before the new one exists" in "\n".join(change_rows(replaced))
    mutable = dict(provider, inputs={"enableConfigMapMutable": "true"})
    (updated,) = diff({"resources": [mutable, cm]}, {"resources": [mutable, changed]})
    assert updated.action == "update"


def test_delete_before_replace_and_create_first() -> None:
    snippet = res("vd", "proxmoxve:index/fileLegacy:FileLegacy", {"sourceRaw": {"data": "a"}},
                  deleteBeforeReplace=True)  # fmt: skip
    assert one(snippet, {"sourceRaw": {"data": "b"}}).delete_first
    job = one(JOB, edited(JOB, "spec.template.spec.containers[0].image", "cuda:13"))
    assert not job.delete_first  # autonamed: the new Job is created before the old one goes
    assert any("create first" in r for r in change_rows(job))


def test_updates_the_api_refuses_are_flagged() -> None:
    pc = res("pc", "kubernetes:scheduling.k8s.io/v1:PriorityClass", {"metadata": {"name": "p"}, "value": 1000})
    change = one(pc, {"metadata": {"name": "p"}, "value": 2000})
    assert change.action == "update" and change.fails and "immutable" in change.fails[0]
    assert not one(pc, {"metadata": {"name": "p"}, "value": 1000, "description": "d"}).fails
    pci = res("m", "proxmoxve:hardware/mapping/pci:Pci", {"name": "a", "comment": "c"})
    assert one(pci, {"name": "b", "comment": "c"}).fails
    assert not one(pci, {"name": "a", "comment": "d"}).fails


def test_paths_are_pulumi_property_paths_and_ignore_changes_reads_them() -> None:
    assert path_text(["metadata", "labels", "nvidia.com/gpu.present", 0]) == (
        'metadata.labels["nvidia.com/gpu.present"][0]'
    )
    assert property_path('a["x.y"][*].b[2]') == ("a", "x.y", None, "b", 2)
    node = res("np", "kubernetes:core/v1:NodePatch", {"metadata": {"labels": {"a.b/c": "1", "d": "1"}}},
               ignoreChanges=['metadata.labels["a.b/c"]'])  # fmt: skip
    change = one(node, {"metadata": {"labels": {"a.b/c": "2", "d": "2"}}})
    assert change.paths == ("metadata.labels.d",)


def test_the_smoke_test_job_is_replaced_when_its_template_changes_in_a_real_plan() -> None:
    raw = base_spec()
    raw.setdefault("gpuOperator", {})["smokeTest"] = {"enabled": True}
    key = new_digest_key()
    before = plan_with(raw, SECRETS, key)
    raw["gpuOperator"]["driverVersion"] = "580.105.08"
    after = plan_with(raw, SECRETS, key)
    jobs = [c for c in diff(before, after) if c.type == "kubernetes:batch/v1:Job"]
    assert jobs and all(c.action == "replace" for c in jobs)
    assert all(any(r.startswith("spec.template") for r in c.replace_reasons) for c in jobs)


def test_a_step_commands_launcher_reads_as_one_word_unless_another_revision_changed_it() -> None:
    from proxmox_gpu_cluster.render.agent_bundle import step_command
    from proxmox_gpu_cluster.stacks.plan.values import LAUNCHER_SHOWN

    old = step_command("ubuntu", "driver", ["--version", "580.95.05"])
    new = step_command("ubuntu", "driver", ["--version", "580.105.08"])
    text = "\n".join(value_lines("create", old, new))
    assert text.count(LAUNCHER_SHOWN) == 2 and len(text) < 300 and "580.95.05" in text and "580.105.08" in text
    older = old.replace("exec bash", "exec  bash")  # another revision's launcher
    text = "\n".join(value_lines("create", older, new))
    assert "exec  bash" in text and LAUNCHER_SHOWN in text
