"""GPU alert rules as data: the ``spec`` of the PrometheusRule. Pure.

Every rule names the node (``instance``: the ServiceMonitor relabels it to the node name) and, for GPU rules, the
GPU index and model, so a page says where to look. Semantics of the DCGM fields (dcgm-exporter, DCGM field
reference): XID_ERRORS holds the last XID seen (0 when none) until the driver reloads; ECC_*_VOL_TOTAL count
errors since the driver loaded; ROW_REMAP_FAILURE is 1 once a row remapping failed (Ampere and newer; older GPUs
export no series, so the rule stays quiet there); FB_USED and FB_FREE are MiB.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxmox_gpu_cluster.core.monitoring_spec import AlertsSpec

EXPORTER_JOB = "nvidia-dcgm-exporter"
"""``job`` of the exporter's targets: the ServiceMonitor takes it from the Service's ``app`` label."""
GROUP = "nvidia-gpu"

_GPU = "GPU {{ $labels.gpu }} ({{ $labels.modelName }}) on node {{ $labels.instance }}"
_NODE = "node {{ $labels.instance }}"


def promql_string(value: str) -> str:
    """``value`` as a PromQL double-quoted string literal (Go escaping of backslash, quote and newlines)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _rule(
    name: str, expr: str, severity: str, summary: str, description: str, *, duration: str | None = None
) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if duration is not None:
        rule["for"] = duration
    rule["labels"] = {"severity": severity}
    rule["annotations"] = {"summary": summary, "description": description}
    return rule


def _exporter_rules(alerts: AlertsSpec, exporter_nodes: Sequence[str]) -> list[dict[str, Any]]:
    job = promql_string(EXPORTER_JOB)
    if exporter_nodes:
        # absent() of a selector with equality matchers carries those labels, so the page names the node; a
        # target that exists but fails is GpuExporterDown's, so one outage never pages twice.
        expr = " or ".join(f"absent(up{{job={job},instance={promql_string(n)}}})" for n in exporter_nodes)
    else:
        expr = f"absent(up{{job={job}}})"
    blind = "While it lasts no GPU alert can fire for this node: silence here is not health."
    return [
        _rule(
            "GpuExporterDown",
            f"up{{job={job}}} == 0",
            "critical",
            f"dcgm-exporter on {_NODE} cannot be scraped",
            f"{blind} Check the nvidia-dcgm-exporter pod on the node (restarts, logs) and the driver (nvidia-smi).",
            duration="5m",
        ),
        _rule(
            "GpuExporterMissing",
            expr,
            "critical",
            f"No dcgm-exporter target for {_NODE}",
            f"{blind} Check that the node is labelled nvidia.com/gpu.deploy.dcgm-exporter=true, that the "
            "exporter pod runs there (taints, tolerations) and that Prometheus selects the ServiceMonitor.",
            duration=f"{alerts.exporter_missing_minutes}m",
        ),
    ]


def _xid_rules(alerts: AlertsSpec) -> list[dict[str, Any]]:
    xid = "DCGM_FI_DEV_XID_ERRORS"
    look = "Read the node's kernel log (dmesg | grep -i xid) and NVIDIA's XID catalog for the code."
    if not alerts.critical_xids:
        return [_rule("GpuXidError", f"{xid} > 0", "warning", f"{_GPU} reported XID {{{{ $value }}}}", look)]
    critical = " or ".join(f"{xid} == {code}" for code in alerts.critical_xids)
    return [
        _rule(
            "GpuXidCritical",
            critical,
            "critical",
            f"{_GPU} reported critical XID {{{{ $value }}}}",
            f"{look} These codes mean a GPU reset, page retirement or replacement; cordon the node and drain it.",
        ),
        _rule(
            "GpuXidError",
            f"{xid} > 0 unless ({critical})",
            "warning",
            f"{_GPU} reported XID {{{{ $value }}}}",
            f"{look} Most others point at the application (for example 13, 31, 43).",
        ),
    ]


def alert_rules(alerts: AlertsSpec, *, exporter_nodes: Sequence[str], row_remapping: bool) -> list[dict[str, Any]]:
    """The GPU alert rules, in a stable order.

    ``exporter_nodes``: nodes that must run dcgm-exporter (the container-workload GPU nodes); an empty list
    falls back to alerting when no exporter target exists at all. ``row_remapping``: whether any GPU of the
    cluster remaps rows (NVIDIA's "GPU memory error management": Ampere and newer).
    """
    a = alerts
    used = "DCGM_FI_DEV_FB_USED"
    rules = _exporter_rules(a, exporter_nodes)
    rules += [
        _rule(
            "GpuTemperatureHigh",
            f"DCGM_FI_DEV_GPU_TEMP > {a.temperature_warning_celsius}",
            "warning",
            f"{_GPU} is above {a.temperature_warning_celsius} C",
            "Check the host's cooling and fan curves, airflow around the card and how many jobs share the node.",
            duration="5m",
        ),
        _rule(
            "GpuTemperatureCritical",
            f"DCGM_FI_DEV_GPU_TEMP > {a.temperature_critical_celsius}",
            "critical",
            f"{_GPU} is above {a.temperature_critical_celsius} C and will throttle",
            "The GPU slows itself down to survive; drain the node if cooling cannot be fixed now.",
            duration="1m",
        ),
        _rule(
            "GpuDoubleBitEccError",
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0",
            "critical",
            f"{_GPU} has uncorrectable (double-bit) ECC errors",
            "Memory contents were lost. Cordon and drain the node, then reset the GPU (reboot the VM) so the "
            "bad page is retired or the row remapped; repeated errors mean an RMA.",
        ),
        _rule(
            "GpuSingleBitEccRising",
            f"increase(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL[1h]) > {a.single_bit_ecc_per_hour}",
            "warning",
            f"{_GPU} corrects more than {a.single_bit_ecc_per_hour} single-bit ECC errors an hour",
            "Corrected errors are harmless one by one; a rising rate points at degrading memory. Watch for "
            "double-bit errors and plan a reset.",
        ),
    ]
    if row_remapping:
        rules.append(
            _rule(
                "GpuRowRemapFailure",
                "DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
                "critical",
                f"{_GPU} failed to remap a memory row",
                "The GPU ran out of spare rows; it cannot heal itself. Drain the node and open an RMA.",
            )
        )
    rules += _xid_rules(a)
    rules += [
        _rule(
            "GpuPcieReplaysHigh",
            f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[5m]) * 60 > {a.pcie_replays_per_minute}",
            "warning",
            f"{_GPU} replays more than {a.pcie_replays_per_minute} PCIe packets a minute",
            "The link is noisy: reseat the card or riser, check the slot's link width and speed (lspci -vv on the "
            "Proxmox host) and the BIOS PCIe settings.",
            duration="10m",
        ),
        _rule(
            "GpuFramebufferNearlyFull",
            f"{used} / ({used} + DCGM_FI_DEV_FB_FREE) * 100 > {a.framebuffer_percent}",
            "warning",
            f"{_GPU} framebuffer is over {a.framebuffer_percent}% used",
            "The next allocation may fail with CUDA out of memory; with time-slicing any sharer can be the victim. "
            "Check which pods share the GPU and their batch sizes.",
            duration="5m",
        ),
        _rule(
            "GpuUtilizationSustained",
            f"DCGM_FI_DEV_GPU_UTIL > {a.utilization_percent}",
            "info",
            f"{_GPU} has been above {a.utilization_percent}% busy for {a.utilization_minutes} minutes",
            "Not a fault: the GPU is saturated. If jobs queue, add capacity or use priority classes.",
            duration=f"{a.utilization_minutes}m",
        ),
    ]
    return rules


USAGE_GROUP = "nvidia-gpu-usage"
USAGE_FIELDS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")
"""The fields the recording rules read (both are alert fields too, so a spec with alerts exports them)."""


def usage_rules() -> list[dict[str, Any]]:
    """Recording rules for GPU use per namespace (level:metric:operation names, Prometheus' rule naming).

    dcgm-exporter labels the series of a GPU a pod uses with that pod's ``namespace`` and ``pod``; the series of
    an idle GPU has neither. The ServiceMonitor's ``honorLabels`` keeps the exporter's labels, and Prometheus then
    gives every series that lacks a target label the target's own (prometheus ``scrape/scrape.go``,
    ``mutateSampleLabels``): the exporter pod's ``namespace`` and ``pod``, which prometheus-operator sets on every
    ServiceMonitor target (``generateServiceMonitorConfig``). So an idle GPU carries the exporter's namespace and
    pod, exactly those of its ``up`` series, and ``unless on (namespace, pod) up`` leaves it out; a GPU a pod uses,
    even one in the exporter's namespace, keeps a pod of its own and counts."""
    used = f"unless on (namespace, pod) up{{job={promql_string(EXPORTER_JOB)}}}"
    return [
        {"record": "namespace:nvidia_gpu_in_use:count",
         "expr": f"count by (namespace) (DCGM_FI_DEV_FB_USED {used})"},
        {"record": "namespace:nvidia_gpu_utilization_percent:avg",
         "expr": f"avg by (namespace) (DCGM_FI_DEV_GPU_UTIL {used})"},
        {"record": "namespace:nvidia_gpu_framebuffer_used_mib:sum",
         "expr": f"sum by (namespace) (DCGM_FI_DEV_FB_USED {used})"},
    ]  # fmt: skip


def prometheus_rule_spec(alerts: AlertsSpec, *, exporter_nodes: Sequence[str], row_remapping: bool) -> dict[str, Any]:
    """``spec`` of the PrometheusRule: the GPU alert rules, and the recording rules of GPU use per namespace."""
    rules = alert_rules(alerts, exporter_nodes=exporter_nodes, row_remapping=row_remapping)
    return {"groups": [{"name": GROUP, "rules": rules}, {"name": USAGE_GROUP, "rules": usage_rules()}]}
