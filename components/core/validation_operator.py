"""What each pinned GPU Operator release supports, from NVIDIA's own documents, and the rules built on it. Pure.

- Kubernetes: the platform-support matrix of the GPU Operator documentation (github.com/NVIDIA/cloud-native-docs,
  ``gpu-operator/platform-support.rst``), bare-metal/VM table, "Kubernetes" column, rows Ubuntu 22.04 LTS and
  Ubuntu 24.04 LTS (the guests this project builds; which one a worker runs is its cloud image, unknown here, so
  a version must be validated on both).
- CUDA: NVIDIA's CUDA minor-version compatibility table (docs.nvidia.com/deploy/cuda-compatibility/
  minor-version-compatibility.html, "CUDA Toolkit 11.x, 12.x, and 13.x Driver Version Ranges"): an application
  built with any CUDA X.y runs on a driver at least as new as the family's minimum.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from proxmox_gpu_cluster.core.errors import Problem

if TYPE_CHECKING:
    # Types only: the spec module runs the cross-field validation, which imports this module.
    from proxmox_gpu_cluster.core.catalog import GpuModel
    from proxmox_gpu_cluster.core.spec import ClusterSpec

OPEN_MODULES_FIRST_BRANCH = 515
"""NVIDIA published the open GPU kernel modules with R515 (github.com/NVIDIA/open-gpu-kernel-modules)."""


def driver_branch_problems(
    branch: str,
    kernel_module_type: str,
    nodes: Iterable[tuple[str, Iterable[GpuModel]]],
    *,
    branch_at: str,
    modules_at: str,
) -> list[Problem]:
    """The driver branch must know every GPU model of the container nodes (``(where, models)``, ``where`` naming
    the node in the caller's terms), and the open kernel modules need R515 or later. Shared by the cluster spec
    (``gpuOperator.driverBranch``) and ``GpuStack.problems`` (``operator.driver_branch``)."""
    number = int(branch)
    too_new: dict[str, tuple[str, int]] = {}
    for where, models in nodes:
        for model in models:
            if number < model.min_driver_branch:
                too_new.setdefault(model.key, (where, model.min_driver_branch))
    out = [
        Problem(branch_at, f"branch {branch} does not support {key} ({where}); it needs branch {need} or later")
        for key, (where, need) in too_new.items()
    ]
    if kernel_module_type == "open" and number < OPEN_MODULES_FIRST_BRANCH:
        out.append(
            Problem(
                modules_at,
                f"the open kernel modules start with branch {OPEN_MODULES_FIRST_BRANCH} (branch is {branch})",
            )
        )
    return out


GUEST_OSES = ("Ubuntu 22.04", "Ubuntu 24.04")
"""The guest operating systems the bootstrap supports (worker_spec: Ubuntu 22.04/24.04 cloud images)."""

KUBERNETES_VALIDATED: dict[str, dict[str, tuple[int, int]]] = {
    # cloud-native-docs tag gpu-operator-v25.10-45 (branch release-25.10, 2026-08-19), platform-support.rst:
    # "1.30---1.35" for both Ubuntu rows, with footnote 4 "Kubernetes v1.35 support was added in v25.10.1 and
    # later" (commit a5b94d57, "add k8s 1.35 to support matrix"); 25.10.0's own docs (tag gpu-operator-v25.10,
    # commit 3e11d275) said 1.30---1.34.
    "v25.10.1": {"Ubuntu 22.04": (30, 35), "Ubuntu 24.04": (30, 35)},
    # cloud-native-docs tag gpu-operator-v26.7-1 (commit 187a4a5b "Release docs 26.7.0" and its fix-up 52dcb7b8):
    # "Ubuntu 22.04 LTS: 1.33---1.36", "Ubuntu 24.04 LTS: 1.32---1.36".
    "v26.7.0": {"Ubuntu 22.04": (33, 36), "Ubuntu 24.04": (32, 36)},
}
"""Chart version -> guest OS -> (oldest, newest) Kubernetes minor NVIDIA validated that release on."""

CUDA_MIN_DRIVER_BRANCH = {11: 450, 12: 525, 13: 580}
"""CUDA major -> the oldest driver branch its minor-version compatibility covers (11.x: >= 450.80.02; 12.x: >= 525;
13.x: >= 580). Newer branches run older families through backward compatibility."""

_CUDA_IMAGE = re.compile(r"^(?:.*/)?cuda:(?P<major>[0-9]+)\.(?P<minor>[0-9]+)(?:\.[0-9]+)?-")
"""NVIDIA's CUDA images (nvcr.io/nvidia/cuda, docker.io/nvidia/cuda) tag the toolkit version first:
``12.8.1-base-ubuntu24.04``."""


def validated_kubernetes(chart_version: str) -> tuple[int, int]:
    """The Kubernetes minors ``chart_version`` is validated on for every guest OS (the rows' intersection)."""
    rows = KUBERNETES_VALIDATED[chart_version]
    return max(rows[os][0] for os in GUEST_OSES), min(rows[os][1] for os in GUEST_OSES)


def image_cuda_version(image: str) -> tuple[int, int] | None:
    """(major, minor) of an NVIDIA CUDA image's toolkit from its tag; None for any other image (not checked)."""
    match = _CUDA_IMAGE.match(image.split("@", 1)[0])
    return (int(match["major"]), int(match["minor"])) if match else None


def cuda_image_problem(image: str, driver_branch: str) -> str | None:
    """Why ``image`` cannot run on ``driver_branch`` under minor-version compatibility (None: it can)."""
    cuda = image_cuda_version(image)
    if cuda is None:
        return None
    major, minor = cuda
    needed = CUDA_MIN_DRIVER_BRANCH.get(major)
    if needed is None:
        known = ", ".join(f"{m}.x" for m in sorted(CUDA_MIN_DRIVER_BRANCH))
        return f"CUDA {major}.{minor} has no known minimum driver (known: {known}; NVIDIA CUDA compatibility)"
    if int(driver_branch) < needed:
        return (
            f"CUDA {major}.{minor} needs driver branch {needed} or later (is {driver_branch}; "
            "NVIDIA CUDA minor-version compatibility)"
        )
    return None


def operator_problems(spec: ClusterSpec) -> list[Problem]:
    """The cluster's Kubernetes version lies in the range NVIDIA validated the pinned operator release on."""
    op = spec.gpu_operator
    if not op.enabled:
        return []
    low, high = validated_kubernetes(op.chart_version)
    if low <= spec.kubernetes.minor <= high:
        return []
    return [
        Problem(
            "kubernetes.version",
            f"{spec.kubernetes.version} is not validated for GPU Operator {op.chart_version} "
            f"(1.{low}-1.{high} on {' and '.join(GUEST_OSES)}, NVIDIA platform support)",
        )
    ]
