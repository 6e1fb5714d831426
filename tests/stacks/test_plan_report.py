"""plan_report: the summary, text, markdown and JSON of a diff carry what it does once it runs (plan_impact)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxmox_gpu_cluster.stacks.plan import main
from proxmox_gpu_cluster.stacks.plan.diff import Change, cluster_prefix, diff
from proxmox_gpu_cluster.stacks.plan.report import code_block, diff_document, markdown_text, render_diff, summary
from tests.stacks.test_plan_impact import prod_before, prod_document, worker
from tests.support import ROOT


def removal(tmp: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    return prod_before(), prod_document(tmp, lambda s: s["workers"].remove(worker(s, "gpu-a10-b")))


def test_removing_a_worker_says_it_is_drained_and_retired_not_that_nothing_is_drained(tmp_path: Path) -> None:
    before, after = removal(tmp_path)
    changes = diff(before, after)
    text = render_diff(changes, 1, cluster_prefix(after), before=before, after=after)
    lines = text.splitlines()
    assert "no GPU node drained" not in lines
    assert "no GPU node drained through a rollout slot; drained to be retired: gpu-a10-b" in lines
    _, _, rest = text.partition("What it does to the nodes:\n")
    assert rest, "the text has no section of what the diff does"
    section = rest.split("\n\n")[0].splitlines()
    assert "  gpu-a10-b: nvidia.com/gpu 4 → 0 (worker removed)" in section
    assert any(line.startswith("  Worker gpu-a10-b (VM 3202 on pve-b) retired:") for line in section)
    # without the plan documents the report still renders, and says only what the changes alone show
    bare = render_diff(changes, 1, cluster_prefix(after))
    assert "What it does to the nodes" not in bare and "no GPU node drained" in bare.splitlines()


def test_the_json_carries_the_impact_as_plain_data(tmp_path: Path) -> None:
    before = prod_before()
    after = prod_document(tmp_path, lambda s: worker(s, "gpu-a10-a")["timeSlicing"].update(replicas=8))
    changes = diff(before, after)
    document = json.loads(json.dumps(diff_document(changes, 1, "cluster-", before=before, after=after)))
    impact = document["summary"]["impact"]
    assert {"worker": "gpu-a10-a", "resource": "nvidia.com/gpu", "before": 8, "after": 16, "note": ""} in impact[
        "capacity"
    ]
    assert [e["daemonset"] for e in impact["operator"]] == ["nvidia-device-plugin-daemonset and gpu-feature-discovery"]
    assert document["summary"]["configMapsRecreated"] == ["cluster-gpu-operator-device-plugin-config"]
    assert len(document["changes"]) == len(changes)
    assert diff_document(changes, 1, "cluster-")["summary"]["impact"] is None
    assert summary(changes, 1, "cluster-", before=before, after=after)["impact"] == impact


def test_the_markdown_lists_the_summary_and_the_impact_and_folds_the_rows(tmp_path: Path) -> None:
    before = prod_before()
    after = prod_document(tmp_path, lambda s: s["proxmox"]["nodes"][1].update(acsOverride=True))
    changes = diff(before, after)
    text = render_diff(changes, 1, "cluster-", markdown=True, before=before, after=after)
    head, _, body = text.partition("<details><summary>Resources</summary>")
    assert head.startswith("### Offline plan diff\n\n- ")
    assert "- Proxmox hosts whose host prep runs again (may reboot, per rebootPolicy): pve-b" in head
    assert "#### What it does to the nodes\n\n- Proxmox host pve-b: pve-b-host-prep-prep runs again" in head
    assert "```diff\n" in body and "cluster-pve-b-host-prep-prep" in body and body.rstrip().endswith("</details>")


def test_no_secret_placeholder_reaches_any_form_of_the_report(tmp_path: Path) -> None:
    before, after = removal(tmp_path)
    changes = diff(before, after)
    forms = [
        render_diff(changes, 1, "cluster-", before=before, after=after),
        render_diff(changes, 1, "cluster-", markdown=True, before=before, after=after),
        json.dumps(diff_document(changes, 1, "cluster-", before=before, after=after)),
    ]
    assert not [f for f in forms if "plan-placeholder-" in f]


def test_the_cli_diff_reports_the_impact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:

    raw = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())
    worker(raw["config"]["proxmox-gpu-cluster:cluster"], "gpu-a10-a")["timeSlicing"]["replicas"] = 8
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(raw))
    argv = ["prod", "--placeholder-secrets", "--main", str(ROOT), "--diff-config", str(other)]
    assert main([*argv, "--json"]) == 0
    impact = json.loads(capsys.readouterr().out)["summary"]["impact"]
    assert [(c["worker"], c["before"], c["after"]) for c in impact["capacity"]] == [("gpu-a10-a", 8, 16)]
    assert main(argv) == 0
    assert "  gpu-a10-a: nvidia.com/gpu 8 → 16" in capsys.readouterr().out.splitlines()


def test_markdown_shows_stack_file_text_literally_never_as_markup() -> None:
    hostile = "<!-- hide --> **bold** `code` [link](x) | cell @octocat & _x_ #1 ~y~ \\n"
    shown = markdown_text(hostile)
    assert "<" not in shown and ">" not in shown and "@octocat" not in shown
    assert "&lt;!-- hide --&gt;" in shown and "&#64;octocat" in shown and "&amp;" in shown
    assert "\\*\\*bold\\*\\*" in shown and "\\`code\\`" in shown and "\\[link\\]" in shown and "\\|" in shown
    assert markdown_text("gpu-a10-a: nvidia.com/gpu 8 → 16") == "gpu-a10-a: nvidia.com/gpu 8 → 16"


def test_a_code_block_cannot_be_closed_by_its_lines() -> None:
    block = code_block(["a", "``` closed?", "`````"], "diff")
    fence = block.splitlines()[0].removesuffix("diff")
    assert set(fence) == {"`"} and len(fence) == 6 and block.endswith("\n" + fence)
    assert code_block(["plain"]) == "```\nplain\n```"


def test_a_change_that_will_fail_leads_the_summary_in_every_form() -> None:
    failing = Change("u1", "proxmoxve:index/vmLegacy:VmLegacy", "cluster-gpu-a-vm", "remove", fails=("will fail: x",))
    fine = Change("u2", "kubernetes:core/v1:ConfigMap", "cluster-cm", "update", ("data",))
    text = render_diff([failing, fine], 1, "cluster-")
    assert text.splitlines()[0].startswith("WILL FAIL at pulumi up (1 resource(s), see their rows")
    assert text.splitlines()[0].endswith("): gpu-a-vm")
    markdown = render_diff([failing, fine], 1, "cluster-", markdown=True).splitlines()
    assert markdown[2].startswith("- WILL FAIL at pulumi up")
    assert diff_document([failing, fine], 1, "cluster-")["summary"]["willFail"] == ["gpu-a-vm"]
    assert "WILL FAIL" not in render_diff([fine], 1, "cluster-")
