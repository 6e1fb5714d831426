"""GpuMonitoringArgs: the exporter's targets come from the given nodes, and a node the exporter never runs on (a
typo, a VM-workload node) is refused instead of leaving an alert that fires forever."""

from __future__ import annotations

import pulumi
import pytest

from proxmox_gpu_cluster.core.monitoring_spec import MonitoringSpec
from proxmox_gpu_cluster.core.nodes import ExistingGpuNode
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.gpu.gpu_monitoring import GpuMonitoring, GpuMonitoringArgs
from tests.components.gpu_opts import check_opts

NODES = (
    ExistingGpuNode(name="bm-1", gpus={"T4": 2}).resolve(),
    ExistingGpuNode(name="bm-2", gpus={"A30": 1}, sharing="mig", mig="all-1g.6gb").resolve(),
    ExistingGpuNode(name="bm-3", gpus={"L40S": 1}, workload="vm-passthrough").resolve(),
)
PROMETHEUS = MonitoringSpec(prometheus=True)


def rule_exprs(rec_inputs: dict[str, object]) -> str:
    return str(rec_inputs["spec"])


def test_targets_come_from_the_nodes() -> None:
    args = GpuMonitoringArgs(monitoring=PROMETHEUS, operator_namespace="gpu-operator", nodes=NODES)
    assert args.targets.exporter_nodes == ("bm-1", "bm-2")  # a vm-passthrough node runs no exporter
    assert args.targets.row_remapping and args.targets.mig
    t4_only = GpuMonitoringArgs(operator_namespace="gpu-operator", nodes=NODES[:1])
    assert not t4_only.targets.row_remapping and not t4_only.targets.mig  # T4 remaps no rows, has no MIG
    nothing = GpuMonitoringArgs(operator_namespace="gpu-operator")
    assert nothing.targets.exporter_nodes == () and nothing.targets.row_remapping  # every alert without nodes
    chosen = GpuMonitoringArgs(operator_namespace="gpu-operator", nodes=NODES, exporter_nodes=("bm-2",))
    assert chosen.targets.exporter_nodes == ("bm-2",)


def test_the_alert_names_the_exporter_nodes_and_opts_reach_the_children() -> None:
    args = GpuMonitoringArgs(
        monitoring=PROMETHEUS, operator_namespace=pulumi.Output.from_input("gpu-operator"), nodes=NODES
    )
    rec = check_opts(lambda opts: GpuMonitoring("mon", args, opts), "mon", first=("mon-service-monitor", "mon-alerts"))
    rule = rule_exprs(rec.named("mon-alerts").plain_inputs)
    assert 'instance="bm-1"' in rule and 'instance="bm-2"' in rule and "bm-3" not in rule


@pytest.mark.parametrize(
    ("values", "lines"),
    [
        ({"nodes": NODES, "exporter_nodes": ("bm-1", "bm-11", "bm-3")},
         ["GpuMonitoringArgs.exporter_nodes[1]: bm-11 is not a container node of nodes (bm-1, bm-2): it never runs "
          "the exporter, so its alert would fire forever",
          "GpuMonitoringArgs.exporter_nodes[2]: bm-3 is not a container node of nodes (bm-1, bm-2): it never runs "
          "the exporter, so its alert would fire forever"]),
        ({"exporter_nodes": ("bm-1",)},
         ["GpuMonitoringArgs.exporter_nodes[0]: bm-1 is not a container node of nodes (none): it never runs the "
          "exporter, so its alert would fire forever"]),
        ({"nodes": (NODES[0], NODES[0])},
         ["GpuMonitoringArgs.nodes[1] (bm-1).name: node name 'bm-1' is already used by nodes[0]"]),
        ({"operator_namespace": 5, "monitoring": {"prometheus": "maybe"}},
         ["GpuMonitoringArgs.monitoring.prometheus: Input should be a valid boolean, unable to interpret input",
          "GpuMonitoringArgs.operator_namespace: Input should be a valid string"]),
    ],
)  # fmt: skip
def test_bad_args_are_lines(values: dict[str, object], lines: list[str]) -> None:
    with pytest.raises(InvalidComponentArgs) as err:
        GpuMonitoringArgs(**{"operator_namespace": "gpu-operator", **values})  # type: ignore[arg-type]
    assert err.value.lines == lines
