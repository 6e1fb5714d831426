"""GpuMonitoring: Prometheus Operator scraping and alerting for the operator's DCGM exporter, and a dashboard."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.core.monitoring_spec import MonitoringSpec
from proxmox_gpu_cluster.render.alerts import prometheus_rule_spec
from proxmox_gpu_cluster.render.dashboard import CONFIGMAP_NAME, dashboard_config_map
from proxmox_gpu_cluster.render.dcgm import service_monitor_spec

MONITORING_API = "monitoring.coreos.com/v1"
SERVICE_MONITOR_NAME = "nvidia-dcgm-exporter"
RULE_NAME = "nvidia-gpu-alerts"


class GpuMonitoring(pulumi.ComponentResource):
    """With ``prometheus``: a ServiceMonitor for dcgm-exporter and a PrometheusRule with the GPU alerts (needs
    the Prometheus Operator CRDs, e.g. from kube-prometheus-stack). With ``dashboard.enabled``: the GPU
    dashboard as a ConfigMap Grafana's sidecar imports.

    The metric list itself is the DCGM metrics ConfigMap of ``GpuOperator``, which must exist before the release.
    """

    service_monitor: pulumi.Output[str | None]
    """Name of the ServiceMonitor (None without ``prometheus``)."""
    prometheus_rule: pulumi.Output[str | None]
    """Name of the PrometheusRule (None without ``prometheus``)."""
    dashboard: pulumi.Output[str | None]
    """Name of the dashboard ConfigMap (None without ``dashboard.enabled``)."""

    def __init__(
        self,
        name: str,
        monitoring: MonitoringSpec,
        *,
        provider: kubernetes.Provider,
        operator_namespace: pulumi.Input[str],
        exporter_nodes: Sequence[str] = (),
        row_remapping: bool = True,
        mig: bool = False,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """``operator_namespace``: where the operator runs dcgm-exporter (and the default home of these objects).
        ``exporter_nodes``: GPU nodes that must run the exporter (an alert fires when one has no target; empty:
        alert only when no target exists at all). ``row_remapping``: whether any GPU remaps memory rows (Ampere
        and newer). ``mig``: add the MIG panel to the dashboard."""
        super().__init__("proxmox-gpu-cluster:gpu_monitoring:GpuMonitoring", name, None, opts)
        mon = monitoring
        where = mon.namespace or operator_namespace
        child = pulumi.ResourceOptions(parent=self, provider=provider)

        def metadata(object_name: str, namespace: pulumi.Input[str]) -> kubernetes.meta.v1.ObjectMetaArgs:
            return kubernetes.meta.v1.ObjectMetaArgs(name=object_name, namespace=namespace, labels=dict(mon.labels))

        none: pulumi.Output[str | None] = pulumi.Output.from_input(None)
        self.service_monitor = self.prometheus_rule = self.dashboard = none
        if mon.prometheus:
            monitor = kubernetes.apiextensions.CustomResource(
                f"{name}-service-monitor",
                api_version=MONITORING_API,
                kind="ServiceMonitor",
                metadata=metadata(SERVICE_MONITOR_NAME, where),
                spec=pulumi.Output.from_input(operator_namespace).apply(lambda ns: service_monitor_spec(mon, ns)),
                opts=child,
            )
            rule = kubernetes.apiextensions.CustomResource(
                f"{name}-alerts",
                api_version=MONITORING_API,
                kind="PrometheusRule",
                metadata=metadata(RULE_NAME, where),
                spec=prometheus_rule_spec(mon.alerts, exporter_nodes=exporter_nodes, row_remapping=row_remapping),
                opts=child,
            )
            # The names are ours; deriving them from the ids makes the outputs wait for the objects to exist.
            self.service_monitor = monitor.id.apply(lambda _: SERVICE_MONITOR_NAME)
            self.prometheus_rule = rule.id.apply(lambda _: RULE_NAME)
        if mon.dashboard.enabled:
            body = dashboard_config_map(mon.dashboard, mon.alerts, mig=mig)
            board = kubernetes.core.v1.ConfigMap(
                f"{name}-dashboard",
                kubernetes.core.v1.ConfigMapInitArgs(
                    metadata=kubernetes.meta.v1.ObjectMetaArgs(
                        name=CONFIGMAP_NAME,
                        namespace=mon.dashboard.namespace or where,
                        labels=body["labels"],
                        annotations=body["annotations"] or None,
                    ),
                    data=body["data"],
                ),
                opts=child,
            )
            self.dashboard = board.id.apply(lambda _: CONFIGMAP_NAME)
        outputs = {"serviceMonitor": self.service_monitor, "prometheusRule": self.prometheus_rule}
        self.register_outputs({**outputs, "dashboard": self.dashboard})
