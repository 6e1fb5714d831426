"""Where the GPU Operator's KubeVirt vGPU path (``workload: vm-vgpu``) works: the node's kernel and the GPU
generation against NVIDIA's vGPU support. Pure data and functions; ``validation_kubevirt`` refuses with them, the
guest verify step checks the running kernel with ``MDEV_KERNEL_BELOW``.

Facts and their sources (files read at the named commits; docs.nvidia.com itself is not reachable here):

- The GPU Operator's vGPU path is mediated devices (mdev) from end to end. The vGPU Device Manager creates mdev
  devices through go-nvlib's ``nvmdev`` (``/sys/class/mdev_bus``; NVIDIA/vgpu-device-manager v0.5.0, acb7270, has
  no other backend), the sandbox validator waits for vGPU devices with ``nvmdev.GetAllDevices``
  (NVIDIA/gpu-operator ``cmd/nvidia-validator/main.go``, a22dbf6), the sandbox device plugin lists vGPUs under
  ``/sys/bus/mdev/devices`` (NVIDIA/kubevirt-gpu-device-plugin ``pkg/device_plugin/device_plugin.go``, d26f237),
  and the KubeVirt CR permits them as ``mediatedDevices`` by ``mdevNameSelector``
  (NVIDIA/cloud-native-docs ``gpu-operator/gpu-operator-kubevirt.rst``, 52dcb7b).
- NVIDIA supports KubeVirt with vGPU on Ubuntu 22.04 only (KubeVirt 0.59.1+; Ubuntu 24.04 and 26.04 have GPU
  passthrough only) and notes "KubeVirt with NVIDIA vGPU is supported on nodes with Linux kernel < 6.0, such as
  Ubuntu 22.04 LTS" (cloud-native-docs ``gpu-operator/platform-support.rst``, "Support for KubeVirt and OpenShift
  Virtualization", 52dcb7b, GPU Operator 26.7.0; release notes 25.3.4: "VM with time-slice vGPU (Ubuntu 22.04
  only)").
- GPUs of the Ampere architecture and later have SR-IOV (``gpu-operator-kubevirt.rst``: "SR-IOV must be enabled
  in the BIOS if your GPUs are based on the NVIDIA Ampere architecture or later"). On them, the vGPU Manager of
  vGPU 17 and later on kernel 6.8 (Ubuntu 24.04, the 22.04 HWE kernel) uses NVIDIA's "vendor-specific VFIO
  framework": a vGPU is an SR-IOV virtual function that stays bound to ``nvidia`` with a type id written to
  ``nvidia/current_vgpu_type``; there is no mdev bus ("A vendor-specific VFIO framework does not support the
  mediated VFIO mdev driver framework", NVIDIA vGPU 17.0 user guide as quoted in kubevirt/kubevirt#17642 and
  NVIDIA/gpu-operator#2594). KubeVirt v1.9.0 advertises such VFs as ``pciHostDevices`` (kubevirt/kubevirt#16890,
  ``HasVGPUProfile`` in ``pkg/virt-handler/device-manager/common.go``), but nothing in the GPU Operator creates
  them (gpu-operator#2594, open), so that path is not supported end to end here.
- Turing (T4) has no SR-IOV and uses mdev on the parent GPU. Whether its mdev devices still appear on kernel 6.8
  is not established from NVIDIA's own text (a KubeVirt CI proposal says they do not); NVIDIA's kernel < 6.0 note
  covers it either way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from proxmox_gpu_cluster.core.catalog import GpuModel

UbuntuRelease = Literal["22.04", "24.04"]

MDEV_KERNEL_BELOW = "6.0"
"""The GPU Operator's KubeVirt vGPU path is supported on node kernels below this (platform-support.rst)."""

RELEASE_KERNEL: dict[UbuntuRelease, str] = {"22.04": "5.15 (GA; the HWE kernel is 6.8)", "24.04": "6.8 or later"}
"""The kernel an Ubuntu release boots (Canonical's kernel lifecycle: 22.04 GA 5.15, 22.04.5 HWE 6.8, 24.04 6.8)."""

SOURCE = "NVIDIA GPU Operator platform support: KubeVirt with vGPU on Ubuntu 22.04, kernel < 6.0"

_RELEASES: tuple[tuple[UbuntuRelease, re.Pattern[str]], ...] = (
    ("22.04", re.compile(r"(?<![a-z])jammy(?![a-z])|(?<![0-9.])22\.04(?![0-9])")),
    ("24.04", re.compile(r"(?<![a-z])noble(?![a-z])|(?<![0-9.])24\.04(?![0-9])")),
)


def cloud_image_release(url: str | None) -> UbuntuRelease | None:
    """The Ubuntu release a cloud image URL names (``jammy``/``22.04``, ``noble``/``24.04``); None when it names
    none or both (a template clone, a renamed file): then only the guest's verify step can tell."""
    if url is None:
        return None
    found = {release for release, pattern in _RELEASES if pattern.search(url.lower())}
    return found.pop() if len(found) == 1 else None


def sriov(model: GpuModel) -> bool:
    """Whether the model has SR-IOV: Ampere (GA) and later; Turing (TU, the T4) does not."""
    return not model.pci_name.startswith("TU")


def vgpu_path_problems(release: UbuntuRelease | None, models: Iterable[GpuModel]) -> list[str]:
    """Why the GPU Operator's mdev-based KubeVirt vGPU path cannot serve ``models`` on a node running Ubuntu
    ``release`` (empty when it can, or when the release is unknown)."""
    if release != "24.04":
        return []
    out: set[str] = set()
    for model in models:
        if sriov(model):
            why = (
                f"the vGPU Manager (vGPU 17+) serves the {model.key} (SR-IOV) through the vendor-specific VFIO "
                "framework there: its vGPUs are SR-IOV virtual functions, not mediated devices, and the GPU "
                "Operator's vGPU Device Manager, validator and sandbox device plugin handle mediated devices only"
            )
        else:
            why = f"NVIDIA supports the {model.key} (mediated devices, no SR-IOV) for KubeVirt vGPU below kernel 6.0"
        out.add(
            f"vm-vgpu on Ubuntu 24.04 (kernel {RELEASE_KERNEL['24.04']}): {why}; use an Ubuntu 22.04 image with "
            f"its 5.15 kernel ({SOURCE})"
        )
    return sorted(out)
