"""The offline plan CLI: text, JSON, --out, exit codes; run in-process and as `python -m proxmox_gpu_cluster.plan`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxmox_gpu_cluster.stacks.plan import main, plan
from tests.support import ROOT, base_spec, make_vm_worker


def write_stack(tmp_path: Path, spec: dict[str, object], **extra: object) -> Path:
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(yaml.safe_dump({"config": {"proxmox-gpu-cluster:cluster": spec, **extra}}))
    return path


def test_dev_stack_text_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--placeholder-secrets", "dev"]) == 0
    out = capsys.readouterr().out
    assert "Offline plan of stack 'dev'" in out
    assert "pulumi:providers:proxmoxve" in out and "pulumi:providers:kubernetes" in out
    # the capacity table examples of the dev stack
    assert "gpu-a10-1" in out and "nvidia.com/gpu: 4" in out
    assert "gpu-a100-1" in out and "nvidia.com/mig-1g.5gb: 7" in out


def test_kubevirt_text_plan_marks_the_nested_path_experimental(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = make_vm_worker(base_spec(), 2, "vm-vgpu", "A10-12Q")
    raw["kubevirt"]["nodes"] = [{"name": "bm-1", "workload": "vm-passthrough", "gpus": {"L4": 2}}]
    assert main(["--placeholder-secrets", "t", "--config", str(write_stack(tmp_path, raw))]) == 0
    out = capsys.readouterr().out
    assert "kubernetes:kubevirt.io/v1:KubeVirtPatch" in out
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.startswith("  ts-1") or "bm-1" in line}
    assert "vm-vgpu" in rows["ts-1"] and "nvidia.com/NVIDIA_A10-12Q: 4" in rows["ts-1"]
    assert "(bare metal)" in rows["bm-1"] and "nvidia.com/AD104GL_L4: 2" in rows["bm-1"]
    assert "  experimental: KubeVirt workers ts-1 are Proxmox VMs" in out
    assert "CANARY" not in out and "vgpuRegistryPassword" not in out


def test_kubevirt_example_vms(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--placeholder-secrets", "kubevirt", "--kubevirt-vms"]) == 0
    vms = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [vm["kind"] for vm in vms] == ["VirtualMachine"]
    assert main(["--placeholder-secrets", "dev", "--kubevirt-vms"]) == 0
    assert capsys.readouterr().out == ""  # no KubeVirt in dev


def test_json_plan_redacts_secrets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_stack(tmp_path, base_spec(), **{"proxmox-gpu-cluster:kubeconfig": {"secure": "v1:abc"}})
    assert main(["--placeholder-secrets", "t", "--config", str(path), "--json"]) == 0
    raw = capsys.readouterr().out
    plan = json.loads(raw)
    assert "plan-placeholder" not in raw  # placeholders are secrets, so they never print
    by_type = {r["type"]: r for r in plan["resources"]}
    assert by_type["pulumi:providers:kubernetes"]["inputs"]["kubeconfig"] == "[secret]"
    assert by_type["pulumi:providers:proxmoxve"]["inputs"]["apiToken"] == "[secret]"
    stack = by_type["pulumi:pulumi:Stack"]
    urns = {r["urn"] for r in plan["resources"]}
    assert all(r["parent"] in urns for r in plan["resources"] if r is not stack)
    cluster = by_type["proxmox-gpu-cluster:cluster:GpuCluster"]
    assert cluster["parent"] == stack["urn"]
    assert by_type["pulumi:providers:kubernetes"]["parent"] == cluster["urn"]
    release = by_type["kubernetes:helm.sh/v3:Release"]
    assert release["parent"] == by_type["proxmox-gpu-cluster:gpu_operator:GpuOperator"]["urn"]
    assert release["dependencies"], "the release waits for the node labels"
    assert {"type", "name", "parent", "dependencies", "inputs", "provider"} <= set(plan["resources"][1])
    rows = {row["worker"]: row for row in plan["capacity"]}
    assert rows["mig-2"]["resources"] == {
        "nvidia.com/mig-1g.5gb": 2,
        "nvidia.com/mig-2g.10gb": 1,
        "nvidia.com/mig-3g.20gb": 1,
    }
    assert plan["outputs"]["capacity"]["ts-1"]["resources"] == {"nvidia.com/gpu": 8}


def test_plan_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--placeholder-secrets", "dev", "--json"])
    first = capsys.readouterr().out
    main(["--placeholder-secrets", "dev", "--json"])
    assert capsys.readouterr().out == first


def test_json_plan_is_byte_identical_across_processes() -> None:
    def plan_json() -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "proxmox_gpu_cluster.plan", "--placeholder-secrets", "dev", "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        return proc.stdout

    outputs = {plan_json() for _ in range(3)}
    assert len(outputs) == 1


def test_out_writes_one_yaml_per_resource(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan"
    assert main(["--placeholder-secrets", "dev", "--out", str(out)]) == 0
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.yaml"))
    assert "pulumi_providers_kubernetes/cluster-kubernetes.yaml" in files
    assert yaml.safe_load((out / "pulumi_providers_kubernetes/cluster-kubernetes.yaml").read_text()) == {
        "kubeconfig": "[secret]"
    }
    assert f"wrote {len(files)} input files" in capsys.readouterr().err


def test_invalid_spec_exits_2_with_one_line_per_problem(tmp_path: Path) -> None:
    spec = base_spec()
    spec["workers"][1]["vmid"] = 2001
    spec["workers"][2]["timeSlicing"] = {"replicas": 1}
    spec["proxmox"]["nodes"][0]["gpus"][0]["model"] = "A100"
    path = write_stack(tmp_path, spec)
    proc = subprocess.run(
        [sys.executable, "-m", "proxmox_gpu_cluster.plan", "--placeholder-secrets", "t", "--config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr
    assert lines == [
        "proxmox-gpu-cluster:cluster.proxmox.nodes[0].gpus[0].model: unknown GPU model 'A100'; known: "
        "A100-PCIE-40GB, A100-PCIE-80GB, A100-SXM4-40GB, A100-SXM4-80GB, A30, A10, H100-PCIE, H100-SXM5-80GB, "
        "H200, L4, L40S, T4",
        "proxmox-gpu-cluster:cluster.workers[2].timeSlicing.replicas: Input should be greater than or equal to 2",
    ]


def test_unreadable_stack_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--placeholder-secrets", "nope", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_module_entry_point_runs_the_dev_plan() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "proxmox_gpu_cluster.plan", "--placeholder-secrets", "dev"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Capacity" in proc.stdout


def test_kubevirt_docs_example_is_what_the_plan_prints_and_the_patch_permits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    docs = (ROOT / "docs" / "kubevirt.md").read_text()
    block = re.search(
        r"<!-- example-vms: python -m proxmox_gpu_cluster.plan kubevirt --kubevirt-vms -->\n```yaml\n(.*?)```",
        docs,
        re.S,
    )
    assert block, "docs/kubevirt.md has the generated example block"
    assert main(["--placeholder-secrets", "kubevirt", "--kubevirt-vms"]) == 0
    assert block[1] == capsys.readouterr().out, (
        "regenerate it: python -m proxmox_gpu_cluster.plan kubevirt --kubevirt-vms"
    )
    # Every device the example requests is one the stack's KubeVirt patch permits.
    recording, _ = plan(
        "kubevirt",
        yaml.safe_load((ROOT / "Pulumi.kubevirt.yaml").read_text()),
        ROOT / "__main__.py",
        placeholder_secrets=True,
    )
    devices = recording.one("kubernetes:kubevirt.io/v1:KubeVirtPatch").plain_inputs["spec"]["configuration"]
    permitted = {d["resourceName"] for kind in devices["permittedHostDevices"].values() for d in kind}
    requested = {
        gpu["deviceName"]
        for vm in yaml.safe_load_all(block[1])
        for gpu in vm["spec"]["template"]["spec"]["domain"]["devices"]["gpus"]
    }
    assert requested and requested <= permitted


def pvesh_device(address: str, vendor: str, device: str, pci_class: str, group: int, name: str) -> dict[str, Any]:
    """One device as `pvesh get /nodes/<node>/hardware/pci --output-format json` prints it."""
    return {
        "id": address, "vendor": f"0x{vendor}", "device": f"0x{device}", "class": pci_class, "iommugroup": group,
        "subsystem_vendor": "0x10de", "subsystem_device": "0x1482", "device_name": name, "vendor_name": "NVIDIA",
        "subsystem_vendor_name": "NVIDIA", "subsystem_device_name": "", "mdev": False,
    }  # fmt: skip


def test_pci_file_from_pvesh_feeds_the_preflight(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """dev's pve1 from a real-shaped device list: the mappings take its IOMMU groups; a NIC in the A10's group
    is refused with the config path, exit 2."""
    devices = [
        pvesh_device("0000:40:01.1", "1022", "1483", "0x060400", 41, "PCIe root port"),
        pvesh_device("0000:41:00.0", "10de", "2236", "0x030200", 41, "GA102GL [A10]"),
        pvesh_device("0000:81:00.0", "10de", "20f1", "0x030200", 77, "GA100 [A100 PCIe 40GB]"),
    ]
    good = tmp_path / "pve1.json"
    good.write_text(json.dumps(devices))
    assert main(["--placeholder-secrets", "dev", "--json", "--pci", f"pve1={good}"]) == 0
    plan_json = json.loads(capsys.readouterr().out)
    groups = {
        r["name"]: r["inputs"]["maps"][0]["iommuGroup"]
        for r in plan_json["resources"]
        if r["type"] == "proxmoxve:hardware/mapping/pci:Pci"
    }
    assert groups == {"cluster-pve1-pci-0000:41:00": 41, "cluster-pve1-pci-0000:81:00": 77}
    shared = tmp_path / "shared.json"
    shared.write_text(json.dumps([*devices, pvesh_device("0000:42:00.0", "8086", "1533", "0x020000", 41, "I210")]))
    assert main(["--placeholder-secrets", "dev", "--pci", f"pve1={shared}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cluster.proxmox.nodes[0].gpus[0].pciPath: IOMMU group 41 of 0000:41:00 also holds")
    assert "0000:42:00.0" in err


@pytest.mark.parametrize(
    ("arg", "message"),
    [("pve9={file}", "--pci: the program preflights no Proxmox node pve9 (it preflights: pve1)"), ("pve1={missing}", "--pci pve1="),
     ("pve1={bad}", "expected a JSON list of PCI devices")],
)  # fmt: skip
def test_pci_file_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], arg: str, message: str) -> None:
    (tmp_path / "ok.json").write_text("[]")
    (tmp_path / "bad.json").write_text('{"devices": []}')
    paths = {"file": tmp_path / "ok.json", "missing": tmp_path / "nope.json", "bad": tmp_path / "bad.json"}
    assert main(["--placeholder-secrets", "dev", "--pci", arg.format(**paths)]) == 2
    assert message in capsys.readouterr().err
