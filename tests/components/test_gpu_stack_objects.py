"""Every Kubernetes object the GPU stack creates, checked as Kubernetes would: built-in kinds with
kubernetes-validate in strict mode (1.33 and 1.34), custom resources for apiVersion, kind and required fields."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from tests.support import base_spec, make_vm_worker, plan_stack

CUSTOM = {"kubernetes:monitoring.coreos.com/v1:ServiceMonitor", "kubernetes:monitoring.coreos.com/v1:PrometheusRule"}
NOT_OBJECTS = {"kubernetes:helm.sh/v3:Release"}  # a Helm release, not an API object


def everything() -> dict[str, Any]:
    """The base spec with every optional GPU-stack feature on: monitoring, smoke test, a DRA worker."""
    raw = base_spec()
    raw["gpuOperator"].update(monitoring={"prometheus": True, "labels": {"release": "kube-prometheus-stack"}})
    raw["gpuOperator"]["smokeTest"] = {"enabled": True}
    raw["workers"][1]["dra"] = True
    raw["workers"][0]["taint"] = True
    return raw


def as_object(type_token: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """A patch resource's inputs as the object it patches (NodePatch -> Node)."""
    if type_token.endswith("Patch"):
        return {**inputs, "kind": inputs["kind"].removesuffix("Patch")}
    return inputs


@pytest.mark.parametrize("version", ["1.33", "1.34"])
def test_builtin_objects_pass_kubernetes_validate_strict(version: str) -> None:
    rec = plan_stack(everything())
    checked: dict[str, int] = {}
    for r in rec.resources:
        if not r.type.startswith("kubernetes:") or r.type in CUSTOM | NOT_OBJECTS:
            continue
        kubernetes_validate.validate(as_object(r.type, r.plain_inputs), version, strict=True)
        checked[r.type] = checked.get(r.type, 0) + 1
    assert checked == {
        "kubernetes:core/v1:Namespace": 3,  # operator, DRA driver, rollout slots
        "kubernetes:rbac.authorization.k8s.io/v1:Role": 1,  # the node steps' access (NodeStepAccess)
        "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding": 1,
        "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole": 1,
        "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding": 1,
        "kubernetes:core/v1:ConfigMap": 3,  # device plugin, mig-parted, DCGM metrics
        "kubernetes:core/v1:NodePatch": 3,
        "kubernetes:batch/v1:Job": 1,
        "kubernetes:core/v1:ResourceQuota": 1,
    }


@pytest.mark.parametrize("version", ["1.33", "1.34"])
def test_strict_validation_would_catch_a_typo(version: str) -> None:
    job = plan_stack(everything()).one("kubernetes:batch/v1:Job").plain_inputs
    job["spec"]["template"]["spec"]["runtimeClass"] = "nvidia"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, version, strict=True)


def test_custom_resources_have_api_version_kind_and_required_fields() -> None:
    rec = plan_stack(everything())
    monitor = rec.one("kubernetes:monitoring.coreos.com/v1:ServiceMonitor").plain_inputs
    rule = rec.one("kubernetes:monitoring.coreos.com/v1:PrometheusRule").plain_inputs
    for obj, kind in ((monitor, "ServiceMonitor"), (rule, "PrometheusRule")):
        assert obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["kind"] == kind
        assert obj["metadata"]["namespace"] == "gpu-operator"
        assert obj["metadata"]["labels"] == {"release": "kube-prometheus-stack"}
    # ServiceMonitor: selector is required; each endpoint names a port
    assert monitor["spec"]["selector"] == {"matchLabels": {"app": "nvidia-dcgm-exporter"}}
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["gpu-metrics"]
    # PrometheusRule: groups need a name and rules; each rule an expr and an alert (or record)
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for r in group["rules"]:
            assert r["expr"] and bool(r.get("alert")) != bool(r.get("record"))  # exactly one of the two


@pytest.mark.parametrize("version", ["1.33", "1.34"])
def test_kubevirt_objects(version: str) -> None:
    """The vGPU pull secret and the KubeVirt nodes' patches pass strict validation; the KubeVirt CR patch names
    the CR and carries only the configuration it owns."""
    raw = make_vm_worker(base_spec(), 2, "vm-vgpu")
    raw["kubevirt"]["nodes"] = [{"name": "bm-1", "workload": "vm-passthrough", "gpus": {"L4": 1}, "taint": True}]
    rec = plan_stack(raw)
    checked = []
    for r in rec.of_type("kubernetes:core/v1:Secret") + rec.of_type("kubernetes:core/v1:NodePatch"):
        kubernetes_validate.validate(as_object(r.type, r.plain_inputs), version, strict=True)
        checked.append(r.name)
    assert {"cluster-gpu-operator-vgpu-pull-secret", "cluster-gpu-nodes-ts-1", "cluster-gpu-nodes-bm-1"} <= set(checked)
    patch = rec.one("kubernetes:kubevirt.io/v1:KubeVirtPatch").plain_inputs
    assert (patch["apiVersion"], patch["kind"]) == ("kubevirt.io/v1", "KubeVirt")
    assert set(patch["spec"]) == {"configuration"}
    assert set(patch["spec"]["configuration"]) == {"permittedHostDevices", "developerConfiguration"}
