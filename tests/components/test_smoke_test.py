"""GpuSmokeTest: which resource it requests, how it runs, and that it waits for the operator release."""

from __future__ import annotations

from typing import Any

from proxmox_gpu_cluster.core.capacity import smoke_test_resource
from proxmox_gpu_cluster.core.spec import load_spec
from tests.support import base_spec, make_vm_worker, plan_stack

JOB = "kubernetes:batch/v1:Job"


def smoke(raw: dict[str, Any]) -> dict[str, Any]:
    raw["gpuOperator"]["smokeTest"] = {"enabled": True, "timeoutSeconds": 300}
    return raw


def test_opt_in() -> None:
    assert plan_stack(base_spec()).of_type(JOB) == []


def test_job_runs_nvidia_smi_on_one_gpu_and_tolerates_the_taint() -> None:
    rec = plan_stack(smoke(base_spec()))
    job = rec.one(JOB)
    assert job.name == "cluster-gpu-smoke-test-job"
    assert rec.by_urn(job.parent).type == "proxmox-gpu-cluster:smoke_test:GpuSmokeTest"
    inputs = job.plain_inputs
    assert inputs["metadata"]["namespace"] == "gpu-operator"
    assert inputs["metadata"]["annotations"] == {"pulumi.com/replaceUnready": "true"}
    assert inputs["spec"]["activeDeadlineSeconds"] == 300
    pod = inputs["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia" and pod["restartPolicy"] == "Never"
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    (container,) = pod["containers"]
    assert container["command"] == ["nvidia-smi"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert job.custom_timeouts == {"create": "360s"}


def test_job_waits_for_the_release_and_nothing_waits_for_the_job() -> None:
    rec = plan_stack(smoke(base_spec()))
    job = rec.one(JOB)
    release = rec.named("cluster-gpu-operator-release")
    assert rec.depends_on(job, release)
    assert not any(rec.depends_on(r, job) for r in rec.resources if r is not job and r.custom)


def test_resource_choice() -> None:
    # whole GPUs (time-sliced A10s advertise nvidia.com/gpu) win
    assert smoke_test_resource(load_spec(base_spec())) == "nvidia.com/gpu"
    # renamed time-slicing: the .shared resource
    raw = base_spec()
    raw["workers"][2]["timeSlicing"]["renameByDefault"] = True
    raw["quotas"] = []
    assert smoke_test_resource(load_spec(raw)) == "nvidia.com/gpu.shared"
    # only MIG: the profile with the most instances (7 x 1g.5gb on mig-1, 2 on mig-2)
    raw = base_spec()
    raw["workers"].pop()
    raw["quotas"] = []
    assert smoke_test_resource(load_spec(raw)) == "nvidia.com/mig-1g.5gb"
    rec = plan_stack(smoke(raw))
    limits = rec.one(JOB).plain_inputs["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-1g.5gb": "1"}


def test_kubevirt_and_dra_nodes_do_not_count() -> None:
    raw = base_spec()
    raw["quotas"] = []
    raw["workers"][0]["dra"] = True
    raw["workers"][1]["dra"] = True
    make_vm_worker(raw, 2, "vm-passthrough")
    assert smoke_test_resource(load_spec(raw)) is None
