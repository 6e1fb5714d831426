"""GPU quotas: requests.-only keys, one ResourceQuota per namespace, a warning above cluster capacity."""

from __future__ import annotations

import kubernetes_validate
import pytest

from proxmox_gpu_cluster.core.capacity import quota_hard, quota_warnings
from proxmox_gpu_cluster.core.spec import load_spec
from tests.support import base_spec, plan_stack


def test_quota_hard_uses_requests_prefix_only() -> None:
    assert quota_hard({"nvidia.com/mig-1g.5gb": 2, "nvidia.com/gpu": 4}) == {
        "requests.nvidia.com/gpu": "4",
        "requests.nvidia.com/mig-1g.5gb": "2",
    }


def test_warning_when_quota_exceeds_capacity() -> None:
    assert quota_warnings(load_spec(base_spec())) == []
    raw = base_spec()
    raw["quotas"][0]["resources"]["nvidia.com/gpu"] = 9
    assert quota_warnings(load_spec(raw)) == [
        "quotas[0] (team-a): nvidia.com/gpu 9 exceeds the cluster's capacity of 8"
    ]


@pytest.mark.parametrize("version", ["1.33", "1.34"])
def test_resource_quota_under_mocks(version: str) -> None:
    raw = base_spec()
    raw["quotas"][0]["resources"]["nvidia.com/gpu"] = 9
    rec = plan_stack(raw)
    quota = rec.one("kubernetes:core/v1:ResourceQuota")
    assert quota.name == "cluster-gpu-quotas-team-a"
    assert quota.parent == rec.one("proxmox-gpu-cluster:gpu_quota:GpuQuotas").urn
    assert quota.plain_inputs["metadata"] == {"name": "gpu-quota", "namespace": "team-a"}
    assert quota.plain_inputs["spec"]["hard"] == {"requests.nvidia.com/gpu": "9", "requests.nvidia.com/mig-1g.5gb": "2"}
    kubernetes_validate.validate(quota.plain_inputs, version, strict=True)
    assert ("warning", "quotas[0] (team-a): nvidia.com/gpu 9 exceeds the cluster's capacity of 8") in rec.logs
