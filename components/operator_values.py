"""Helm values of the GPU Operator chart as a pure, typed function of the spec. Pure.

Every path emitted here exists in the pinned chart's values.yaml or, for options the chart leaves commented
out, in the ClusterPolicy CRD's spec schema; ``tests/components/test_operator_values.py`` walks every variant
against ``../shared/reference/gpu-operator/<tag>/`` because Helm silently ignores a mistyped key. Keys the chart
no longer renders are never emitted: ``operator.defaultRuntime`` (gone from the template since early 2025) and
``driver.useOpenKernelModules`` (superseded by ``driver.kernelModuleType``).
"""

from __future__ import annotations

from typing import Any

from components.spec import ClusterSpec


def uses_mig(spec: ClusterSpec) -> bool:
    """Whether any container worker shares its GPUs with MIG."""
    return any(w.sharing == "mig" and w.workload == "container" for w in spec.workers)


def operator_values(
    spec: ClusterSpec,
    *,
    device_plugin_config: str | None = None,
    device_plugin_default: str | None = None,
    mig_config: str | None = None,
    dcgm_metrics_config: str | None = None,
) -> dict[str, Any]:
    """Values for ``gpu-operator`` at ``spec.gpu_operator.chart_version``.

    The ConfigMap names come from the sharing and monitoring components (content-addressed), so a content
    change changes these values and rolls the affected daemonsets.
    """
    op = spec.gpu_operator
    host_driver = op.driver_mode == "host"
    values: dict[str, Any] = {
        "nfd": {"enabled": op.nfd},
        # With the driver and toolkit installed on the host, CDI stays off by default: the host toolkit's
        # runtime configuration does not generate CDI specs unless asked (nvidia-ctk cdi generate), and a
        # stale spec after a MIG change breaks pod starts. Turn it on in the spec when the host generates them.
        "cdi": {"enabled": op.cdi},
        "mig": {"strategy": op.mig_strategy},
        "driver": {"enabled": not host_driver},
        "toolkit": {"enabled": not host_driver},
        "dcgmExporter": {"enabled": op.dcgm},
        "migManager": {"enabled": uses_mig(spec)},
    }
    if not host_driver:
        values["driver"]["kernelModuleType"] = op.kernel_module_type
        if op.driver_version is not None:
            values["driver"]["version"] = op.driver_version
    if device_plugin_config is not None:
        values["devicePlugin"] = {
            "config": {"name": device_plugin_config, "default": device_plugin_default or "", "create": False}
        }
    if mig_config is not None and uses_mig(spec):
        values["migManager"]["config"] = {"name": mig_config, "create": False, "default": "all-disabled"}
    if dcgm_metrics_config is not None and op.dcgm:
        values["dcgmExporter"]["config"] = {"name": dcgm_metrics_config}
    return values
