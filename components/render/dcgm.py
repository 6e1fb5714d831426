"""DCGM exporter monitoring as data: the metrics CSV, the ServiceMonitor and the PrometheusRule. Pure.

The metrics ConfigMap is content-addressed like the sharing ConfigMaps: dcgm-exporter reads its CSV once at
start, so a new metric list must reach it as a new ConfigMap name in ``dcgmExporter.config.name``, which rolls
the exporter daemonset.
"""

from __future__ import annotations

from typing import Any

from proxmox_gpu_cluster.core.monitoring_spec import MonitoringSpec
from proxmox_gpu_cluster.render.alerts import EXPORTER_JOB
from proxmox_gpu_cluster.render.sharing import content_name

METRICS_KEY = "dcgm-metrics.csv"
EXPORTER_SELECTOR = {"app": EXPORTER_JOB}
"""Labels of the Service the operator creates for dcgm-exporter (port ``gpu-metrics``)."""
EXPORTER_PORT = "gpu-metrics"


def metrics_csv(monitoring: MonitoringSpec) -> str:
    """dcgm-exporter's collectors file: ``<DCGM field>, <prometheus type>, <help>`` per line."""
    lines = ["# Managed by proxmox-gpu-cluster (gpuOperator.monitoring.metrics)", "# DCGM field, type, help"]
    lines += [f"{m.field}, {m.type}, {m.help}" for m in monitoring.metrics]
    return "\n".join(lines) + "\n"


def metrics_config_data(monitoring: MonitoringSpec) -> dict[str, str]:
    """Data of the DCGM metrics ConfigMap."""
    return {METRICS_KEY: metrics_csv(monitoring)}


def metrics_config_name(data: dict[str, str]) -> str:
    """Content-addressed name of the DCGM metrics ConfigMap."""
    return content_name("dcgm-metrics", data)


def service_monitor_spec(monitoring: MonitoringSpec, operator_namespace: str) -> dict[str, Any]:
    """``spec`` of a ServiceMonitor scraping the operator's dcgm-exporter Service in ``operator_namespace``."""
    return {
        # job = the Service's app label, which the alert rules select on (alerts.EXPORTER_JOB).
        "jobLabel": "app",
        "selector": {"matchLabels": dict(EXPORTER_SELECTOR)},
        "namespaceSelector": {"matchNames": [operator_namespace]},
        "endpoints": [
            {
                "port": EXPORTER_PORT,
                "path": "/metrics",
                "interval": monitoring.scrape_interval,
                # dcgm-exporter labels a GPU's series with the namespace, pod and container using it (its
                # Kubernetes mapping, on in the GPU Operator). The target itself has namespace and pod labels (the
                # exporter's), so without honorLabels Prometheus renames the exporter's to exported_namespace and
                # exported_pod (Prometheus configuration: honor_labels) and GPU use per namespace cannot be queried.
                "honorLabels": True,
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
