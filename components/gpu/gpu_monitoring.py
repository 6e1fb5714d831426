"""GpuMonitoring: Prometheus Operator scraping and alerting for the operator's DCGM exporter, and a dashboard."""

from __future__ import annotations

from functools import cached_property

import pulumi
import pulumi_kubernetes as kubernetes
from pydantic import Field, model_validator

from proxmox_gpu_cluster.args import ComponentArgs, Input
from proxmox_gpu_cluster.core.cluster_nodes import MonitoringTargets, monitoring_targets
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.monitoring_spec import MonitoringSpec
from proxmox_gpu_cluster.core.spec_base import Name
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import caller_dependencies
from proxmox_gpu_cluster.render.alerts import prometheus_rule_spec
from proxmox_gpu_cluster.render.dashboard import CONFIGMAP_NAME, dashboard_config_map
from proxmox_gpu_cluster.render.dcgm import service_monitor_spec
from proxmox_gpu_cluster.render.gpu_stack import GpuNodes, nodes_problems

MONITORING_API = "monitoring.coreos.com/v1"
SERVICE_MONITOR_NAME = "nvidia-dcgm-exporter"
RULE_NAME = "nvidia-gpu-alerts"


class GpuMonitoringArgs(ComponentArgs):
    """What to deliver, where, and the GPU nodes it watches."""

    monitoring: MonitoringSpec = Field(
        default_factory=MonitoringSpec, description="ServiceMonitor, alerts and dashboard settings."
    )
    operator_namespace: Input[Name] = Field(
        description="Where the operator runs dcgm-exporter (the default home of these objects), e.g. the "
        "``GpuOperator.namespace`` output."
    )
    nodes: GpuNodes = Field(
        default=(),
        description="The GPU nodes (``GpuStack.nodes``): their container nodes are the exporter's targets, their "
        "GPUs decide the row-remapping alerts (Ampere and newer) and the MIG panel. Empty: alert only when no "
        "target exists at all, with every alert.",
    )
    exporter_nodes: tuple[Name, ...] | None = Field(
        default=None,
        description="Nodes that must run the exporter (an alert fires while one has no target); by default every "
        "container node of ``nodes``. Each must be a container node of ``nodes``: any other never gets a target, "
        "so its alert would fire forever.",
    )

    @model_validator(mode="after")
    def _targets(self) -> GpuMonitoringArgs:
        problems = nodes_problems(self.nodes)
        if not problems:
            known = monitoring_targets(self.nodes).exporter_nodes
            problems += [
                Problem(
                    f"exporter_nodes[{i}]",
                    f"{node} is not a container node of nodes ({', '.join(known) or 'none'}): it never runs the "
                    "exporter, so its alert would fire forever",
                )
                for i, node in enumerate(self.exporter_nodes or ())
                if node not in known
            ]
        if problems:
            raise SpecViolations(problems)
        return self

    @cached_property
    def targets(self) -> MonitoringTargets:
        """Which nodes run the exporter and what their GPUs can report (no nodes: every alert and panel)."""
        found = monitoring_targets(self.nodes)
        exporters = found.exporter_nodes if self.exporter_nodes is None else self.exporter_nodes
        return MonitoringTargets(
            exporter_nodes=exporters, row_remapping=found.row_remapping or not self.nodes, mig=found.mig
        )


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

    def __init__(self, name: str, args: GpuMonitoringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the Kubernetes provider in ``opts.provider`` (the children inherit it); ``opts.depends_on``
        reaches every object (the ServiceMonitor and PrometheusRule need the Prometheus Operator's CRDs)."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:gpu_monitoring:GpuMonitoring", name, None, opts)
        mon = args.monitoring
        operator_namespace = args.operator_namespace
        targets = args.targets
        where = mon.namespace or operator_namespace
        child = pulumi.ResourceOptions(parent=self, depends_on=caller_dependencies(opts))

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
                spec=prometheus_rule_spec(
                    mon.alerts, exporter_nodes=targets.exporter_nodes, row_remapping=targets.row_remapping
                ),
                opts=child,
            )
            # The names are ours; deriving them from the ids makes the outputs wait for the objects to exist.
            self.service_monitor = monitor.id.apply(lambda _: SERVICE_MONITOR_NAME)
            self.prometheus_rule = rule.id.apply(lambda _: RULE_NAME)
        if mon.dashboard.enabled:
            body = dashboard_config_map(mon.dashboard, mon.alerts, mig=targets.mig)
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
