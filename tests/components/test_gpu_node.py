"""GpuNodeLabels built directly from existing nodes (no Proxmox): labels from one GpuStack, taints, bad args."""

from __future__ import annotations

import pulumi_kubernetes as kubernetes
import pytest

from proxmox_gpu_cluster.core.nodes import ExistingGpuNode
from proxmox_gpu_cluster.core.operator_spec import GpuOperatorSpec
from proxmox_gpu_cluster.core.worker_spec import TimeSlicing
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.gpu.gpu_node import GpuNodeLabels
from proxmox_gpu_cluster.render.gpu_stack import GpuStack
from proxmox_gpu_cluster.testing import run

NODES = (
    ExistingGpuNode(name="bm-1", gpus={"A10": 2}, sharing="time-slicing", time_slicing=TimeSlicing(replicas=3)),
    ExistingGpuNode(name="bm-2", gpus={"A100-PCIE-40GB": 1}, sharing="mig", mig="all-1g.5gb", taint=True),
)


def stack(*nodes: ExistingGpuNode, operator: GpuOperatorSpec | None = None) -> GpuStack:
    return GpuStack(operator=operator or GpuOperatorSpec(), nodes=tuple(n.resolve() for n in nodes))


def test_labels_and_taints_of_existing_nodes() -> None:
    def program() -> None:
        GpuNodeLabels("labels", stack(*NODES), provider=kubernetes.Provider("k8s", kubeconfig="{}"))

    rec = run(program)
    patches = {r.name: r.plain_inputs for r in rec.of_type("kubernetes:core/v1:NodePatch")}
    assert set(patches) == {"labels-bm-1", "labels-bm-2"}
    one, two = patches["labels-bm-1"], patches["labels-bm-2"]
    assert one["metadata"]["labels"]["nvidia.com/device-plugin.config"].startswith("time-slicing-3-")
    assert two["metadata"]["labels"]["nvidia.com/mig.config"] == "all-1g.5gb"
    assert "spec" not in one and two["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
    ]
    assert rec.one("proxmox-gpu-cluster:gpu_node:GpuNodeLabels").outputs["labels"]["bm-1"] == one["metadata"]["labels"]


def test_a_node_listed_twice_or_sharing_without_the_operator_is_refused() -> None:
    def program() -> None:
        provider = kubernetes.Provider("k8s", kubeconfig="{}")
        GpuNodeLabels("labels", stack(NODES[0], NODES[0], operator=GpuOperatorSpec(enabled=False)), provider=provider)

    with pytest.raises(InvalidComponentArgs) as err:
        run(program)
    assert err.value.lines == [
        "labels.nodes: node bm-1 is listed 2 times",
        "labels.nodes: sharing needs the GPU Operator (enabled: false): bm-1, bm-1",
    ]


def test_existing_node_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="A10 does not support MIG"):
        ExistingGpuNode(name="bm-3", gpus={"A10": 1}, sharing="mig", mig="all-1g.5gb")
