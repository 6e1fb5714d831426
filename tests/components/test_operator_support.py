"""What the pinned GPU Operator releases support: CDI follows each chart's default, the Kubernetes version lies in
the range NVIDIA validated the release on, and the smoke test's CUDA image runs on the pinned driver branch."""

from __future__ import annotations

import typing
from typing import Any

import pytest
import yaml

from proxmox_gpu_cluster.cluster.adapters import gpu_stack
from proxmox_gpu_cluster.core.guest_spec import bootstrap_spec
from proxmox_gpu_cluster.core.operator_spec import CHART_CDI_DEFAULT, GpuOperatorSpec
from proxmox_gpu_cluster.core.spec import MIN_KUBERNETES_MINOR, load_spec
from proxmox_gpu_cluster.core.validation_operator import (
    CUDA_MIN_DRIVER_BRANCH,
    GUEST_OSES,
    KUBERNETES_VALIDATED,
    cuda_image_problem,
    image_cuda_version,
    validated_kubernetes,
)
from proxmox_gpu_cluster.render.operator_values import operator_values
from tests.support import CHART_VERSIONS, assert_problem, base_spec, errors_of, shared_reference, without_operator

C = "cluster"


def chart_cdi(tag: str) -> bool:
    """``cdi.enabled`` as the pinned chart's values.yaml ships it."""
    value = yaml.safe_load(shared_reference(tag, "values.yaml").read_text())["cdi"]["enabled"]
    assert isinstance(value, bool)
    return value


def rendered(raw: dict[str, Any]) -> tuple[bool, set[bool]]:
    """(``cdi.enabled`` of the operator values, the ``cdi`` flags of the workers' guest bootstraps)."""
    spec = load_spec(raw)
    stack = gpu_stack(spec)
    values = operator_values(stack.operator, stack.nodes, vgpu_manager=stack.vgpu_manager)
    return values["cdi"]["enabled"], {bootstrap_spec(spec, w).cdi for w in spec.workers}


def test_every_supported_chart_has_its_cdi_default_and_kubernetes_range() -> None:
    literal = typing.get_args(GpuOperatorSpec.model_fields["chart_version"].annotation)
    assert set(literal) == set(CHART_VERSIONS) == set(CHART_CDI_DEFAULT) == set(KUBERNETES_VALIDATED)
    assert all(set(rows) == set(GUEST_OSES) for rows in KUBERNETES_VALIDATED.values())


@pytest.mark.parametrize("tag", CHART_VERSIONS)
def test_the_cdi_table_is_what_each_chart_ships(tag: str) -> None:
    assert CHART_CDI_DEFAULT[tag] == chart_cdi(tag)


@pytest.mark.parametrize("tag", CHART_VERSIONS)
def test_operator_mode_follows_the_chart_unless_the_spec_says_otherwise(tag: str) -> None:
    raw = base_spec()
    raw["gpuOperator"].update(chartVersion=tag, driverMode="operator", driverVersion="580.95.05")
    # The toolkit container configures containerd for CDI itself; the guest generates nothing.
    assert rendered(raw) == (chart_cdi(tag), {False})
    for explicit in (False, True):
        raw["gpuOperator"]["cdi"] = explicit
        assert rendered(raw) == (explicit, {False})


@pytest.mark.parametrize("tag", CHART_VERSIONS)
def test_host_mode_keeps_cdi_off_unless_the_spec_turns_it_on(tag: str) -> None:
    raw = base_spec()
    raw["gpuOperator"]["chartVersion"] = tag
    assert chart_cdi(tag), "the chart turned CDI off: host mode could follow it again"
    assert rendered(raw) == (False, {False})
    raw["gpuOperator"]["cdi"] = True  # the guest's runtime step generates the host's spec (nvidia-ctk cdi generate)
    assert rendered(raw) == (True, {True})
    raw["gpuOperator"]["cdi"] = False
    assert rendered(raw) == (False, {False})


@pytest.mark.parametrize("tag", CHART_VERSIONS)
def test_kubernetes_outside_the_validated_range_is_refused(tag: str) -> None:
    low, high = validated_kubernetes(tag)
    assert low >= MIN_KUBERNETES_MINOR  # the bootstrap's own floor never hides part of a chart's range
    for minor in range(MIN_KUBERNETES_MINOR, high + 3):
        raw = base_spec()
        raw["gpuOperator"]["chartVersion"] = tag
        raw["kubernetes"]["version"] = f"1.{minor}"
        if low <= minor <= high:
            load_spec(raw)
            continue
        lines = errors_of(raw)
        assert lines == [
            f"{C}.kubernetes.version: 1.{minor} is not validated for GPU Operator {tag} "
            f"(1.{low}-1.{high} on Ubuntu 22.04 and Ubuntu 24.04, NVIDIA platform support)"
        ], lines
        load_spec(without_operator(raw))  # no operator, no operator range


def test_the_range_is_valid_on_every_guest_os() -> None:
    # v26.7.0 validated Ubuntu 24.04 from 1.32 but Ubuntu 22.04 only from 1.33: a worker's OS is its cloud image.
    rows = KUBERNETES_VALIDATED["v26.7.0"]
    assert rows["Ubuntu 24.04"][0] < rows["Ubuntu 22.04"][0]
    low, high = validated_kubernetes("v26.7.0")
    assert all(lo <= low and high <= hi for lo, hi in rows.values())
    assert (low, high) == (rows["Ubuntu 22.04"][0], min(hi for _, hi in rows.values()))


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04", (12, 8)),
        ("nvidia/cuda:13.0.1-runtime-ubuntu24.04", (13, 0)),
        ("docker.io/nvidia/cuda:11.8.0-base-ubuntu22.04", (11, 8)),
        ("nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04@sha256:" + "0" * 64, (12, 4)),
        ("registry.example.test/mirror/nvidia/cuda:12.9.1-base-ubuntu24.04", (12, 9)),
        ("registry.example.test/team/smoke:1.2.3-base", None),
        ("registry.example.test/mycuda:12.8.1-base", None),
        ("nvcr.io/nvidia/cuda@sha256:" + "0" * 64, None),
    ],
)
def test_the_cuda_version_comes_from_an_nvidia_cuda_image_tag(image: str, version: tuple[int, int] | None) -> None:
    assert image_cuda_version(image) == version


def test_minor_version_compatibility_floor_per_cuda_family() -> None:
    for major, floor in CUDA_MIN_DRIVER_BRANCH.items():
        image = f"nvcr.io/nvidia/cuda:{major}.9.0-base-ubuntu24.04"
        assert cuda_image_problem(image, str(floor)) is None
        assert cuda_image_problem(image, str(floor + 85)) is None  # newer branches: backward compatibility
        problem = cuda_image_problem(image, str(floor - 1))
        assert problem is not None and f"needs driver branch {floor} or later (is {floor - 1}" in problem
    assert "no known minimum driver" in (cuda_image_problem("nvidia/cuda:14.0.0-base-ubuntu24.04", "999") or "")
    assert cuda_image_problem("registry.example.test/team/smoke:1.0", "470") is None  # not an NVIDIA CUDA image


def smoke(image: str | None, branch: str, enabled: bool = True) -> dict[str, Any]:
    raw = base_spec()
    raw["gpuOperator"].update(driverBranch=branch, smokeTest={"enabled": enabled})
    if image is not None:
        raw["gpuOperator"]["smokeTest"]["image"] = image
    return raw


def test_the_smoke_test_image_must_run_on_the_pinned_branch() -> None:
    load_spec(smoke(None, "580"))  # the default image (CUDA 12.8) on the default branch
    load_spec(smoke("nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04", "535"))  # 12.x minor-version compatibility
    assert_problem(
        "CUDA 13 image on branch 570",
        errors_of(smoke("nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04", "570")),
        f"{C}.gpuOperator.smokeTest.image",
        "CUDA 13.0 needs driver branch 580 or later (is 570; NVIDIA CUDA minor-version compatibility)",
    )
    assert_problem(
        "CUDA 12 image on branch 470",
        errors_of(smoke(None, "470")),
        f"{C}.gpuOperator.smokeTest.image",
        "CUDA 12.8 needs driver branch 525 or later (is 470",
    )
    load_spec(smoke("nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04", "570", enabled=False))  # not run: not checked


def test_the_default_image_runs_on_the_default_branch() -> None:
    op = GpuOperatorSpec()
    assert image_cuda_version(op.smoke_test.image) is not None
    assert cuda_image_problem(op.smoke_test.image, op.driver_branch) is None
