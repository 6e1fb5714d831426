"""GpuNodeLabels built directly from existing nodes (no Proxmox): labels from one GpuStack, taints, the opts
contract, and every problem of a stack built by hand at once, each naming its node (GpuStack.problems)."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as kubernetes
import pytest

from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.nodes import ExistingGpuNode, GpuNode, NodeGpu
from proxmox_gpu_cluster.core.operator_spec import GpuOperatorSpec
from proxmox_gpu_cluster.core.worker_spec import TimeSlicing
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.gpu.gpu_node import GpuNodeLabels, GpuNodeLabelsArgs
from proxmox_gpu_cluster.render.gpu_stack import GpuStack
from proxmox_gpu_cluster.testing import run
from tests.components.gpu_opts import check_opts

NODES = (
    ExistingGpuNode(name="bm-1", gpus={"A10": 2}, sharing="time-slicing", time_slicing=TimeSlicing(replicas=3)),
    ExistingGpuNode(name="bm-2", gpus={"A100-PCIE-40GB": 1}, sharing="mig", mig="all-1g.5gb", taint=True),
)


def stack(*nodes: ExistingGpuNode, operator: GpuOperatorSpec | None = None) -> GpuStack:
    return GpuStack(operator=operator or GpuOperatorSpec(), nodes=tuple(n.resolve() for n in nodes))


def test_labels_and_taints_of_existing_nodes() -> None:
    def program() -> None:
        k8s = kubernetes.Provider("k8s", kubeconfig="{}")
        GpuNodeLabels("labels", GpuNodeLabelsArgs(stack=stack(*NODES)), pulumi.ResourceOptions(provider=k8s))

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


def test_opts_carry_the_provider_and_what_every_patch_waits_for() -> None:
    args = GpuNodeLabelsArgs(stack=stack(*NODES))
    check_opts(lambda opts: GpuNodeLabels("labels", args, opts), "labels", first=("labels-bm-1", "labels-bm-2"))


def hand_built(name: str, *gpus: NodeGpu, **fields: object) -> GpuNode:
    return GpuNode(name, gpus, **fields)  # type: ignore[arg-type]


A10 = NodeGpu(0, CATALOG["A10"], None)


@pytest.mark.parametrize(
    ("nodes", "operator", "lines"),
    [
        # Listed twice, and sharing without the operator: each line names its node.
        ((NODES[0].resolve(), NODES[0].resolve()), GpuOperatorSpec(enabled=False),
         ["GpuStack.nodes[1].name: node name 'bm-1' is already used by nodes[0]"]),
        ((NODES[0].resolve(),), GpuOperatorSpec(enabled=False),
         ["GpuStack.nodes[0].sharing: bm-1: sharing time-slicing needs the GPU Operator "
          "(operator.enabled is false)"]),
        # A forgotten .resolve(): a line, not a TypeError from dataclasses.replace.
        ((NODES[0],), GpuOperatorSpec(),
         ["GpuStack.nodes[0]: bm-1: an ExistingGpuNode; pass ExistingGpuNode(...).resolve(), the "
          "node as the stack sees it"]),
        # A model key where the catalog entry belongs: a line naming the known models, not a KeyError.
        ((hand_built("bm-3", NodeGpu(0, "A100-80GB", None)),), GpuOperatorSpec(),  # type: ignore[arg-type]
         ["GpuStack.nodes[0].gpus[0].model: bm-3: expected a catalog entry (catalog.CATALOG[key]; "
          f"known: {', '.join(CATALOG)}), got 'A100-80GB'"]),
        # The rules an ExistingGpuNode gets hold for a GpuNode built by hand.
        ((hand_built("bm-4", NodeGpu(0, CATALOG["A10"], "all-1g.5gb"), sharing="mig"),
          hand_built("bm-5", A10, sharing="time-slicing"),
          hand_built("Bad_Name", A10, workload="vm-vgpu"),
          hand_built("bm-7", A10, A10)), GpuOperatorSpec(),
         ["GpuStack.nodes[0].gpus[0].mig_config: bm-4: A10 does not support MIG",
          "GpuStack.nodes[1].time_slicing: bm-5: sharing time-slicing needs timeSlicing.replicas",
          "GpuStack.nodes[2].name: Bad_Name: expected a Kubernetes node name (a lower-case DNS "
          "label), got 'Bad_Name'",
          "GpuStack.nodes[3].gpus[1].index: bm-7: expected 1 (the GPU's position on the node), got 0"]),
        # Values of the wrong type, where pydantic would have refused them in an ExistingGpuNode.
        ((hand_built("bm-8", NodeGpu(0, CATALOG["A30"], {"1g.6gb": True}), sharing="mig", taint=1),),
         GpuOperatorSpec(),
         ["GpuStack.nodes[0].gpus[0].mig_config: bm-8: expected a MIG config name or a {profile: count} geometry",
          "GpuStack.nodes[0].taint: bm-8: expected True or False"]),
        # The driver branch against the GPU models of the nodes.
        ((ExistingGpuNode(name="bm-6", gpus={"H200": 1}).resolve(),), GpuOperatorSpec(driver_branch="535"),
         ["GpuStack.operator.driver_branch: branch 535 does not support H200 (nodes[0] bm-6); it "
          "needs branch 550 or later"]),
    ],
)  # fmt: skip
def test_every_problem_of_a_stack_at_once_naming_its_node(
    nodes: tuple[GpuNode, ...], operator: GpuOperatorSpec, lines: list[str]
) -> None:
    """Refused where the stack is built, so its labels, values and capacity never meet a bad node."""
    with pytest.raises(SpecError) as err:
        GpuStack(operator=operator, nodes=nodes)
    assert err.value.lines == lines
    assert isinstance(err.value, pulumi.RunError)  # Pulumi is loaded here, as under `pulumi up`


def test_args_check_the_stack_they_are_given() -> None:
    """A stack that slipped past its own check (altered after construction) is refused by the args too."""
    bad = stack(NODES[0])
    object.__setattr__(bad, "nodes", (NODES[0],))
    with pytest.raises(InvalidComponentArgs) as err:
        GpuNodeLabelsArgs(stack=bad)
    assert err.value.lines == [
        "GpuNodeLabelsArgs.stack.nodes[0] (bm-1): bm-1: an ExistingGpuNode; pass ExistingGpuNode(...).resolve(), the node "
        "as the stack sees it"
    ]


def test_per_node_ordering_names_nodes_of_the_stack() -> None:
    def program() -> None:
        join = pulumi.CustomResource("test:index:Join", "join", {})
        with pytest.raises(InvalidComponentArgs) as err:
            GpuNodeLabelsArgs(stack=stack(*NODES), node_ready={"bm-9": [join]}, replace_with={"bm-1": [join]})
        assert err.value.lines == ["GpuNodeLabelsArgs.node_ready.bm-9: not a node of the stack (bm-1, bm-2)"]

    run(program)


def test_existing_node_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"ExistingGpuNode \(bm-3\)\.mig: A10 does not support MIG"):
        ExistingGpuNode(name="bm-3", gpus={"A10": 1}, sharing="mig", mig="all-1g.5gb")
