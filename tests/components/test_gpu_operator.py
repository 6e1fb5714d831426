"""GpuOperator and GpuNodeLabels under mocks: names, ordering, values from ConfigMap names, content addressing."""

from __future__ import annotations

import pytest

from tests.support import base_spec, make_vm_worker, plan_stack, without_operator

RELEASE = "kubernetes:helm.sh/v3:Release"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
NODE_PATCH = "kubernetes:core/v1:NodePatch"


def test_children_are_named_and_parented() -> None:
    rec = plan_stack(base_spec())
    operator = rec.one("proxmox-gpu-cluster:gpu_operator:GpuOperator")
    children = {r.name: r.type for r in rec.children(operator)}
    assert children == {
        "cluster-gpu-operator-namespace": "kubernetes:core/v1:Namespace",
        "cluster-gpu-operator-device-plugin-config": CONFIG_MAP,
        "cluster-gpu-operator-mig-config": CONFIG_MAP,
        "cluster-gpu-operator-dcgm-metrics": CONFIG_MAP,
        "cluster-gpu-operator-release": RELEASE,
    }
    labels = rec.one("proxmox-gpu-cluster:gpu_node:GpuNodeLabels")
    assert sorted(r.name for r in rec.children(labels)) == [
        "cluster-gpu-nodes-mig-1",
        "cluster-gpu-nodes-mig-2",
        "cluster-gpu-nodes-ts-1",
    ]
    k8s = rec.one("pulumi:providers:kubernetes")
    assert all(r.provider == k8s.urn for r in rec.resources if r.type.startswith("kubernetes:"))


def test_release_waits_for_labels_and_configmaps() -> None:
    rec = plan_stack(base_spec())
    release = rec.one(RELEASE)
    for patch in rec.of_type(NODE_PATCH):
        assert rec.depends_on(release, patch)
    for cm in rec.of_type(CONFIG_MAP):
        assert rec.depends_on(release, cm)
    assert not rec.depends_on(rec.of_type(NODE_PATCH)[0], release)


def test_release_inputs_and_values() -> None:
    rec = plan_stack(base_spec())
    release = rec.one(RELEASE).plain_inputs
    assert release["chart"] == "gpu-operator" and release["version"] == "v26.7.0"
    assert release["repositoryOpts"] == {"repo": "https://helm.ngc.nvidia.com/nvidia"}
    assert release["atomic"] is True and release["namespace"] == "gpu-operator"
    dp = rec.named("cluster-gpu-operator-device-plugin-config").plain_inputs
    mig = rec.named("cluster-gpu-operator-mig-config").plain_inputs
    values = release["values"]
    assert values["devicePlugin"]["config"] == {"name": dp["metadata"]["name"], "default": "default", "create": False}
    assert values["migManager"]["config"]["name"] == mig["metadata"]["name"]
    assert values["driver"] == {"enabled": False} and values["toolkit"] == {"enabled": False}


def test_namespace_is_privileged() -> None:
    ns = plan_stack(base_spec()).named("cluster-gpu-operator-namespace").plain_inputs
    assert ns["metadata"]["labels"] == {"pod-security.kubernetes.io/enforce": "privileged"}


def test_node_patches() -> None:
    raw = base_spec()
    raw["workers"][0]["taint"] = True
    rec = plan_stack(raw)
    mig1 = rec.named("cluster-gpu-nodes-mig-1").plain_inputs
    assert mig1["metadata"]["name"] == "mig-1"
    assert mig1["metadata"]["annotations"] == {"pulumi.com/patchForce": "true"}
    assert mig1["metadata"]["labels"] == {
        "nvidia.com/device-plugin.config": "default",
        "nvidia.com/gpu.workload.config": "container",
        "nvidia.com/mig.config": "all-1g.5gb",
        "proxmox-gpu-cluster.io/accelerator": "A100-PCIE-40GB",
    }
    assert mig1["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    ts1 = rec.named("cluster-gpu-nodes-ts-1").plain_inputs
    assert ts1["metadata"]["labels"]["nvidia.com/device-plugin.config"].startswith("time-slicing-4-")
    assert "nvidia.com/mig.config" not in ts1["metadata"]["labels"]
    assert "spec" not in ts1 or not ts1["spec"].get("taints")


@pytest.mark.parametrize("workload", ["vm-passthrough", "vm-vgpu"])
def test_kubevirt_node_labels(workload: str) -> None:
    raw = make_vm_worker(base_spec(), 2, workload)
    labels = plan_stack(raw).named("cluster-gpu-nodes-ts-1").plain_inputs["metadata"]["labels"]
    expected = {"nvidia.com/gpu.workload.config": workload, "proxmox-gpu-cluster.io/accelerator": "A10"}
    if workload == "vm-vgpu":
        expected["nvidia.com/vgpu.config"] = "A10-24Q"
    assert labels == expected  # no device-plugin or MIG config: the sandbox operands serve these nodes


def test_changing_replicas_changes_only_configmap_name_and_values() -> None:
    before = plan_stack(base_spec())
    raw = base_spec()
    raw["workers"][2]["timeSlicing"]["replicas"] = 8
    after = plan_stack(raw)
    changed = {
        r.name
        for r in after.resources
        if r.type != "pulumi:pulumi:Stack" and r.plain_inputs != before.named(r.name).plain_inputs
    }
    # the ConfigMap (new content-addressed name), the release values that carry it, the one node label, and that
    # node's capacity gate (it now expects nvidia.com/gpu=16), which runs again
    assert changed == {
        "cluster-gpu-operator-device-plugin-config",
        "cluster-gpu-operator-release",
        "cluster-gpu-nodes-ts-1",
        "cluster-ts-1-capacity-check",
    }
    assert "--expect nvidia.com/gpu=16" in after.named("cluster-ts-1-capacity-check").plain_inputs["create"]
    old_name = before.named("cluster-gpu-operator-device-plugin-config").plain_inputs["metadata"]["name"]
    new_name = after.named("cluster-gpu-operator-device-plugin-config").plain_inputs["metadata"]["name"]
    assert old_name != new_name
    assert after.one(RELEASE).plain_inputs["values"]["devicePlugin"]["config"]["name"] == new_name


def test_operator_can_be_disabled() -> None:
    rec = plan_stack(without_operator(base_spec()))
    assert rec.of_type(RELEASE) == [] and rec.of_type(NODE_PATCH) == []


def test_without_the_operator_a_taint_is_still_applied_and_nothing_of_the_operator() -> None:
    raw = without_operator(base_spec())
    raw["workers"][2]["taint"] = True
    rec = plan_stack(raw)
    assert rec.of_type(RELEASE) == [] and sorted(p.name for p in rec.of_type(NODE_PATCH)) == [
        "cluster-gpu-nodes-mig-1", "cluster-gpu-nodes-mig-2", "cluster-gpu-nodes-ts-1",
    ]  # fmt: skip
    patch = rec.named("cluster-gpu-nodes-ts-1").plain_inputs
    assert patch["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    assert patch["metadata"]["labels"] == {"proxmox-gpu-cluster.io/accelerator": "A10"}
    assert not any(
        k.startswith("nvidia.com/") for k in rec.named("cluster-gpu-nodes-mig-1").plain_inputs["metadata"]["labels"]
    )
