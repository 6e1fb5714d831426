"""The ServiceMonitor and PrometheusRule as the API server sees them: validated against the Prometheus Operator's
own CRDs (v0.93.0, in ../shared/reference), with unknown fields as errors (the API server would prune them
silently); the dashboard ConfigMap and PriorityClasses with kubernetes-validate in strict mode."""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from proxmox_gpu_cluster.render.dashboard import DATA_KEY
from tests.support import base_spec, plan_stack, reference_file

CRDS = {
    "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}


def strict(schema: Any) -> Any:
    """An openAPIV3Schema as JSON Schema in which an object with listed properties accepts no other keys."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


@functools.cache
def validator(kind: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(reference_file("prometheus-operator", "v0.93.0", CRDS[kind]).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(strict(version["schema"]["openAPIV3Schema"]))


def errors(obj: dict[str, Any]) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(obj["kind"]).iter_errors(obj)]


def monitored() -> dict[str, Any]:
    raw = base_spec()
    raw["gpuOperator"]["monitoring"] = {
        "prometheus": True,
        "namespace": "monitoring",
        "labels": {"release": "kube-prometheus-stack"},
        "dashboard": {"enabled": True, "folder": "GPU"},
    }
    raw["priorityClasses"] = [
        {"name": "gpu-production", "value": 100000, "description": "production inference"},
        {"name": "gpu-batch", "value": 1000, "preemptionPolicy": "Never", "globalDefault": True},
    ]
    raw["quotas"].append({"namespace": "team-a", "priorityClass": "gpu-batch", "resources": {"nvidia.com/gpu": 1}})
    return raw


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_custom_resources_validate_against_the_prometheus_operator_crds(kind: str) -> None:
    rec = plan_stack(monitored())
    obj = rec.one(f"kubernetes:monitoring.coreos.com/v1:{kind}").plain_inputs
    assert errors(obj) == []
    assert obj["metadata"]["namespace"] == "monitoring"
    assert obj["metadata"]["labels"] == {"release": "kube-prometheus-stack"}


def test_an_unknown_or_mistyped_field_would_be_caught() -> None:
    rec = plan_stack(monitored())
    monitor = copy.deepcopy(rec.one("kubernetes:monitoring.coreos.com/v1:ServiceMonitor").plain_inputs)
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    rule = copy.deepcopy(rec.one("kubernetes:monitoring.coreos.com/v1:PrometheusRule").plain_inputs)
    rule["spec"]["groups"][0]["rules"][0]["for"] = 5
    assert any("intervall" in e for e in errors(monitor))
    assert any(e.startswith("spec.groups.0.rules.0.for") for e in errors(rule))


@pytest.mark.parametrize("version", ["1.33", "1.34"])
def test_dashboard_and_priority_classes_pass_kubernetes_validate_strict(version: str) -> None:
    rec = plan_stack(monitored())
    board = rec.named("cluster-gpu-monitoring-dashboard").plain_inputs
    classes = rec.of_type("kubernetes:scheduling.k8s.io/v1:PriorityClass")
    quotas = rec.of_type("kubernetes:core/v1:ResourceQuota")
    for obj in [board, *(c.plain_inputs for c in classes), *(q.plain_inputs for q in quotas)]:
        kubernetes_validate.validate(obj, version, strict=True)
    assert board["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert board["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    assert board["metadata"]["namespace"] == "monitoring"
    assert json.loads(board["data"][DATA_KEY])["uid"]
    assert {c.plain_inputs["metadata"]["name"]: c.plain_inputs["value"] for c in classes} == {
        "gpu-production": 100000,
        "gpu-batch": 1000,
    }
    scoped = rec.named("cluster-gpu-quotas-team-a.gpu-batch").plain_inputs
    assert scoped["metadata"]["name"] == "gpu-quota-gpu-batch"
    assert scoped["spec"]["scopeSelector"] == {
        "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["gpu-batch"]}]
    }
    assert rec.depends_on(rec.named("cluster-gpu-quotas-team-a.gpu-batch"), classes[0])
