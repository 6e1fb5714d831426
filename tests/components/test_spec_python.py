"""Spec and args models built from Python take field names (what mypy and pyright see), while stack files stay
camelCase only (a snake_case key there is an unknown key, as before)."""

from __future__ import annotations

import pytest

from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.guest_spec import ExpectedGpu, GuestBootstrapSpec
from proxmox_gpu_cluster.core.monitoring_spec import AlertsSpec
from proxmox_gpu_cluster.core.spec import load_spec
from tests.support import base_spec


def test_field_names_work_at_run_time() -> None:
    spec = GuestBootstrapSpec(
        node_name="gpu-1",
        gpus=(ExpectedGpu(vendor_device="10de:2236", product="NVIDIA-A10"),),
        driver_mode="host",
        driver_branch="580",
        kernel_modules="open",
        toolkit=True,
        api_endpoint="k8s.example.test:6443",
        kubernetes_minor=34,
    )
    assert spec.node_name == "gpu-1" and spec.gpus[0].vendor_device == "10de:2236"
    assert AlertsSpec(temperature_warning_celsius=70).temperature_warning_celsius == 70


def test_stack_files_still_refuse_snake_case_keys() -> None:
    raw = base_spec()
    raw["gpuOperator"]["driver_branch"] = "580"
    with pytest.raises(SpecError) as err:
        load_spec(raw)
    assert any(line.startswith("cluster.gpuOperator.driver_branch: ") for line in err.value.lines)


def _worker(**values: object) -> object:
    from proxmox_gpu_cluster.core.worker_spec import Worker

    base: dict[str, object] = {"name": "w", "vmid": 201, "node": "pve2", "gpus": ("a10-0",)}
    return Worker(**{**base, **values})  # type: ignore[arg-type]


def test_a_model_built_from_python_reports_every_problem_by_field_name() -> None:
    with pytest.raises(SpecError) as err:
        _worker(memory_mib=-1, disk_gib="big", memry=1)
    assert err.value.lines == [
        "Worker (w).disk_gib: Input should be a valid integer, unable to parse string as an integer",
        "Worker (w).memory_mib: Input should be greater than or equal to 2048",
        "Worker (w).memry: unknown field (check the spelling)",
    ]
    assert isinstance(err.value, ValueError)  # a model built inside another model's validator reports through it
    assert err.value.__cause__ is None and err.value.__suppress_context__  # no pydantic traceback chained


def test_nested_problems_reach_the_outermost_model_with_their_path() -> None:
    from proxmox_gpu_cluster.core.nodes import ExistingGpuNode
    from proxmox_gpu_cluster.core.spec import ClusterSpec

    with pytest.raises(SpecError) as err:
        ClusterSpec(workers=({"name": "w", "memoryMiB": 3, "time_slicing": {"replicas": 1}},))  # type: ignore[arg-type,call-arg]
    assert "ClusterSpec.workers[0] (w).memory_mib: Input should be greater than or equal to 2048" in err.value.lines
    assert (
        "ClusterSpec.workers[0] (w).time_slicing.replicas: Input should be greater than or equal to 2"
        in err.value.lines
    )
    assert "ClusterSpec.proxmox: required field is missing" in err.value.lines
    # A cross-field rule's path (written as the stack file spells it) comes out in field names too.
    with pytest.raises(SpecError) as err:
        ExistingGpuNode(name="bm-1", gpus={"A10": 1}, sharing="time-slicing", vgpu_type="A10-24Q")
    assert err.value.lines == [
        "ExistingGpuNode (bm-1).time_slicing: sharing time-slicing needs timeSlicing.replicas",
        "ExistingGpuNode (bm-1).vgpu_type: set exactly when workload is vm-vgpu",
    ]


def test_load_spec_keeps_its_stack_file_paths() -> None:
    raw = base_spec()
    raw["workers"][0]["memoryMiB"] = 1
    with pytest.raises(SpecError) as err:
        load_spec(raw)
    assert "cluster.workers[0].memoryMiB: Input should be greater than or equal to 2048" in err.value.lines


PROGRAM = """
import sys
{setup}
from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.worker_spec import TimeSlicing
errors = []
for _ in range(2):
    try:
        TimeSlicing(replicas=1)
    except SpecError as err:
        errors.append(err)
print(type(errors[0]).__name__, [c.__module__ + "." + c.__name__ for c in type(errors[0]).__mro__])
print(type(errors[0]) is type(errors[1]), "pulumi" in sys.modules, errors[0].lines)
"""


@pytest.mark.parametrize("under_pulumi", [False, True])
def test_the_error_is_a_pulumi_run_error_only_under_pulumi(under_pulumi: bool) -> None:
    """The pure layer never imports Pulumi; the language host has always imported it before the program."""
    import subprocess
    import sys

    setup = "import pulumi.errors" if under_pulumi else ""
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(setup=setup)], capture_output=True, text=True, check=True, timeout=120
    )
    kind, same = done.stdout.splitlines()
    assert ("pulumi.errors.RunError" in kind) is under_pulumi, kind
    assert "proxmox_gpu_cluster.core.errors.SpecError" in kind
    assert same == f"True {under_pulumi} ['TimeSlicing.replicas: Input should be greater than or equal to 2']"
