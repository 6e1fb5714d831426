"""GPU alert rules: PromQL that parses (promql-parser), metrics the exporter exports, and behaviour checked by
Prometheus itself: ``promtool test rules`` feeds each rule synthetic series and asserts which alerts fire."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from proxmox_gpu_cluster.core.dcgm_fields import ALERT_FIELDS, DEFAULT_FIELDS
from proxmox_gpu_cluster.core.monitoring_spec import AlertsSpec
from proxmox_gpu_cluster.render.alerts import (
    EXPORTER_JOB,
    USAGE_FIELDS,
    USAGE_GROUP,
    alert_rules,
    prometheus_rule_spec,
    promql_string,
    usage_rules,
)
from tests.support import promql_metrics, promtool

NODES = ("gpu-a", "gpu-b")
SCRAPE_METRICS = {"up"}  # written by Prometheus for every target, not by the exporter


def rules(**overrides: Any) -> list[dict[str, Any]]:
    return alert_rules(AlertsSpec.model_validate(overrides), exporter_nodes=NODES, row_remapping=True)


def test_every_expression_parses_and_queries_only_exported_metrics() -> None:
    exported = set(DEFAULT_FIELDS)
    queried: set[str] = set()
    for rule in rules():
        names = promql_metrics(rule["expr"])
        assert names, rule["alert"]
        assert names - SCRAPE_METRICS <= exported, rule["alert"]
        queried |= names
    assert queried - SCRAPE_METRICS == set(ALERT_FIELDS)  # the spec's required list is exactly what is queried


def test_metric_extraction_would_catch_an_unexported_metric() -> None:
    names = promql_metrics('rate(DCGM_FI_DEV_NVLINK_X[5m]) > on(gpu) max(DCGM_FI_DEV_GPU_TEMP{a="b"})')
    assert names == {"DCGM_FI_DEV_NVLINK_X", "DCGM_FI_DEV_GPU_TEMP"}


def test_rules_cover_the_failure_modes_with_annotations_naming_node_and_gpu() -> None:
    by_name = {r["alert"]: r for r in rules()}
    assert set(by_name) == {
        "GpuExporterDown", "GpuExporterMissing", "GpuTemperatureHigh", "GpuTemperatureCritical",
        "GpuDoubleBitEccError", "GpuSingleBitEccRising", "GpuRowRemapFailure", "GpuXidCritical", "GpuXidError",
        "GpuPcieReplaysHigh", "GpuFramebufferNearlyFull", "GpuUtilizationSustained",
    }  # fmt: skip
    for rule in by_name.values():
        assert set(rule["annotations"]) == {"summary", "description"}
        assert "{{ $labels.instance }}" in rule["annotations"]["summary"], rule["alert"]
        if not rule["alert"].startswith("GpuExporter"):
            assert "{{ $labels.gpu }}" in rule["annotations"]["summary"], rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    assert by_name["GpuUtilizationSustained"]["labels"]["severity"] == "info"
    assert by_name["GpuUtilizationSustained"]["for"] == "30m"


def test_row_remap_rule_only_for_gpus_that_remap_rows() -> None:
    older = alert_rules(AlertsSpec(), exporter_nodes=NODES, row_remapping=False)
    assert "GpuRowRemapFailure" not in {r["alert"] for r in older}


def test_no_known_nodes_falls_back_to_a_job_wide_absence() -> None:
    spec = prometheus_rule_spec(AlertsSpec(), exporter_nodes=(), row_remapping=True)
    missing = next(r for r in spec["groups"][0]["rules"] if r["alert"] == "GpuExporterMissing")
    assert missing["expr"] == f'absent(up{{job="{EXPORTER_JOB}"}})'


@pytest.mark.parametrize("value", ["gpu-a", 'quote"d', "back\\slash", "new\nline", "ünï"])
def test_promql_string_round_trips_through_the_parser(value: str) -> None:
    expr = promql_parser.parse(f"up{{instance={promql_string(value)}}}")
    assert [m.value for m in expr.matchers.matchers if m.name == "instance"] == [value]


# -- behaviour, evaluated by promtool ----------------------------------------------------------------------------

GPU = {"gpu": "0", "modelName": "NVIDIA A100-PCIE-40GB", "instance": "gpu-a", "UUID": "GPU-1"}
EXPORTER = {"job": EXPORTER_JOB}
ALL_ALERTS = sorted({r["alert"] for r in rules()})


def series(metric: str, values: str, labels: dict[str, str] | None = None) -> dict[str, str]:
    body = ",".join(f"{k}={promql_string(v)}" for k, v in sorted((labels or GPU).items()))
    return {"series": f"{metric}{{{body}}}", "values": values}


def up(instance: str, values: str) -> dict[str, str]:
    return series("up", values, {**EXPORTER, "instance": instance})


HEALTHY = [up("gpu-a", "1x120"), up("gpu-b", "1x120")]

# (case, input series besides the healthy exporters, evaluation time, alerts that must fire -> their labels)
CASES: list[tuple[str, list[dict[str, str]], str, dict[str, list[dict[str, str]]]]] = [
    ("all quiet", [*HEALTHY, series("DCGM_FI_DEV_GPU_TEMP", "60x20"), series("DCGM_FI_DEV_XID_ERRORS", "0x20")], "15m", {}),
    ("exporter down", [up("gpu-a", "0x20"), up("gpu-b", "1x20")], "10m",
     {"GpuExporterDown": [{**EXPORTER, "instance": "gpu-a"}]}),
    ("exporter down briefly", [up("gpu-a", "0 0 1x20"), up("gpu-b", "1x20")], "10m", {}),
    ("exporter target gone", [up("gpu-a", "1x30")], "15m", {"GpuExporterMissing": [{**EXPORTER, "instance": "gpu-b"}]}),
    ("temperature warm", [*HEALTHY, series("DCGM_FI_DEV_GPU_TEMP", "87x20")], "10m", {"GpuTemperatureHigh": [GPU]}),
    ("temperature hot", [*HEALTHY, series("DCGM_FI_DEV_GPU_TEMP", "92x20")], "10m",
     {"GpuTemperatureHigh": [GPU], "GpuTemperatureCritical": [GPU]}),
    ("temperature spike", [*HEALTHY, series("DCGM_FI_DEV_GPU_TEMP", "92 60x20")], "10m", {}),
    ("double-bit ECC", [*HEALTHY, series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0 0 1x20")], "5m",
     {"GpuDoubleBitEccError": [GPU]}),
    ("single-bit ECC rising", [*HEALTHY, series("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "0+1x100")], "90m",
     {"GpuSingleBitEccRising": [GPU]}),
    ("single-bit ECC trickle", [*HEALTHY, series("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "0+0.1x100")], "90m", {}),
    ("row remap failed", [*HEALTHY, series("DCGM_FI_DEV_ROW_REMAP_FAILURE", "0 1x20")], "5m",
     {"GpuRowRemapFailure": [GPU]}),
    ("critical XID", [*HEALTHY, series("DCGM_FI_DEV_XID_ERRORS", "0 79x20")], "5m", {"GpuXidCritical": [GPU]}),
    ("application XID", [*HEALTHY, series("DCGM_FI_DEV_XID_ERRORS", "0 13x20")], "5m", {"GpuXidError": [GPU]}),
    ("PCIe replays", [*HEALTHY, series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "0+30x60")], "30m",
     {"GpuPcieReplaysHigh": [GPU]}),
    ("PCIe replays rare", [*HEALTHY, series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "0+1x60")], "30m", {}),
    ("framebuffer full",
     [*HEALTHY, series("DCGM_FI_DEV_FB_USED", "40000x20"), series("DCGM_FI_DEV_FB_FREE", "500x20")], "10m",
     {"GpuFramebufferNearlyFull": [GPU]}),
    ("framebuffer half",
     [*HEALTHY, series("DCGM_FI_DEV_FB_USED", "20000x20"), series("DCGM_FI_DEV_FB_FREE", "20000x20")], "10m", {}),
    ("busy for long", [*HEALTHY, series("DCGM_FI_DEV_GPU_UTIL", "99x60")], "40m", {"GpuUtilizationSustained": [GPU]}),
    ("busy for a while", [*HEALTHY, series("DCGM_FI_DEV_GPU_UTIL", "99x20 50x40")], "40m", {}),
]  # fmt: skip


def render(template: str, labels: dict[str, str], value: str) -> str:
    """Prometheus's annotation templating for the two forms the rules use."""
    out = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)
    return out.replace("{{ $value }}", value)


def expected(rule: dict[str, Any], labels: dict[str, str], values: list[dict[str, str]]) -> dict[str, Any]:
    # The only {{ $value }} users are the XID rules; their value is the last XID of the series.
    last = next((v["values"].split()[-1].split("x")[0] for v in values if "XID" in v["series"]), "")
    all_labels = {**labels, "severity": rule["labels"]["severity"]}
    annotations = {k: render(t, all_labels, last) for k, t in rule["annotations"].items()}
    return {"exp_labels": all_labels, "exp_annotations": annotations}


def test_each_rule_fires_and_stays_quiet_as_promtool_evaluates_it(tmp_path: Path) -> None:
    tool = promtool()
    by_name = {r["alert"]: r for r in rules()}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "gpu", "rules": list(by_name.values())}]}))
    tests = []
    for _case, inputs, at, firing in CASES:
        assert set(firing) <= set(ALL_ALERTS)
        checks = [
            {
                "eval_time": at,
                "alertname": name,
                "exp_alerts": [expected(by_name[name], labels, inputs) for labels in firing.get(name, [])],
            }
            for name in ALL_ALERTS
        ]
        tests.append({"interval": "1m", "input_series": inputs, "alert_rule_test": checks})
    (tmp_path / "tests.yaml").write_text(
        yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests})
    )
    result = subprocess.run(
        [str(tool), "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    fired = {name for _, _, _, firing in CASES for name in firing}
    assert fired == set(ALL_ALERTS)  # every rule is shown to fire at least once


def test_promtool_would_catch_a_wrong_expectation(tmp_path: Path) -> None:
    tool = promtool()
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "gpu", "rules": rules()}]}))
    test = {"interval": "1m", "input_series": [series("DCGM_FI_DEV_GPU_TEMP", "60x20")],
            "alert_rule_test": [{"eval_time": "10m", "alertname": "GpuTemperatureHigh",
                                 "exp_alerts": [{"exp_labels": {**GPU, "severity": "warning"}}]}]}  # fmt: skip
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": [test]}))
    result = subprocess.run([str(tool), "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, check=False)
    assert result.returncode != 0


def test_thresholds_come_from_the_spec() -> None:
    by_name = {r["alert"]: r for r in rules(temperatureWarningCelsius=80, temperatureCriticalCelsius=88,
                                              framebufferPercent=90, utilizationMinutes=60, criticalXids=[79])}  # fmt: skip
    assert by_name["GpuTemperatureHigh"]["expr"] == "DCGM_FI_DEV_GPU_TEMP > 80"
    assert by_name["GpuTemperatureCritical"]["expr"] == "DCGM_FI_DEV_GPU_TEMP > 88"
    assert by_name["GpuFramebufferNearlyFull"]["expr"].endswith("* 100 > 90")
    assert by_name["GpuUtilizationSustained"]["for"] == "60m"
    assert by_name["GpuXidCritical"]["expr"] == "DCGM_FI_DEV_XID_ERRORS == 79"
    no_critical = {r["alert"]: r for r in rules(criticalXids=[])}
    assert "GpuXidCritical" not in no_critical and no_critical["GpuXidError"]["expr"] == "DCGM_FI_DEV_XID_ERRORS > 0"


def test_the_monitoring_docs_list_every_alert_and_default_metric() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "monitoring.md").read_text()
    documented = set(re.findall(r"^\| `(Gpu\w+)` \|", docs, flags=re.MULTILINE))
    assert documented == set(ALL_ALERTS)
    assert all(f"`{metric}`" in docs for metric in DEFAULT_FIELDS)


# The labels a scrape of dcgm-exporter through the ServiceMonitor really gives a series. prometheus-operator sets
# namespace, pod, container, service and endpoint on every ServiceMonitor target (generateServiceMonitorConfig), the
# ServiceMonitor sets job and instance; with honorLabels Prometheus adds each of them to every series lacking it
# (prometheus scrape/scrape.go, mutateSampleLabels). dcgm-exporter itself sets namespace, pod and container only
# on the series of a GPU a pod uses (its Kubernetes mapping).
OPERATOR_NAMESPACE = "gpu-operator"
TARGET = {"job": EXPORTER_JOB, "instance": "gpu-a", "namespace": OPERATOR_NAMESPACE, "pod": "nvidia-dcgm-exporter-x7k2p",
          "container": "nvidia-dcgm-exporter", "service": "nvidia-dcgm-exporter", "endpoint": "gpu-metrics"}  # fmt: skip


def scraped(exporter: dict[str, str]) -> dict[str, str]:
    """A series' labels once scraped with honorLabels: the exporter's, then the target's where the exporter set none."""
    return {**TARGET, **exporter}


def usage_test(
    tmp_path: Path,
    gpus: list[tuple[dict[str, str], str, str]],
    expect: Mapping[str, Mapping[str, float]],
    rules: list[dict[str, Any]] | None = None,
) -> str:
    """promtool's verdict (empty: passed) on the recording rules (``rules``, or the stack's) fed ``gpus`` as
    (exporter labels, GPU_UTIL values, FB_USED values), scraped through the ServiceMonitor, expecting ``expect``:
    rule -> namespace -> value."""
    usage = prometheus_rule_spec(AlertsSpec(), exporter_nodes=NODES, row_remapping=True)["groups"][1]
    if rules is not None:
        usage = {**usage, "rules": rules}
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [usage]}))
    inputs = [series("up", "1x10", TARGET)]
    for labels, util, fb in gpus:
        inputs += [
            series("DCGM_FI_DEV_GPU_UTIL", util, scraped(labels)),
            series("DCGM_FI_DEV_FB_USED", fb, scraped(labels)),
        ]
    checks = [{"expr": name, "eval_time": "5m",
               "exp_samples": [{"labels": f'{name}{{namespace="{ns}"}}', "value": v} for ns, v in values.items()]}
              for name, values in expect.items()]  # fmt: skip
    test = {"interval": "1m", "input_series": inputs, "promql_expr_test": checks}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "tests": [test]}))
    result = subprocess.run(
        [str(promtool()), "test", "rules", "tests.yaml"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    return "" if result.returncode == 0 else result.stdout + result.stderr


GPU_A = {**GPU, "gpu": "0", "namespace": "team-a", "pod": "train-0", "container": "main"}
GPU_B = {**GPU, "gpu": "1", "namespace": "team-a", "pod": "train-1", "container": "main"}
IDLE = {**GPU, "gpu": "2"}


def test_usage_rules_sum_gpu_use_per_namespace_as_promtool_evaluates_them(tmp_path: Path) -> None:
    # Three GPUs: two used by pods of team-a, one idle, which the scrape labels with the exporter's own namespace
    # and pod: it counts nowhere, not in gpu-operator. The rules read only fields the alert rules already require.
    assert set(USAGE_FIELDS) <= set(ALERT_FIELDS)
    usage = prometheus_rule_spec(AlertsSpec(), exporter_nodes=NODES, row_remapping=True)["groups"][1]
    assert usage["name"] == USAGE_GROUP and usage["rules"] == usage_rules()
    for rule in usage["rules"]:
        assert promql_metrics(rule["expr"]) <= {*USAGE_FIELDS, "up"}, rule["record"]
    gpus = [(GPU_A, "60x10", "1000x10"), (GPU_B, "20x10", "3000x10"), (IDLE, "0x10", "0x10")]
    expect = {"namespace:nvidia_gpu_in_use:count": {"team-a": 2},
              "namespace:nvidia_gpu_utilization_percent:avg": {"team-a": 40},
              "namespace:nvidia_gpu_framebuffer_used_mib:sum": {"team-a": 4000}}  # fmt: skip
    assert usage_test(tmp_path, gpus, expect) == ""


def test_usage_rules_count_a_pod_in_the_exporters_own_namespace(tmp_path: Path) -> None:
    # A workload (the operator's validator, say) in the operator's namespace uses a GPU: a pod other than the
    # exporter's, so it counts there; the idle GPU beside it still does not.
    validator = {
        **GPU,
        "gpu": "1",
        "namespace": OPERATOR_NAMESPACE,
        "pod": "nvidia-cuda-validator-abc",
        "container": "c",
    }
    gpus = [(GPU_A, "60x10", "1000x10"), (validator, "10x10", "500x10"), (IDLE, "0x10", "0x10")]
    expect = {"namespace:nvidia_gpu_in_use:count": {"team-a": 1, OPERATOR_NAMESPACE: 1}}
    assert usage_test(tmp_path, gpus, expect) == ""


def test_usage_test_would_catch_rules_that_count_idle_gpus(tmp_path: Path) -> None:
    # The realistic input makes the test able to fail: selecting on a non-empty namespace (the earlier rules) counts
    # the idle GPU, as scraped, in the exporter's namespace, and promtool says so.
    gpus = [(GPU_A, "60x10", "1000x10"), (IDLE, "0x10", "0x10")]
    naive = [
        {
            "record": "namespace:nvidia_gpu_in_use:count",
            "expr": 'count by (namespace) (DCGM_FI_DEV_FB_USED{namespace!=""})',
        }
    ]
    verdict = usage_test(tmp_path, gpus, {"namespace:nvidia_gpu_in_use:count": {"team-a": 1}}, naive)
    assert f'namespace="{OPERATOR_NAMESPACE}"' in verdict, verdict
    assert usage_test(tmp_path, gpus, {"namespace:nvidia_gpu_in_use:count": {"team-a": 1}}) == ""
