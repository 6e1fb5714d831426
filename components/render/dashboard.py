"""The GPU Grafana dashboard as data: the JSON model and the ConfigMap Grafana's sidecar imports. Pure.

Panels follow what the guides ask to watch (utilization, framebuffer, temperature, power, clocks, ECC and XID
errors) plus MIG instances when the cluster uses MIG: dcgm-exporter reports framebuffer per GPU instance with
the ``GPU_I_PROFILE`` / ``GPU_I_ID`` labels. The ``node`` variable filters on ``instance``, which the
ServiceMonitor sets to the node name.
"""

from __future__ import annotations

import json
from typing import Any

from proxmox_gpu_cluster.core.monitoring_spec import AlertsSpec, DashboardSpec
from proxmox_gpu_cluster.render.alerts import promql_string

DASHBOARD_UID = "pgc-nvidia-gpu"
CONFIGMAP_NAME = "nvidia-gpu-dashboard"
DATA_KEY = "nvidia-gpu.json"
FOLDER_ANNOTATION = "grafana_folder"
"""Annotation kube-prometheus-stack's Grafana sidecar reads the folder from (its ``folderAnnotation``)."""

_NODE = 'instance=~"$node"'
_WIDTH = 12
_HEIGHT = 8


def _series(metric: str, extra: str = "") -> str:
    return f"{metric}{{{_NODE}{extra}}}"


def _panel(
    index: int, title: str, unit: str, targets: list[tuple[str, str]], thresholds: tuple[int, ...] = ()
) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": color, "value": v} for color, v in zip(("orange", "red"), thresholds, strict=False)]
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": _HEIGHT, "w": _WIDTH, "x": (index % 2) * _WIDTH, "y": (index // 2) * _HEIGHT},
        "fieldConfig": {
            "defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}},
            "overrides": [],
        },
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def panels(alerts: AlertsSpec, *, mig: bool) -> list[dict[str, Any]]:
    """The dashboard's panels; temperature and framebuffer show the alert thresholds."""
    gpu = "{{instance}} GPU {{gpu}}"
    used, free = _series("DCGM_FI_DEV_FB_USED"), _series("DCGM_FI_DEV_FB_FREE")
    specs: list[tuple[str, str, list[tuple[str, str]], tuple[int, ...]]] = [
        ("GPU utilization", "percent", [(_series("DCGM_FI_DEV_GPU_UTIL"), gpu)], ()),
        ("Tensor core activity", "percentunit", [(_series("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), gpu)], ()),
        (
            "Framebuffer used",
            "percent",
            [(f"{used} / ({used} + {free}) * 100", gpu)],
            (alerts.framebuffer_percent,),
        ),
        (
            "Temperature",
            "celsius",
            [(_series("DCGM_FI_DEV_GPU_TEMP"), gpu)],
            (alerts.temperature_warning_celsius, alerts.temperature_critical_celsius),
        ),
        ("Power draw", "watt", [(_series("DCGM_FI_DEV_POWER_USAGE"), gpu)], ()),
        (
            "Clocks",
            "hertz",
            [
                (f"{_series('DCGM_FI_DEV_SM_CLOCK')} * 1000000", f"{gpu} SM"),
                (f"{_series('DCGM_FI_DEV_MEM_CLOCK')} * 1000000", f"{gpu} memory"),
            ],
            (),
        ),
        (
            "ECC errors (per hour)",
            "short",
            [
                (f"increase({_series('DCGM_FI_DEV_ECC_SBE_VOL_TOTAL')}[1h])", f"{gpu} single-bit"),
                (f"increase({_series('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL')}[1h])", f"{gpu} double-bit"),
            ],
            (),
        ),
        ("Last XID", "none", [(_series("DCGM_FI_DEV_XID_ERRORS"), gpu)], ()),
    ]
    if mig:
        specs.append(
            (
                "MIG instances: framebuffer used",
                "decmbytes",
                [
                    (
                        f"sum by (instance, gpu, GPU_I_PROFILE, GPU_I_ID) "
                        f"({_series('DCGM_FI_DEV_FB_USED', ', GPU_I_PROFILE!=' + promql_string(''))})",
                        "{{instance}} GPU {{gpu}} {{GPU_I_PROFILE}} #{{GPU_I_ID}}",
                    )
                ],
                (),
            )
        )
    return [_panel(i, title, unit, targets, th) for i, (title, unit, targets, th) in enumerate(specs)]


def dashboard(alerts: AlertsSpec, *, mig: bool) -> dict[str, Any]:
    """The dashboard's JSON model (Grafana's schema; imported as-is by the sidecar or by hand)."""
    return {
        "uid": DASHBOARD_UID,
        "title": "NVIDIA GPUs (proxmox-gpu-cluster)",
        "tags": ["gpu", "nvidia", "dcgm"],
        "timezone": "browser",
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "editable": True,
        "templating": {
            "list": [
                {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus"},
                {
                    "name": "node",
                    "label": "Node",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(DCGM_FI_DEV_GPU_UTIL, instance)",
                    "refresh": 2,
                    "multi": True,
                    "includeAll": True,
                    "current": {"text": "All", "value": "$__all"},
                },
            ]
        },
        "panels": panels(alerts, mig=mig),
    }


def dashboard_config_map(spec: DashboardSpec, alerts: AlertsSpec, *, mig: bool) -> dict[str, Any]:
    """Labels, annotations and data of the dashboard ConfigMap."""
    annotations = {FOLDER_ANNOTATION: spec.folder} if spec.folder else {}
    body = json.dumps(dashboard(alerts, mig=mig), indent=1, sort_keys=True)
    return {"labels": {spec.label: spec.label_value}, "annotations": annotations, "data": {DATA_KEY: body}}
