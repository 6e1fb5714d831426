"""Spec models of the GPU software stack: the operator release, DCGM monitoring, the smoke test and DRA. Pure."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from components.dcgm_fields import ALERT_FIELDS, DEFAULT_FIELDS, KNOWN_FIELDS, MetricType
from components.errors import Problem, SpecViolations
from components.spec_base import LINE_BREAKERS, DriverBranch, DriverVersion, Int, Name, SpecModel, on_branch

LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"


class DcgmMetric(SpecModel):
    """A line of dcgm-exporter's metrics CSV. A plain string names a field from the built-in table."""

    field: str = Field(pattern=r"^DCGM_FI_[A-Z0-9_]+$", description="DCGM field identifier.")
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
            raise ValueError(f"{data} is not in the built-in field table; write it as {{field, type, help}}")
        kind, text = KNOWN_FIELDS[data]
        return {"field": data, "type": kind, "help": text}


def _default_metrics() -> tuple[DcgmMetric, ...]:
    return tuple(DcgmMetric.model_validate(f) for f in DEFAULT_FIELDS)


class MonitoringSpec(SpecModel):
    """DCGM exporter metrics and, optionally, Prometheus Operator scraping and alerts."""

    metrics: tuple[DcgmMetric, ...] = Field(
        default_factory=_default_metrics,
        min_length=1,
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
    temperature_celsius: Int = Field(default=85, ge=40, le=120, description="GPU temperature alert threshold.")
    framebuffer_percent: Int = Field(default=95, ge=50, le=100, description="Framebuffer usage alert threshold.")

    @model_validator(mode="after")
    def _metrics_and_labels(self) -> MonitoringSpec:
        problems: list[Problem] = []
        seen: set[str] = set()
        for i, m in enumerate(self.metrics):
            if m.field in seen:
                problems.append(Problem(f"metrics[{i}].field", f"{m.field} is listed twice"))
            seen.add(m.field)
        if self.prometheus:
            missing = [f for f in ALERT_FIELDS if f not in seen]
            if missing:
                problems.append(Problem("metrics", f"the alert rules need {', '.join(missing)}; add them"))
        for key, value in self.labels.items():
            if not re.fullmatch(LABEL_KEY, key) or not re.fullmatch(LABEL_VALUE, value):
                problems.append(Problem(f"labels.{key}", f"not a valid Kubernetes label: {key}={value!r}"))
        if problems:
            raise SpecViolations(problems)
        return self


class SmokeTestSpec(SpecModel):
    """An opt-in Job that runs nvidia-smi on one advertised GPU resource and must complete."""

    enabled: bool = Field(default=False, description="Run the smoke-test Job after the operator release.")
    image: str = Field(
        default="nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04",
        pattern=r"^[a-z0-9][a-z0-9./_:@-]*$",
        description="Container image; the NVIDIA runtime injects nvidia-smi from the host driver.",
    )
    timeout_seconds: Int = Field(default=600, ge=60, le=7200, description="activeDeadlineSeconds of the Job.")


class DraSpec(SpecModel):
    """The NVIDIA DRA driver release, used when any worker sets ``dra``."""

    chart_version: str = Field(
        default="25.12.0",
        pattern=r"^[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}$",
        description="nvidia-dra-driver-gpu chart version.",
    )
    namespace: Name = Field(default="nvidia-dra-driver-gpu", description="Namespace of the DRA driver.")


class GpuOperatorSpec(SpecModel):
    """The NVIDIA GPU Operator release and the GPU software stack on the workers."""

    enabled: bool = Field(default=True, description="Install the GPU Operator.")
    chart_version: Literal["v26.7.0", "v25.10.1"] = Field(default="v26.7.0", description="Chart version.")
    namespace: Name = Field(default="gpu-operator", description="Namespace of the operator.")
    driver_mode: Literal["host", "operator"] = Field(
        default="host",
        description="host: the guest bootstrap installs the driver; operator: a driver container.",
    )
    driver_branch: DriverBranch = Field(default="580", description="Driver branch, e.g. ``580``.")
    driver_version: DriverVersion | None = Field(default=None, description="Exact driver version to pin.")
    kernel_module_type: Literal["auto", "open", "proprietary"] = Field(
        default="auto", description="Open or proprietary kernel modules; auto lets the driver choose."
    )
    cdi: bool = Field(default=False, description="Use the Container Device Interface.")
    dcgm: bool = Field(default=True, description="Deploy the DCGM exporter.")
    mig_strategy: Literal["none", "single", "mixed"] = Field(
        default="none",
        description="How MIG devices are advertised: as nvidia.com/gpu (single) or per profile.",
    )
    nfd: bool = Field(default=True, description="Deploy Node Feature Discovery; off when the cluster has it.")
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec, description="DCGM metrics and alerts.")
    smoke_test: SmokeTestSpec = Field(default_factory=SmokeTestSpec, description="Post-install smoke test.")
    dra: DraSpec = Field(default_factory=DraSpec, description="DRA driver settings (used by ``dra`` workers).")

    @model_validator(mode="after")
    def _consistent(self) -> GpuOperatorSpec:
        problems = []
        if not on_branch(self.driver_version, self.driver_branch):
            problems.append(Problem("driverVersion", f"{self.driver_version} is not on branch {self.driver_branch}"))
        if self.monitoring.prometheus and not (self.enabled and self.dcgm):
            problems.append(Problem("monitoring.prometheus", "needs the operator's DCGM exporter (enabled, dcgm)"))
        if self.smoke_test.enabled and not self.enabled:
            problems.append(Problem("smokeTest.enabled", "the smoke test runs after the operator (enabled: false)"))
        if problems:
            raise SpecViolations(problems)
        return self
