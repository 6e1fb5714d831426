"""The Grafana dashboard: panels for what the guides ask to watch, every query parses and uses only exported
metrics, thresholds follow the alert spec; GpuMonitoring delivers it as a sidecar ConfigMap on its own."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.cluster.adapters import monitoring as monitoring_targets
from proxmox_gpu_cluster.core.dcgm_fields import DASHBOARD_FIELDS, DEFAULT_FIELDS
from proxmox_gpu_cluster.core.monitoring_spec import AlertsSpec, DashboardSpec, MonitoringSpec
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.gpu.gpu_monitoring import GpuMonitoring, GpuMonitoringArgs
from proxmox_gpu_cluster.render.dashboard import CONFIGMAP_NAME, DATA_KEY, dashboard, dashboard_config_map
from proxmox_gpu_cluster.testing import run
from tests.support import base_spec, make_vm_worker, promql_metrics


def targets(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def test_panels_cover_what_the_guides_watch() -> None:
    titles = " ".join(p["title"].lower() for p in dashboard(AlertsSpec(), mig=False)["panels"])
    for topic in ("utilization", "framebuffer", "temperature", "power", "clocks", "ecc", "xid", "tensor"):
        assert topic in titles, topic
    assert "mig" not in titles
    assert "MIG" in dashboard(AlertsSpec(), mig=True)["panels"][-1]["title"]


def test_every_query_parses_and_uses_exported_metrics_only() -> None:
    used: set[str] = set()
    for expr in targets(dashboard(AlertsSpec(), mig=True)):
        names = promql_metrics(expr)
        assert names, expr
        used |= names
    assert used == set(DASHBOARD_FIELDS)  # the spec's required list is exactly what the panels query
    assert set(DASHBOARD_FIELDS) <= set(DEFAULT_FIELDS)


def test_layout_ids_and_node_filter() -> None:
    board = dashboard(AlertsSpec(), mig=True)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in board["panels"]]
    assert len(cells) == len(set(cells))  # no two panels on top of each other
    assert all('instance=~"$node"' in expr for expr in targets(board))
    variables = {v["name"] for v in board["templating"]["list"]}
    assert variables == {"datasource", "node"}


def test_thresholds_follow_the_alert_spec() -> None:
    alerts = AlertsSpec(temperatureWarningCelsius=80, temperatureCriticalCelsius=88, framebufferPercent=90)
    panels = {p["title"]: p for p in dashboard(alerts, mig=False)["panels"]}
    steps = panels["Temperature"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 80, 88]
    steps = panels["Framebuffer used"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 90]


def test_config_map_labels_for_the_sidecar_and_json_body() -> None:
    body = dashboard_config_map(DashboardSpec(label="grafana_dashboard", labelValue="gpu"), AlertsSpec(), mig=False)
    assert body["labels"] == {"grafana_dashboard": "gpu"} and body["annotations"] == {}
    assert json.loads(body["data"][DATA_KEY]) == dashboard(AlertsSpec(), mig=False)


def test_mig_panel_follows_the_cluster() -> None:
    assert monitoring_targets(load_spec(base_spec())).mig  # mig-1, mig-2
    raw = base_spec()
    for w in raw["workers"]:
        w["sharing"] = "none"
        w.pop("mig", None), w.pop("timeSlicing", None)
        w["gpus"] = [g if isinstance(g, str) else g["ref"] for g in w["gpus"]]
    raw["quotas"] = []
    assert not monitoring_targets(load_spec(raw)).mig


def test_vm_workloads_run_no_exporter() -> None:
    raw = make_vm_worker(base_spec(), 2, "vm-passthrough")
    spec = load_spec(raw)
    assert raw["workers"][2]["name"] not in monitoring_targets(spec).exporter_nodes
    assert len(monitoring_targets(spec).exporter_nodes) == len(raw["workers"]) - 1


def test_dashboard_alone_under_the_mock() -> None:
    """GpuMonitoring built directly, with nothing but a monitoring spec and a namespace: only the ConfigMap."""

    def program() -> None:
        provider = kubernetes.Provider("k8s", kubeconfig="{}")
        spec = MonitoringSpec(dashboard=DashboardSpec(enabled=True, namespace="grafana"))
        args = GpuMonitoringArgs(monitoring=spec, operator_namespace="gpu-operator")
        GpuMonitoring("mon", args, pulumi.ResourceOptions(provider=provider))

    rec = run(program)
    component = rec.one("proxmox-gpu-cluster:gpu_monitoring:GpuMonitoring")
    (board,) = rec.children(component)
    assert board.type == "kubernetes:core/v1:ConfigMap"
    assert board.plain_inputs["metadata"]["name"] == CONFIGMAP_NAME
    assert board.plain_inputs["metadata"]["namespace"] == "grafana"
    assert board.provider == rec.one("pulumi:providers:kubernetes").urn
