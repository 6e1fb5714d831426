"""GpuMonitoring: Prometheus Operator scraping and alerting for the operator's DCGM exporter."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as kubernetes

from components.dcgm import prometheus_rule_spec, service_monitor_spec
from components.spec import ClusterSpec

MONITORING_API = "monitoring.coreos.com/v1"
SERVICE_MONITOR_NAME = "nvidia-dcgm-exporter"
RULE_NAME = "nvidia-gpu-alerts"


class GpuMonitoring(pulumi.ComponentResource):
    """A ServiceMonitor for dcgm-exporter and a PrometheusRule with GPU health alerts.

    Needs the Prometheus Operator CRDs in the cluster (kube-prometheus-stack installs them). The metric list
    itself is the DCGM metrics ConfigMap of ``GpuOperator``, which must exist before the release.
    """

    service_monitor: pulumi.Output[str]
    """Name of the ServiceMonitor."""
    prometheus_rule: pulumi.Output[str]
    """Name of the PrometheusRule."""

    def __init__(
        self,
        name: str,
        spec: ClusterSpec,
        *,
        provider: kubernetes.Provider,
        namespace: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """``namespace``: the operator's namespace output; used unless the spec names another one."""
        super().__init__("proxmox-gpu-cluster:gpu_monitoring:GpuMonitoring", name, None, opts)
        mon = spec.gpu_operator.monitoring
        where = mon.namespace or namespace
        child = pulumi.ResourceOptions(parent=self, provider=provider)

        def metadata(object_name: str) -> kubernetes.meta.v1.ObjectMetaArgs:
            return kubernetes.meta.v1.ObjectMetaArgs(name=object_name, namespace=where, labels=dict(mon.labels))

        monitor = kubernetes.apiextensions.CustomResource(
            f"{name}-service-monitor",
            api_version=MONITORING_API,
            kind="ServiceMonitor",
            metadata=metadata(SERVICE_MONITOR_NAME),
            spec=service_monitor_spec(spec),
            opts=child,
        )
        rule = kubernetes.apiextensions.CustomResource(
            f"{name}-alerts",
            api_version=MONITORING_API,
            kind="PrometheusRule",
            metadata=metadata(RULE_NAME),
            spec=prometheus_rule_spec(spec),
            opts=child,
        )
        # The names are ours; deriving them from the ids makes the outputs wait for the objects to exist.
        self.service_monitor = monitor.id.apply(lambda _: SERVICE_MONITOR_NAME)
        self.prometheus_rule = rule.id.apply(lambda _: RULE_NAME)
        self.register_outputs({"serviceMonitor": self.service_monitor, "prometheusRule": self.prometheus_rule})
