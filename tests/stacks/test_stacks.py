"""The shipped stacks: every Pulumi.<stack>.yaml validates and plans offline; what dev and prod contain."""

from __future__ import annotations

import pytest
import yaml

from proxmox_gpu_cluster.core.capacity import capacity_table
from proxmox_gpu_cluster.core.spec import ClusterSpec, load_spec
from proxmox_gpu_cluster.stacks.config import raw_spec_from_stack_file
from proxmox_gpu_cluster.stacks.plan import plan
from proxmox_gpu_cluster.testing import Recording
from tests.support import ROOT

STACKS = sorted(p.name.split(".")[1] for p in ROOT.glob("Pulumi.*.yaml"))


def stack(name: str) -> tuple[ClusterSpec, Recording]:
    document = yaml.safe_load((ROOT / f"Pulumi.{name}.yaml").read_text())
    recording, _ = plan(name, document, ROOT / "__main__.py", placeholder_secrets=True)
    return load_spec(raw_spec_from_stack_file(document)), recording


def names(rec: Recording, type_: str) -> list[str]:
    return sorted(r.name for r in rec.of_type(type_))


def test_there_are_dev_prod_and_kubevirt_stacks() -> None:
    assert {"dev", "prod", "kubevirt"} <= set(STACKS)


@pytest.mark.parametrize("name", STACKS)
def test_stack_validates_and_plans_without_warnings(name: str) -> None:
    spec, rec = stack(name)
    assert rec.stack.name == f"proxmox-gpu-cluster-{name}"
    # The one expected warning: KubeVirt workers that are Proxmox VMs are experimental.
    warnings = [m for level, m in rec.logs if level in ("warning", "error") and not m.startswith("experimental: ")]
    assert warnings == []
    assert rec.outputs["capacity"].keys() == {w.name for w in spec.workers} | {n.name for n in spec.kubevirt.nodes}


def test_dev_gets_the_operator_with_time_slicing() -> None:
    spec, rec = stack("dev")
    assert names(rec, "kubernetes:helm.sh/v3:Release") == ["cluster-gpu-operator-release"]
    assert any(w.sharing == "time-slicing" for w in spec.workers)
    dp = rec.named("cluster-gpu-operator-device-plugin-config").plain_inputs["data"]
    assert any("timeSlicing" in v and "replicas: 4" in v for v in dp.values())


def test_prod() -> None:
    spec, rec = stack("prod")
    assert len(spec.proxmox.nodes) == 2
    assert all(w.protect for w in spec.workers)
    vms = rec.of_type("proxmoxve:index/vmLegacy:VmLegacy")
    assert len(vms) == 4 and all(vm.protect for vm in vms)
    rows = {row.worker: row for row in capacity_table(spec)}
    a100 = [r for r in rows.values() if r.gpus == {"A100-PCIE-40GB": 1}]
    assert {r.sharing for r in a100} == {"mig"} and len(a100) == 2
    assert {"nvidia.com/mig-1g.5gb": 7} in [r.resources for r in a100]  # all-1g.5gb
    assert {"nvidia.com/mig-1g.5gb": 2, "nvidia.com/mig-2g.10gb": 1, "nvidia.com/mig-3g.20gb": 1} in [
        r.resources for r in a100
    ]  # custom geometry
    a10 = [r for r in rows.values() if "A10" in r.gpus]
    assert a10 and {r.sharing for r in a10} == {"time-slicing"}
    assert spec.gpu_operator.mig_strategy == "mixed"
    assert names(rec, "kubernetes:core/v1:ResourceQuota") == [
        "cluster-gpu-quotas-ml-inference",
        "cluster-gpu-quotas-ml-research",
        "cluster-gpu-quotas-ml-research.gpu-production",
    ]
    assert names(rec, "kubernetes:scheduling.k8s.io/v1:PriorityClass") == [
        "cluster-gpu-priority-classes-gpu-batch",
        "cluster-gpu-priority-classes-gpu-production",
    ]
    assert rec.named("cluster-gpu-monitoring-dashboard").plain_inputs["metadata"]["labels"] == {
        "grafana_dashboard": "1"
    }
    assert names(rec, "kubernetes:monitoring.coreos.com/v1:ServiceMonitor") == [
        "cluster-gpu-monitoring-service-monitor"
    ]
    assert names(rec, "kubernetes:monitoring.coreos.com/v1:PrometheusRule") == ["cluster-gpu-monitoring-alerts"]
    assert names(rec, "kubernetes:batch/v1:Job") == ["cluster-gpu-smoke-test-job"]
    assert rec.named("cluster-gpu-operator-mig-config").plain_inputs["data"]  # the custom geometry's ConfigMap


def test_kubevirt() -> None:
    spec, rec = stack("kubevirt")
    assert spec.kubevirt.enabled and {w.workload for w in spec.workers} == {"vm-passthrough"}
    assert {g.model for n in spec.proxmox.nodes for g in n.gpus} == {"A10"}
    for vm in rec.of_type("proxmoxve:index/vmLegacy:VmLegacy"):
        assert vm.plain_inputs["machine"] == "q35,viommu=intel" and vm.plain_inputs["cpu"]["type"] == "host"
    patch = rec.one("kubernetes:kubevirt.io/v1:KubeVirtPatch").plain_inputs
    assert patch["spec"]["configuration"]["permittedHostDevices"] == {
        "pciHostDevices": [
            {
                "pciVendorSelector": "10DE:2236",
                "resourceName": "nvidia.com/GA102GL_A10",
                "externalResourceProvider": True,
            }
        ]
    }
    assert patch["spec"]["configuration"]["developerConfiguration"]["featureGates"] == ["HostDevices"]
    values = rec.one("kubernetes:helm.sh/v3:Release").plain_inputs["values"]
    assert values["sandboxWorkloads"]["enabled"] and values["vfioManager"]["enabled"]
    for worker in spec.workers:
        driver = rec.named(f"cluster-{worker.name}-bootstrap-driver").plain_inputs["create"]
        assert "--mode vfio" in driver and "--kernel-arg intel_iommu=on" in driver and "--vfio-id 10de:2236" in driver
        labels = rec.named(f"cluster-gpu-nodes-{worker.name}").plain_inputs["metadata"]["labels"]
        assert labels["nvidia.com/gpu.workload.config"] == "vm-passthrough"
    assert {row.worker: row.resources for row in capacity_table(spec)} == {
        w.name: {"nvidia.com/GA102GL_A10": 1} for w in spec.workers
    }
    warnings = [m for level, m in rec.logs if level == "warning"]
    assert warnings == [
        "experimental: KubeVirt workers kv-a10-1, kv-a10-2 are Proxmox VMs (nested virtualization, vIOMMU); "
        "NVIDIA supports vm-passthrough and vm-vgpu nodes on bare metal only (kubevirt.nodes)"
    ]
