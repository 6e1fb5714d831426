"""The example programs plan under the recording mock and build what they promise: (a) the GPU stack on
bare-metal nodes and nothing on Proxmox, (b) one VM plus its bootstrap on another module's PCI mapping, (c) the
whole cluster composed with the team's own release, which waits for the GPU Operator."""

from __future__ import annotations

from pathlib import Path

import pulumi
import pytest
import yaml

from proxmox_gpu_cluster.stacks.config import InvalidStackConfig
from proxmox_gpu_cluster.stacks.plan import find_program, main, plan
from proxmox_gpu_cluster.testing import Recording
from tests.support import ROOT

EXAMPLES = ROOT / "examples"


def planned(example: str, stack: str = "dev") -> Recording:
    program = find_program(EXAMPLES / example)
    document = yaml.safe_load((program.directory / f"Pulumi.{stack}.yaml").read_text())
    recording, _ = plan(stack, document, program.main, project=program.project, placeholder_secrets=True)
    return recording


def test_bare_metal_gpu_stack_needs_no_proxmox() -> None:
    rec = planned("bare-metal-gpu-stack")
    assert not [r for r in rec.resources if r.type.startswith(("proxmoxve:", "command:"))]
    patches = {r.name: r.plain_inputs["metadata"] for r in rec.of_type("kubernetes:core/v1:NodePatch")}
    assert {m["name"] for m in patches.values()} == {"gpu-bm-01", "gpu-bm-02"}
    config_map = rec.named("gpu-operator-device-plugin-config").plain_inputs
    for meta in patches.values():
        label = meta["labels"]["nvidia.com/device-plugin.config"]
        assert label.startswith("time-slicing-4-") and label in config_map["data"]  # computed once, agrees
    values = rec.one("kubernetes:helm.sh/v3:Release").plain_inputs["values"]
    assert values["devicePlugin"]["config"]["name"] == config_map["metadata"]["name"]
    assert values["driver"]["version"] == "580.95.05" and values["driver"]["upgradePolicy"]["maxUnavailable"] == 1
    quota = rec.one("kubernetes:core/v1:ResourceQuota").plain_inputs
    assert quota["spec"]["hard"] == {"requests.nvidia.com/gpu": "8"}
    assert rec.outputs["capacity"]["gpu-bm-01"]["resources"] == {"nvidia.com/gpu": 8}


def test_single_gpu_vm_uses_the_given_mapping_and_bootstraps_it() -> None:
    rec = planned("single-gpu-vm")
    vm = rec.one("proxmoxve:index/vmLegacy:VmLegacy")
    assert vm.plain_inputs["hostpcis"][0]["mapping"] == "lab-a100-0"
    assert vm.plain_inputs["vmId"] == 4101 and vm.plain_inputs["nodeName"] == "pve3"
    assert not rec.of_type("proxmoxve:hardware/mapping/pci:Pci")  # the other module owns the mapping
    assert not [r for r in rec.resources if r.type.startswith("kubernetes:")]
    verify = rec.named("gpu-vm-bootstrap-verify")
    assert rec.depends_on(verify, vm) and rec.depends_on(verify, rec.named("gpu-vm-large-bar"))  # A100: large BAR


def test_cluster_with_app_waits_for_the_operator() -> None:
    rec = planned("cluster-with-app")
    cluster = rec.one("proxmox-gpu-cluster:cluster:GpuCluster")
    assert cluster.name == "gpu" and all(c.name.startswith("gpu-") for c in rec.children(cluster))
    release = rec.named("inference-server")
    operator = rec.named("gpu-gpu-operator-release")
    assert rec.depends_on(release, operator) and not rec.depends_on(operator, release)
    assert release.provider == rec.named("gpu-kubernetes").urn  # the cluster's provider, not a default one
    assert set(rec.outputs["capacity"]) == {"gpu-a10-1", "gpu-a100-1"}


def test_the_plan_cli_plans_any_example(capsys: pytest.CaptureFixture[str]) -> None:
    for example in ("bare-metal-gpu-stack", "single-gpu-vm", "cluster-with-app", "two-teams"):
        assert main(["dev", "--main", str(EXAMPLES / example), "--json", "--placeholder-secrets"]) == 0
        assert yaml.safe_load(capsys.readouterr().out)["project"] == find_program(EXAMPLES / example).project


def test_bad_nodes_in_the_example_config_are_reported_together(tmp_path: Path) -> None:
    source = EXAMPLES / "bare-metal-gpu-stack"
    for name in ("Pulumi.yaml", "__main__.py"):
        (tmp_path / name).write_text((source / name).read_text())
    document = yaml.safe_load((source / "Pulumi.dev.yaml").read_text())
    nodes = document["config"]["bare-metal-gpu-stack:gpuNodes"]
    nodes[0]["mig"] = "all-1g.5gb"
    nodes[1]["gpus"] = {"A10": 2, "T5": 1}
    program = find_program(tmp_path)
    with pytest.raises(InvalidStackConfig) as err:
        plan("dev", document, program.main, project=program.project, placeholder_secrets=True)
    assert isinstance(err.value, pulumi.RunError)  # printed without a traceback
    assert any(line.startswith("bare-metal-gpu-stack:gpuNodes[0].mig: only applies") for line in err.value.lines)
    assert any(line.startswith("bare-metal-gpu-stack:gpuNodes[1].gpus.T5: ") for line in err.value.lines)
