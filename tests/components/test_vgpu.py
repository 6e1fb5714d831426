"""vm-vgpu against NVIDIA's vGPU support (components/core/vgpu.py): the guest's Ubuntu release named by its cloud
image, the GPU generation's framework on Ubuntu 24.04 (mdev vs the vendor-specific VFIO framework), the refusal
in validation and the kernel bound the verify step gets."""

from __future__ import annotations

from typing import Any

import pytest

from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.guest_spec import bootstrap_spec
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.core.vgpu import cloud_image_release, sriov, vgpu_path_problems
from tests.support import base_spec, make_vm_worker

JAMMY = "https://cloud-images.ubuntu.com/jammy/current/jammy-server-cloudimg-amd64.img"
NOBLE = "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"


@pytest.mark.parametrize(
    ("url", "release"),
    [
        (JAMMY, "22.04"),
        (NOBLE, "24.04"),
        ("https://cloud-images.ubuntu.com/releases/22.04/release/ubuntu-22.04-server-cloudimg-amd64.img", "22.04"),
        ("https://mirror.example.test/ubuntu-24.04.3-server-cloudimg-amd64.img", "24.04"),
        ("https://mirror.example.test/golden/worker.qcow2", None),  # names no release
        ("https://mirror.example.test/jammy-to-noble/noble.img", None),  # names both: unknown, not a guess
        ("https://mirror.example.test/v122.04/img.qcow2", None),  # not a release number
        ("https://ignoble.example.test/worker.img", None),  # not a code name
        (None, None),  # a template clone
    ],
)
def test_cloud_image_release(url: str | None, release: str | None) -> None:
    assert cloud_image_release(url) == release


def test_sriov_follows_the_architecture() -> None:
    # Ampere (GA), Hopper (GH) and Ada (AD) have SR-IOV; Turing (TU) has not. Every catalog model is one of these,
    # so a new architecture is a deliberate decision here.
    assert {m.pci_name[:2] for m in CATALOG.values()} == {"GA", "GH", "AD", "TU"}
    assert [k for k, m in CATALOG.items() if not sriov(m)] == ["T4"]


def test_only_ubuntu_24_04_is_refused() -> None:
    models = list(CATALOG.values())
    assert vgpu_path_problems("22.04", models) == []
    assert vgpu_path_problems(None, models) == []  # unknown: the verify step checks the running kernel
    problems = vgpu_path_problems("24.04", models)
    assert len(problems) == len(CATALOG)  # one reason per model, naming it
    assert all(p.startswith("vm-vgpu on Ubuntu 24.04 (kernel 6.8 or later): ") for p in problems)
    assert all("NVIDIA GPU Operator platform support" in p for p in problems)


def vgpu_worker(url: str | None, vgpu_type: str = "A10-24Q") -> dict[str, Any]:
    raw = make_vm_worker(base_spec(), 2, "vm-vgpu", vgpu_type)
    raw["workers"][2]["image"] = {"cloudImageUrl": url} if url else {"templateVmid": 9000}
    return raw


def problems_of(raw: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as err:
        load_spec(raw)
    return str(err.value)


def test_vm_vgpu_on_a_noble_image_is_refused_naming_the_path_model_reason_and_source() -> None:
    message = problems_of(vgpu_worker(NOBLE))
    assert (
        "cluster.workers[2].image.cloudImageUrl: vm-vgpu on Ubuntu 24.04 (kernel 6.8 or later): the vGPU Manager "
        "(vGPU 17+) serves the A10 (SR-IOV) through the vendor-specific VFIO framework there: its vGPUs are SR-IOV "
        "virtual functions, not mediated devices, and the GPU Operator's vGPU Device Manager, validator and sandbox "
        "device plugin handle mediated devices only; use an Ubuntu 22.04 image with its 5.15 kernel (NVIDIA GPU "
        "Operator platform support: KubeVirt with vGPU on Ubuntu 22.04, kernel < 6.0)"
    ) in message


def test_the_turing_reason_is_the_kernel_bound_not_vfio() -> None:
    t4 = vgpu_path_problems("24.04", [CATALOG["T4"]])
    assert t4 == [
        "vm-vgpu on Ubuntu 24.04 (kernel 6.8 or later): NVIDIA supports the T4 (mediated devices, no SR-IOV) for "
        "KubeVirt vGPU below kernel 6.0; use an Ubuntu 22.04 image with its 5.15 kernel (NVIDIA GPU Operator "
        "platform support: KubeVirt with vGPU on Ubuntu 22.04, kernel < 6.0)"
    ]


@pytest.mark.parametrize("url", [JAMMY, "https://mirror.example.test/golden/worker.qcow2", None])
def test_vm_vgpu_on_jammy_or_an_unnamed_image_plans_with_the_kernel_bound(url: str | None) -> None:
    spec = load_spec(vgpu_worker(url))
    worker = spec.workers[2]
    assert bootstrap_spec(spec, worker).kernel_below == "6.0"


@pytest.mark.parametrize("workload", ["vm-passthrough", "container"])
def test_other_workloads_on_noble_are_not_refused_and_get_no_kernel_bound(workload: str) -> None:
    # GPU passthrough with KubeVirt is supported on Ubuntu 24.04 (GPU Operator 26.3.0 release notes).
    raw = make_vm_worker(base_spec(), 2, workload) if workload != "container" else base_spec()
    raw["workers"][2]["image"] = {"cloudImageUrl": NOBLE}
    spec = load_spec(raw)
    assert bootstrap_spec(spec, spec.workers[2]).kernel_below is None


def test_bare_metal_vgpu_nodes_are_not_judged() -> None:
    # kubevirt.nodes entries are existing machines whose OS the spec does not know: nothing is refused on a guess.
    raw = make_vm_worker(base_spec(), 2, "vm-passthrough")
    raw["kubevirt"]["nodes"] = [{"name": "bm-1", "workload": "vm-vgpu", "gpus": {"L40S": 1}, "vgpuType": "L40S-24Q"}]
    raw["kubevirt"]["vgpuManager"] = {"repository": "registry.example.test/nvidia", "version": "580.95.02"}
    load_spec(raw)
