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
