"""DCGM exporter monitoring as data: the metrics CSV, the ServiceMonitor and the PrometheusRule. Pure.

The metrics ConfigMap is content-addressed like the sharing ConfigMaps: dcgm-exporter reads its CSV once at
start, so a new metric list must reach it as a new ConfigMap name in ``dcgmExporter.config.name``, which rolls
the exporter daemonset.
"""

from __future__ import annotations

from typing import Any

from components.operator_spec import MonitoringSpec
from components.sharing import content_name
from components.spec import ClusterSpec

METRICS_KEY = "dcgm-metrics.csv"
EXPORTER_SELECTOR = {"app": "nvidia-dcgm-exporter"}
"""Labels of the Service the operator creates for dcgm-exporter (port ``gpu-metrics``)."""
EXPORTER_PORT = "gpu-metrics"


def metrics_csv(monitoring: MonitoringSpec) -> str:
    """dcgm-exporter's collectors file: ``<DCGM field>, <prometheus type>, <help>`` per line."""
    lines = ["# Managed by proxmox-gpu-cluster (gpuOperator.monitoring.metrics)", "# DCGM field, type, help"]
    lines += [f"{m.field}, {m.type}, {m.help}" for m in monitoring.metrics]
    return "\n".join(lines) + "\n"


def metrics_config_data(spec: ClusterSpec) -> dict[str, str]:
    """Data of the DCGM metrics ConfigMap."""
    return {METRICS_KEY: metrics_csv(spec.gpu_operator.monitoring)}


def metrics_config_name(data: dict[str, str]) -> str:
    """Content-addressed name of the DCGM metrics ConfigMap."""
    return content_name("dcgm-metrics", data)


def service_monitor_spec(spec: ClusterSpec) -> dict[str, Any]:
    """``spec`` of a ServiceMonitor scraping the operator's dcgm-exporter Service."""
    mon = spec.gpu_operator.monitoring
    return {
        "selector": {"matchLabels": dict(EXPORTER_SELECTOR)},
        "namespaceSelector": {"matchNames": [spec.gpu_operator.namespace]},
        "endpoints": [
            {
                "port": EXPORTER_PORT,
                "path": "/metrics",
                "interval": mon.scrape_interval,
                # One exporter pod per node: name the target after the node rather than the pod IP.
                "relabelings": [
                    {
                        "action": "replace",
                        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                        "targetLabel": "instance",
                    }
                ],
            }
        ],
    }


def _alert(name: str, expr: str, severity: str, summary: str, duration: str | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if duration is not None:
        rule["for"] = duration
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {"summary": summary}
    return rule


def prometheus_rule_spec(spec: ClusterSpec) -> dict[str, Any]:
    """``spec`` of a PrometheusRule with the GPU health alerts.

    XID: DCGM_FI_DEV_XID_ERRORS holds the last XID seen (0 when none), so ``> 0`` fires on any XID and keeps
    firing until the driver is reloaded. Double-bit ECC errors are uncorrectable: any volatile DBE count means
    the GPU needs a reset or page retirement. The framebuffer rule uses used / (used + free) because DCGM
    reports both in MiB and there is no total field in the default list.
    """
    mon = spec.gpu_operator.monitoring
    where = "GPU {{ $labels.gpu }} on {{ $labels.Hostname }}"
    return {
        "groups": [
            {
                "name": "nvidia-gpu",
                "rules": [
                    _alert(
                        "GpuTemperatureHigh",
                        f"DCGM_FI_DEV_GPU_TEMP > {mon.temperature_celsius}",
                        "warning",
                        f"{where} has been above {mon.temperature_celsius} C for 5 minutes",
                        "5m",
                    ),
                    _alert(
                        "GpuXidError", "DCGM_FI_DEV_XID_ERRORS > 0", "critical", where + " reported XID {{ $value }}"
                    ),
                    _alert(
                        "GpuDoubleBitEccError",
                        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0",
                        "critical",
                        f"{where} has uncorrectable (double-bit) ECC errors",
                    ),
                    _alert(
                        "GpuFramebufferNearlyFull",
                        "DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) * 100"
                        f" > {mon.framebuffer_percent}",
                        "warning",
                        f"{where} framebuffer is over {mon.framebuffer_percent}% used",
                        "5m",
                    ),
                ],
            }
        ]
    }
