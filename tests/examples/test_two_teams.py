"""Two clusters in one program (examples/two-teams), on one Proxmox node and one Kubernetes cluster: planned whole,
nothing on the host or in Kubernetes shared by name, and a second claim on what one owns refused naming both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.stacks.plan import main, plan
from proxmox_gpu_cluster.stacks.plan.inputs import find_program
from proxmox_gpu_cluster.testing import Recording
from proxmox_gpu_cluster.testing_pci import GET_PCI, pci_invokes
from tests.support import ROOT

EXAMPLE = ROOT / "examples" / "two-teams"


def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLE / "Pulumi.dev.yaml").read_text())
    return loaded


def planned() -> Recording:
    program = find_program(EXAMPLE)
    recording, _ = plan("dev", document(), program.main, project=program.project, placeholder_secrets=True)
    return recording


def test_both_clusters_plan_whole_and_name_nothing_alike() -> None:
    rec = planned()
    assert {r.name for r in rec.of_type("proxmox-gpu-cluster:cluster:GpuCluster")} == {"vision", "speech"}
    mappings = {r.name: r.plain_inputs["name"] for r in rec.of_type("proxmoxve:hardware/mapping/pci:Pci")}
    assert len(mappings) == 2 and len(set(mappings.values())) == 2  # one GPU each on pve1, scoped ids
    snippets = [r.plain_inputs["sourceRaw"]["fileName"] for r in rec.of_type("proxmoxve:index/fileLegacy:FileLegacy")
                if "sourceRaw" in r.plain_inputs]  # fmt: skip
    assert len(snippets) == len(set(snippets)) == 2
    images = [r.plain_inputs["fileName"] for r in rec.of_type("proxmoxve:download/file:File")]
    assert len(images) == len(set(images)) == 2  # one URL, two clusters: two files
    vms = {r.plain_inputs["vmId"] for r in rec.of_type("proxmoxve:index/vmLegacy:VmLegacy")}
    assert vms == {2101, 2201}
    namespaces = {r.plain_inputs["metadata"]["name"] for r in rec.of_type("kubernetes:core/v1:Namespace")}
    assert {"proxmox-gpu-cluster", "speech-rollouts"} <= namespaces
    assert len(rec.of_type("kubernetes:helm.sh/v3:Release")) == 1  # only vision installs the operator


def test_the_cli_plans_both_capacity_tables_disruptions_and_pci_for_either(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pci = tmp_path / "pve1.json"
    raw = document()["config"]

    specs = [load_spec(raw[f"{team}:cluster"]) for team in ("vision", "speech")]
    devices = pci_invokes(specs)[GET_PCI]({"nodeName": "pve1"})["devices"]  # pve1 has both teams' GPUs
    pci.write_text(json.dumps(devices))
    args = ["dev", "--main", str(EXAMPLE), "--placeholder-secrets", "--json", "--pci", f"pve1={pci}"]
    assert main(args) == 0
    plan_json = json.loads(capsys.readouterr().out)
    assert {row["worker"] for row in plan_json["capacity"]} == {"gpu-a10-1", "speech-a100-1"}
    assert set(plan_json["disruption"]) == {"vision", "speech"}
    assert main(["dev", "--main", str(EXAMPLE), "--placeholder-secrets", "--pci", f"pve9={pci}"]) == 2
    assert "--pci: the program preflights no Proxmox node pve9 (it preflights: pve1)" in capsys.readouterr().err


def test_a_second_claim_on_the_gpu_is_refused_naming_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = document()
    config = doc["config"]
    speech = config["speech:cluster"]
    speech["proxmox"]["nodes"] = config["vision:cluster"]["proxmox"]["nodes"]
    speech["workers"][0]["gpus"] = ["a10-0"]  # vision's GPU
    stack = tmp_path / "Pulumi.dev.yaml"
    stack.write_text(yaml.safe_dump(doc))
    assert main(["dev", "--main", str(EXAMPLE), "--config", str(stack), "--placeholder-secrets"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "GpuCluster(speech): GpuCluster 'speech' and GpuCluster 'vision' both claim the GPU at 0000:41:00 of "
        "Proxmox node pve1; only one cluster may own it"
    ]
