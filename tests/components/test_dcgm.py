"""DCGM monitoring: metrics CSV (pure), content-addressed ConfigMap wired into the release, ServiceMonitor and
PrometheusRule under mocks."""

from __future__ import annotations

import csv
import io
from typing import Any

from proxmox_gpu_cluster.core.dcgm_fields import ALERT_FIELDS, DASHBOARD_FIELDS, DEFAULT_FIELDS, KNOWN_FIELDS
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.render.dcgm import (
    METRICS_KEY,
    metrics_config_data,
    metrics_config_name,
    metrics_csv,
    service_monitor_spec,
)
from tests.support import base_spec, plan_stack

MONITOR = "kubernetes:monitoring.coreos.com/v1:ServiceMonitor"
RULE = "kubernetes:monitoring.coreos.com/v1:PrometheusRule"
RELEASE = "kubernetes:helm.sh/v3:Release"


def monitored() -> dict[str, Any]:
    raw = base_spec()
    raw["gpuOperator"]["monitoring"] = {"prometheus": True}
    return raw


def rows(text: str) -> list[list[str]]:
    """Parse like dcgm-exporter: comma-separated, leading spaces trimmed, # lines are comments."""
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)]


def test_default_metrics_cover_what_the_issue_lists() -> None:
    fields = [r[0] for r in rows(metrics_csv(load_spec(base_spec()).gpu_operator.monitoring))]
    assert fields == list(DEFAULT_FIELDS)
    wanted = {"GPU_UTIL", "MEM_COPY_UTIL", "FB_USED", "FB_FREE", "GPU_TEMP", "POWER_USAGE", "XID_ERRORS",
              "ECC_SBE_VOL_TOTAL", "ECC_DBE_VOL_TOTAL", "PCIE_REPLAY_COUNTER", "SM_CLOCK", "MEM_CLOCK",
              "ROW_REMAP_FAILURE"}  # fmt: skip
    assert {f"DCGM_FI_DEV_{w}" for w in wanted} | {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"} == set(fields)
    assert set(ALERT_FIELDS) <= set(fields) and set(DASHBOARD_FIELDS) <= set(fields)
    # every panel of NVIDIA's DCGM exporter dashboard (Grafana 12239) has its metric
    nvidia_dashboard = {"GPU_TEMP", "POWER_USAGE", "SM_CLOCK", "GPU_UTIL", "FB_USED"}
    assert {f"DCGM_FI_DEV_{m}" for m in nvidia_dashboard} | {"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"} <= set(fields)


def test_every_line_has_exactly_three_fields_and_a_known_type() -> None:
    raw = base_spec()
    raw["gpuOperator"]["monitoring"] = {"metrics": [*KNOWN_FIELDS, {"field": "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                                                                   "type": "counter", "help": "NVLink bandwidth"}]}  # fmt: skip
    parsed = rows(metrics_csv(load_spec(raw).gpu_operator.monitoring))
    assert len(parsed) == len(KNOWN_FIELDS) + 1
    for row in parsed:
        assert len(row) == 3 and row[1] in {"gauge", "counter", "label"}
    assert parsed[-1] == ["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "NVLink bandwidth"]


def test_configmap_name_is_content_addressed() -> None:
    spec = load_spec(base_spec())
    data = metrics_config_data(spec.gpu_operator.monitoring)
    assert list(data) == [METRICS_KEY]
    raw = base_spec()
    raw["gpuOperator"]["monitoring"] = {"metrics": ["DCGM_FI_DEV_GPU_UTIL"]}
    other = metrics_config_data(load_spec(raw).gpu_operator.monitoring)
    assert metrics_config_name(data) != metrics_config_name(other)
    assert metrics_config_name(data) == metrics_config_name(
        metrics_config_data(load_spec(base_spec()).gpu_operator.monitoring)
    )


def test_metric_change_changes_only_the_configmap_and_release_values() -> None:
    before = plan_stack(base_spec())
    raw = base_spec()
    raw["gpuOperator"]["monitoring"] = {"metrics": [*DEFAULT_FIELDS, "DCGM_FI_PROF_GR_ENGINE_ACTIVE"]}
    after = plan_stack(raw)
    changed = {
        r.name
        for r in after.resources
        if r.type != "pulumi:pulumi:Stack" and r.plain_inputs != before.named(r.name).plain_inputs
    }
    assert changed == {"cluster-gpu-operator-dcgm-metrics", "cluster-gpu-operator-release"}
    name = after.named("cluster-gpu-operator-dcgm-metrics").plain_inputs["metadata"]["name"]
    assert after.one(RELEASE).plain_inputs["values"]["dcgmExporter"]["config"] == {"name": name}
    assert after.depends_on(
        after.named("cluster-gpu-operator-release"), after.named("cluster-gpu-operator-dcgm-metrics")
    )


def test_no_exporter_no_metrics_configmap() -> None:
    raw = base_spec()
    raw["gpuOperator"]["dcgm"] = False
    rec = plan_stack(raw)
    assert [r for r in rec.resources if r.name == "cluster-gpu-operator-dcgm-metrics"] == []
    values = rec.one(RELEASE).plain_inputs["values"]
    assert values["dcgmExporter"] == {"enabled": False}


def test_monitoring_resources_only_when_asked() -> None:
    assert plan_stack(base_spec()).of_type(MONITOR) == []
    rec = plan_stack(monitored())
    component = rec.one("proxmox-gpu-cluster:gpu_monitoring:GpuMonitoring")
    assert {r.name for r in rec.children(component)} == {
        "cluster-gpu-monitoring-service-monitor",
        "cluster-gpu-monitoring-alerts",
    }
    rule = rec.one(RULE).plain_inputs["spec"]["groups"][0]["rules"]
    missing = next(r for r in rule if r["alert"] == "GpuExporterMissing")["expr"]
    # the container workers of the base spec, not its vm workloads
    assert missing.count("absent(") == len(
        [w for w in base_spec()["workers"] if w.get("workload", "container") == "container"]
    )
    assert rec.one(MONITOR).provider == rec.one("pulumi:providers:kubernetes").urn
    # in the operator namespace, so created after it
    assert rec.depends_on(rec.one(MONITOR), rec.named("cluster-gpu-operator-namespace"))


def test_monitoring_namespace_and_labels_from_spec() -> None:
    raw = monitored()
    raw["gpuOperator"]["monitoring"].update(namespace="monitoring", labels={"release": "kps"}, scrapeInterval="30s")
    rec = plan_stack(raw)
    monitor = rec.one(MONITOR).plain_inputs
    assert monitor["metadata"] == {
        "name": "nvidia-dcgm-exporter",
        "namespace": "monitoring",
        "labels": {"release": "kps"},
    }
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["gpu-operator"]}
    assert monitor["spec"]["endpoints"][0]["interval"] == "30s"


def test_service_monitor_targets_the_operator_exporter_service() -> None:
    sm = service_monitor_spec(load_spec(monitored()).gpu_operator.monitoring, "gpu-operator")
    assert sm["selector"] == {"matchLabels": {"app": "nvidia-dcgm-exporter"}}
    assert sm["jobLabel"] == "app"  # job="nvidia-dcgm-exporter", what the exporter alerts select
    assert sm["endpoints"][0]["port"] == "gpu-metrics"
    # The exporter's namespace/pod labels name the workload's; kept, not renamed exported_* (the usage rules group
    # by namespace).
    assert sm["endpoints"][0]["honorLabels"] is True
