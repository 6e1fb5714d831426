"""GpuPriorityClasses and priority-scoped GpuQuotas, built directly under the recording mock with minimal args."""

from __future__ import annotations

import kubernetes_validate
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.core.scheduling_spec import PriorityClassSpec, Quota
from proxmox_gpu_cluster.gpu.gpu_quota import GpuQuotas
from proxmox_gpu_cluster.gpu.priority_classes import GpuPriorityClasses
from proxmox_gpu_cluster.testing import run

CLASS = "kubernetes:scheduling.k8s.io/v1:PriorityClass"
QUOTA = "kubernetes:core/v1:ResourceQuota"


def program() -> None:
    provider = kubernetes.Provider("k8s", kubeconfig="{}")
    classes = GpuPriorityClasses(
        "prio",
        [
            PriorityClassSpec(name="gpu-high", value=1_000_000, description="serving"),
            PriorityClassSpec(name="gpu-low", value=-5, preemptionPolicy="Never", globalDefault=True),
        ],
        provider=provider,
    )
    GpuQuotas(
        "quotas",
        [
            Quota(namespace="ml", resources={"nvidia.com/gpu": 2}),
            Quota(namespace="ml", resources={"nvidia.com/gpu": 0}, priorityClass="gpu-high"),
        ],
        provider=provider,
        warnings=["quota above capacity"],
        depends_on=[classes],
    )


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
    assert ("warning", "quota above capacity") in rec.logs
