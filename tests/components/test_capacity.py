"""What each node advertises, for every sharing mode and workload."""

from __future__ import annotations

from typing import Any

import pytest

from proxmox_gpu_cluster.core.capacity import capacity_table, cluster_capacity, worker_capacity
from proxmox_gpu_cluster.core.spec import load_spec
from tests.support import VGPU_MANAGER, base_spec


def one_worker(gpu_model: str, count: int = 1, strategy: str = "mixed", **worker: Any) -> dict[str, int]:
    spec = base_spec()
    spec["proxmox"]["nodes"] = [
        {
            "name": "pve1",
            "sshAddress": "192.0.2.11",
            "cpuVendor": "intel",
            "gpus": [{"name": f"g{i}", "pciPath": f"0000:{0x41 + i:02x}:00", "model": gpu_model} for i in range(count)],
        }
    ]
    spec["workers"] = [{"name": "w", "vmid": 100, "node": "pve1", "gpus": [f"g{i}" for i in range(count)], **worker}]
    spec["gpuOperator"]["migStrategy"] = strategy
    spec["quotas"] = []
    if worker.get("workload", "container") != "container":
        spec["kubevirt"] = (
            {"enabled": True, "vgpuManager": VGPU_MANAGER} if worker.get("vgpuType") else {"enabled": True}
        )
    parsed = load_spec(spec)
    return worker_capacity(parsed, parsed.workers[0]).resources


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        (("A10",), {"sharing": "time-slicing", "timeSlicing": {"replicas": 4}}, {"nvidia.com/gpu": 4}),
        (("A10", 2), {"sharing": "time-slicing", "timeSlicing": {"replicas": 3}}, {"nvidia.com/gpu": 6}),
        (("A10",), {"sharing": "time-slicing", "timeSlicing": {"replicas": 4, "renameByDefault": True}},
         {"nvidia.com/gpu.shared": 4}),
        (("A100-PCIE-40GB",), {"sharing": "mig", "mig": "all-1g.5gb"}, {"nvidia.com/mig-1g.5gb": 7}),
        (("A100-PCIE-40GB", 1, "single"), {"sharing": "mig", "mig": "all-1g.5gb"}, {"nvidia.com/gpu": 7}),
        (("A100-PCIE-40GB",), {"sharing": "mig", "mig": "all-balanced"},
         {"nvidia.com/mig-1g.5gb": 2, "nvidia.com/mig-2g.10gb": 1, "nvidia.com/mig-3g.20gb": 1}),
        (("A100-PCIE-40GB",), {"sharing": "mig", "mig": "all-disabled"}, {"nvidia.com/gpu": 1}),
        (("A100-PCIE-40GB",), {"sharing": "mig", "mig": "all-1g.5gb.me"}, {"nvidia.com/mig-1g.5gb.me": 1}),
        (("A100-PCIE-40GB",), {"sharing": "mig", "mig": "all-3g.20gb", "timeSlicing": {"replicas": 2}},
         {"nvidia.com/mig-3g.20gb": 4}),
        (("A100-PCIE-40GB",), {"workload": "vm-passthrough"}, {"nvidia.com/GA100_A100_PCIE_40GB": 1}),
        (("A10", 2), {"workload": "vm-passthrough"}, {"nvidia.com/GA102GL_A10": 2}),
        (("A10",), {"workload": "vm-vgpu", "vgpuType": "A10-4Q"}, {"nvidia.com/NVIDIA_A10-4Q": 6}),
        (("H100-PCIE",), {}, {"nvidia.com/gpu": 1}),
    ],
)  # fmt: skip
def test_worker_capacity(args: tuple[Any, ...], kwargs: dict[str, Any], expected: dict[str, int]) -> None:
    assert one_worker(*args, **kwargs) == expected


def test_table_and_totals_for_the_base_spec() -> None:
    spec = load_spec(base_spec())
    rows = capacity_table(spec)
    assert [(r.worker, r.node, r.gpus, r.sharing) for r in rows] == [
        ("mig-1", "pve1", {"A100-PCIE-40GB": 1}, "mig"),
        ("mig-2", "pve1", {"A100-PCIE-40GB": 1}, "mig"),
        ("ts-1", "pve2", {"A10": 2}, "time-slicing"),
    ]
    assert rows[1].resources == {"nvidia.com/mig-1g.5gb": 2, "nvidia.com/mig-2g.10gb": 1, "nvidia.com/mig-3g.20gb": 1}
    assert cluster_capacity(spec) == {
        "nvidia.com/gpu": 8,
        "nvidia.com/mig-1g.5gb": 9,
        "nvidia.com/mig-2g.10gb": 1,
        "nvidia.com/mig-3g.20gb": 1,
    }
