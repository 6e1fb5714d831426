"""GpuPriorityClasses and priority-scoped GpuQuotas, built directly under the recording mock with minimal args."""

from __future__ import annotations

import kubernetes_validate
import pulumi
import pulumi_kubernetes as kubernetes
import pytest

from proxmox_gpu_cluster.core.capacity import WorkerCapacity
from proxmox_gpu_cluster.core.scheduling_spec import PriorityClassSpec, Quota
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.gpu.gpu_quota import GpuQuotas, GpuQuotasArgs
from proxmox_gpu_cluster.gpu.priority_classes import GpuPriorityClasses, GpuPriorityClassesArgs
from proxmox_gpu_cluster.testing import run
from tests.components.gpu_opts import check_opts

CLASS = "kubernetes:scheduling.k8s.io/v1:PriorityClass"
QUOTA = "kubernetes:core/v1:ResourceQuota"


CLASSES = (
    PriorityClassSpec(name="gpu-high", value=1_000_000, description="serving"),
    PriorityClassSpec(name="gpu-low", value=-5, preemption_policy="Never", global_default=True),
)
ROW = WorkerCapacity(
    worker="bm-1", node="", gpus={"A10": 1}, workload="container", sharing="none", resources={"nvidia.com/gpu": 1}
)
QUOTAS = (
    Quota(namespace="ml", resources={"nvidia.com/gpu": 2}),  # above the one GPU the node advertises: a warning
    Quota(namespace="ml", resources={"nvidia.com/gpu": 0}, priority_class="gpu-high"),
)


def program() -> None:
    k8s = pulumi.ResourceOptions(provider=kubernetes.Provider("k8s", kubeconfig="{}"))
    classes = GpuPriorityClasses("prio", GpuPriorityClassesArgs(classes=CLASSES), k8s)
    quotas = GpuQuotasArgs(quotas=QUOTAS, capacity=(ROW,), priority_classes=("gpu-high", "gpu-low"))
    GpuQuotas("quotas", quotas, pulumi.ResourceOptions.merge(k8s, pulumi.ResourceOptions(depends_on=[classes])))


def test_priority_classes_as_kubernetes_takes_them() -> None:
    rec = run(program)
    objects = {r.name: r.plain_inputs for r in rec.of_type(CLASS)}
    assert set(objects) == {"prio-gpu-high", "prio-gpu-low"}
    for obj in objects.values():
        kubernetes_validate.validate(obj, "1.34", strict=True)
    assert objects["prio-gpu-low"]["preemptionPolicy"] == "Never" and objects["prio-gpu-low"]["globalDefault"]
    assert objects["prio-gpu-low"]["value"] == -5
    assert objects["prio-gpu-high"]["description"] == "serving"
    assert "description" not in objects["prio-gpu-low"]  # empty description: left out, not ""


def test_scoped_quota_next_to_the_unscoped_one() -> None:
    rec = run(program)
    quotas = {r.name: r for r in rec.of_type(QUOTA)}
    assert set(quotas) == {"quotas-ml", "quotas-ml.gpu-high"}
    plain, scoped = quotas["quotas-ml"].plain_inputs, quotas["quotas-ml.gpu-high"].plain_inputs
    assert plain["metadata"]["name"] == "gpu-quota" and "scopeSelector" not in plain["spec"]
    assert scoped["metadata"]["name"] == "gpu-quota-gpu-high"
    assert scoped["spec"]["hard"] == {"requests.nvidia.com/gpu": "0"}
    for r in quotas.values():
        kubernetes_validate.validate(r.plain_inputs, "1.34", strict=True)
        assert all(rec.depends_on(r, c) for c in rec.of_type(CLASS))
    assert ("warning", "quotas[0] (ml): nvidia.com/gpu 2 exceeds the cluster's capacity of 1") in rec.logs


def test_opts_carry_the_provider_and_what_they_wait_for() -> None:
    classes = GpuPriorityClassesArgs(classes=CLASSES)
    check_opts(lambda opts: GpuPriorityClasses("prio", classes, opts), "prio", first=("prio-gpu-high", "prio-gpu-low"))
    quotas = GpuQuotasArgs(quotas=QUOTAS[:1], capacity=(ROW,))
    check_opts(lambda opts: GpuQuotas("quotas", quotas, opts), "quotas", first=("quotas-ml",))


MIG_ROW = WorkerCapacity(
    worker="bm-2", node="", gpus={"A100-PCIE-40GB": 1}, workload="container", sharing="mig",
    resources={"nvidia.com/mig-1g.5gb": 7},
)  # fmt: skip


@pytest.mark.parametrize(
    ("values", "lines"),
    [
        # A quota on a MIG profile nobody configured, and one scoped to a class that does not exist.
        ({"quotas": (Quota(namespace="ml", resources={"nvidia.com/mig-2g.10gb": 1}),
                     Quota(namespace="ml", resources={"nvidia.com/gpu": 1}, priority_class="gpu-hgih")),
          "capacity": (ROW, MIG_ROW), "priority_classes": ("gpu-high",)},
         ["GpuQuotasArgs.quotas[0].resources.nvidia.com/mig-2g.10gb: no worker advertises nvidia.com/mig-2g.10gb "
          "(advertised: nvidia.com/gpu, nvidia.com/mig-1g.5gb)",
          "GpuQuotasArgs.quotas[1].priority_class: gpu-hgih is not one of priority_classes (gpu-high)"]),
        # Two quotas for one namespace; a nested spec problem by field name.
        ({"quotas": (QUOTAS[0], QUOTAS[0]), "capacity": (ROW,)},
         ["GpuQuotasArgs.quotas[1].namespace: namespace 'ml' is already used by quotas[0]"]),
        ({"quotas": ({"namespace": "ml", "resources": {"requests.nvidia.com/gpu": 1}, "priority_class": "A"},),
          "capacity": (ROW,)},
         ["GpuQuotasArgs.quotas[0].priority_class: String should match pattern "
          "'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'"]),
        ({"quotas": (), "capacity": ()},
         ["GpuQuotasArgs.capacity: Tuple should have at least 1 item after validation, not 0",
          "GpuQuotasArgs.quotas: Tuple should have at least 1 item after validation, not 0"]),
    ],
)  # fmt: skip
def test_quotas_are_judged_against_what_the_nodes_advertise(values: dict[str, object], lines: list[str]) -> None:
    with pytest.raises(InvalidComponentArgs) as err:
        GpuQuotasArgs(**values)  # type: ignore[arg-type]
    assert err.value.lines == lines


def test_priority_classes_get_the_spec_rules() -> None:
    twice = (*CLASSES, CLASSES[1], {"name": "system-x", "value": 1})
    with pytest.raises(InvalidComponentArgs) as err:
        GpuPriorityClassesArgs(classes=twice)  # type: ignore[arg-type]
    assert err.value.lines == [
        "GpuPriorityClassesArgs.classes[3] (system-x).name: system-x: the system- prefix is reserved for Kubernetes"
    ]
    with pytest.raises(InvalidComponentArgs) as err:
        GpuPriorityClassesArgs(classes=(*CLASSES, CLASSES[1]))
    assert err.value.lines == [
        "GpuPriorityClassesArgs.classes[2] (gpu-low).global_default: classes[1] is already the default",
        "GpuPriorityClassesArgs.classes[2] (gpu-low).name: PriorityClass name 'gpu-low' is already used by classes[1]",
    ]
