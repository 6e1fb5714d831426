"""Spec models of GPU monitoring: the DCGM metric list, Prometheus alerts and the Grafana dashboard. Pure."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import Field, GetJsonSchemaHandler, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from proxmox_gpu_cluster.core.dcgm_fields import (
    ALERT_FIELDS,
    DASHBOARD_FIELDS,
    DEFAULT_FIELDS,
    KNOWN_FIELDS,
    MetricType,
)
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.quoting import LINE_BREAKERS
from proxmox_gpu_cluster.core.spec_base import Int, Name, SpecModel, with_string_shorthand

LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"

# XIDs that mean the GPU needs a reset, page retirement or replacement (NVIDIA's XID catalog: 48 double-bit ECC,
# 63/64 page retirement or row remapping event/failure, 74 NVLink error, 79 GPU fell off the bus, 94/95
# contained/uncontained ECC error). Everything else is reported as a warning.
DEFAULT_CRITICAL_XIDS = (48, 63, 64, 74, 79, 94, 95)


class DcgmMetric(SpecModel):
    """A line of dcgm-exporter's metrics CSV. A plain string names a field from the built-in table."""

    field: str = Field(pattern=r"^DCGM_FI_[A-Z0-9_]+$", max_length=128, description="DCGM field identifier.")
    type: MetricType = Field(description="Prometheus metric type.")
    help: str = Field(
        pattern=f"^[^,{LINE_BREAKERS}]+$",
        max_length=512,
        description="Help text on one line; no commas (the exporter parses the file as CSV).",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if not isinstance(data, str):
            return data
        if data not in KNOWN_FIELDS:
            raise ValueError(f"{data[:128]} is not in the built-in field table; write it as {{field, type, help}}")
        kind, text = KNOWN_FIELDS[data]
        return {"field": data, "type": kind, "help": text}

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return with_string_shorthand(core_schema, handler, {"type": "string", "enum": list(KNOWN_FIELDS)})


def _default_metrics() -> tuple[DcgmMetric, ...]:
    return tuple(DcgmMetric.model_validate(f) for f in DEFAULT_FIELDS)


class AlertsSpec(SpecModel):
    """Thresholds of the GPU alert rules (the defaults follow the guides' production sections)."""

    temperature_warning_celsius: Int = Field(default=85, ge=40, le=120, description="Warn above this (5 min).")
    temperature_critical_celsius: Int = Field(default=90, ge=40, le=120, description="Critical above this (1 min).")
    framebuffer_percent: Int = Field(default=95, ge=50, le=100, description="Framebuffer use that warns (5 min).")
    utilization_percent: Int = Field(default=95, ge=50, le=100, description="Utilization reported as sustained.")
    utilization_minutes: Int = Field(default=30, ge=5, le=1440, description="How long utilization must stay high.")
    single_bit_ecc_per_hour: Int = Field(
        default=10, ge=0, le=1_000_000, description="Single-bit ECC errors per hour that warn (memory degrading)."
    )
    pcie_replays_per_minute: Int = Field(
        default=10, ge=0, le=1_000_000, description="PCIe replays per minute that warn (link or riser trouble)."
    )
    exporter_missing_minutes: Int = Field(
        default=10, ge=1, le=1440, description="Minutes without a successful scrape of a GPU node's exporter."
    )
    critical_xids: tuple[Annotated[Int, Field(ge=1, le=999)], ...] = Field(
        default=DEFAULT_CRITICAL_XIDS, max_length=100, description="XID codes alerted as critical; others warn."
    )

    @model_validator(mode="after")
    def _ordered(self) -> AlertsSpec:
        problems = []
        if self.temperature_critical_celsius <= self.temperature_warning_celsius:
            problems.append(
                Problem(
                    "temperatureCriticalCelsius",
                    f"{self.temperature_critical_celsius} must be above temperatureWarningCelsius "
                    f"({self.temperature_warning_celsius})",
                )
            )
        seen: set[int] = set()
        for i, code in enumerate(self.critical_xids):
            if code in seen:
                problems.append(Problem(f"criticalXids[{i}]", f"XID {code} is listed twice"))
            seen.add(code)
        if problems:
            raise SpecViolations(problems)
        return self


class DashboardSpec(SpecModel):
    """A Grafana dashboard delivered as a ConfigMap for Grafana's dashboard sidecar (kube-prometheus-stack)."""

    enabled: bool = Field(default=False, description="Create the dashboard ConfigMap.")
    namespace: Name | None = Field(
        default=None, description="Namespace the sidecar watches; default: the monitoring namespace."
    )
    label: Annotated[str, Field(max_length=317)] = Field(
        default="grafana_dashboard", description="Label the sidecar selects dashboards by (its `label`)."
    )
    label_value: Annotated[str, Field(max_length=63)] = Field(
        default="1", description="Value of that label (the sidecar's `labelValue`)."
    )
    folder: Annotated[str, Field(max_length=128, pattern=f"^[^{LINE_BREAKERS}]+$")] | None = Field(
        default=None, description="Grafana folder, set as the `grafana_folder` annotation the sidecar can read."
    )

    @model_validator(mode="after")
    def _label(self) -> DashboardSpec:
        if not re.fullmatch(LABEL_KEY, self.label) or not re.fullmatch(LABEL_VALUE, self.label_value):
            raise SpecViolations([Problem("label", f"not a valid Kubernetes label: {self.label}={self.label_value!r}")])
        return self


class MonitoringSpec(SpecModel):
    """DCGM exporter metrics and, optionally, Prometheus Operator scraping and alerts and a Grafana dashboard."""

    metrics: tuple[DcgmMetric, ...] = Field(
        default_factory=_default_metrics,
        min_length=1,
        max_length=500,
        description="Metrics the DCGM exporter exports (a field name, or {field, type, help}).",
    )
    prometheus: bool = Field(
        default=False,
        description="Create a ServiceMonitor and a PrometheusRule (needs the Prometheus Operator CRDs).",
    )
    namespace: Name | None = Field(
        default=None, description="Namespace of the ServiceMonitor and PrometheusRule; default: the operator's."
    )
    labels: dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict,
        description="Labels your Prometheus selects rules and monitors by, e.g. ``release: kube-prometheus-stack``.",
    )
    scrape_interval: str = Field(default="15s", pattern=r"^[1-9][0-9]{0,4}[smh]$", description="Scrape interval.")
    alerts: AlertsSpec = Field(default_factory=AlertsSpec, description="Alert thresholds (with ``prometheus``).")
    dashboard: DashboardSpec = Field(default_factory=DashboardSpec, description="Grafana dashboard ConfigMap.")

    @model_validator(mode="after")
    def _metrics_and_labels(self) -> MonitoringSpec:
        problems: list[Problem] = []
        seen: set[str] = set()
        for i, m in enumerate(self.metrics):
            if m.field in seen:
                problems.append(Problem(f"metrics[{i}].field", f"{m.field} is listed twice"))
            seen.add(m.field)
        users = (
            (self.prometheus, ALERT_FIELDS, "the alert rules"),
            (self.dashboard.enabled, DASHBOARD_FIELDS, "the dashboard"),
        )
        for wanted, needed, by in users:
            missing = [f for f in needed if f not in seen]
            if wanted and missing:
                problems.append(
                    Problem("metrics", f"{by} query {', '.join(missing)}, missing from this list; add them")
                )
        for key, value in self.labels.items():
            if not re.fullmatch(LABEL_KEY, key) or not re.fullmatch(LABEL_VALUE, value):
                problems.append(Problem(f"labels.{key}", f"not a valid Kubernetes label: {key}={value!r}"))
        if problems:
            raise SpecViolations(problems)
        return self
