"""docs/spec.md is generated from the models' field descriptions and must be current; every field has one."""

from __future__ import annotations

from proxmox_gpu_cluster.stacks.reference import render_reference
from tests.support import ROOT


def test_docs_spec_md_is_current() -> None:
    committed = (ROOT / "docs" / "spec.md").read_text()
    assert committed == render_reference(), "regenerate: python -m proxmox_gpu_cluster.stacks.reference > docs/spec.md"


def test_every_field_is_described_and_every_model_linked_exists() -> None:
    text = render_reference()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert rows and all(not line.rstrip().endswith("|  |") for line in rows)  # no empty description
    headings = {line[3:].lower() for line in text.splitlines() if line.startswith("## ")}
    for line in rows:
        for link in line.split("](#")[1:]:
            assert link.split(")")[0] in headings
    assert {"clusterspec", "worker", "monitoringspec", "alertsspec", "priorityclassspec", "existinggpunode"} <= headings
