"""Spec models of the GPU software stack: the operator release, DCGM monitoring, the smoke test and DRA. Pure."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.monitoring_spec import MonitoringSpec
from proxmox_gpu_cluster.core.spec_base import (
    CountOrPercent,
    DriverBranch,
    DriverVersion,
    Int,
    Name,
    SpecModel,
    Text,
    on_branch,
)
from proxmox_gpu_cluster.core.validation_operator import cuda_image_problem

CHART_CDI_DEFAULT = {"v26.7.0": True, "v25.10.1": True}
"""``cdi.enabled`` in each pinned chart's values.yaml (on since v25.10.0, NVIDIA cloud-native-docs cdi.rst);
tests/components/test_operator_support.py reads the charts and compares."""


class SmokeTestSpec(SpecModel):
    """An opt-in Job that runs nvidia-smi on one advertised GPU resource and must complete."""

    enabled: bool = Field(default=False, description="Run the smoke-test Job after the operator release.")
    image: str = Field(
        default="nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04",
        pattern=r"^[a-z0-9][a-z0-9./_:@-]*$",
        description="Container image; the NVIDIA runtime injects nvidia-smi from the host driver. An NVIDIA CUDA "
        "image (``.../cuda:<X.Y...>-...``) must run on ``driverBranch`` (CUDA minor-version compatibility).",
    )
    timeout_seconds: Int = Field(default=600, ge=60, le=7200, description="activeDeadlineSeconds of the Job.")


class DriverDrainSpec(SpecModel):
    """How the operator's upgrade controller drains a node before it swaps the driver."""

    enable: bool = Field(default=True, description="Drain the node (cordon, evict every pod) before the upgrade.")
    force: bool = Field(default=False, description="Also evict pods that no controller manages (they are lost).")
    timeout_seconds: Int = Field(default=300, ge=0, le=86_400, description="Give up draining after this long.")
    delete_empty_dir: bool = Field(default=False, description="Evict pods with emptyDir volumes (their data is lost).")


class GpuPodDeletionSpec(SpecModel):
    """How the upgrade controller deletes the pods that use a GPU before the driver is swapped."""

    force: bool = Field(default=False, description="Also delete GPU pods that no controller manages.")
    timeout_seconds: Int = Field(default=300, ge=0, le=86_400, description="Give up deleting after this long.")
    delete_empty_dir: bool = Field(default=False, description="Delete GPU pods with emptyDir volumes.")


class DriverUpgradeSpec(SpecModel):
    """``driver.upgradePolicy`` of the operator's driver container: how a new driver rolls over the nodes."""

    auto_upgrade: bool = Field(default=True, description="Let the operator roll a new driver version node by node.")
    max_parallel_upgrades: Int = Field(
        default=1, ge=1, le=10_000, description="Nodes upgraded at the same time (1: one node at a time)."
    )
    max_unavailable: CountOrPercent = Field(
        default=1, description="GPU nodes that may be unavailable during the roll: a count or a percentage."
    )
    wait_for_completion_seconds: Int = Field(
        default=0, ge=0, le=86_400, description="Wait this long for matching jobs to finish first (0: do not wait)."
    )
    wait_for_completion_pod_selector: Text = Field(
        default="", description="Label selector of the jobs to wait for (one line)."
    )
    gpu_pod_deletion: GpuPodDeletionSpec = Field(
        default_factory=GpuPodDeletionSpec, description="Deleting the pods that use the GPU."
    )
    drain: DriverDrainSpec = Field(default_factory=DriverDrainSpec, description="Draining the node.")


class DraSpec(SpecModel):
    """The NVIDIA DRA driver release, used when any worker sets ``dra``."""

    chart_version: str = Field(
        default="25.12.0",
        pattern=r"^[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}$",
        description="nvidia-dra-driver-gpu chart version.",
    )
    namespace: Name = Field(default="nvidia-dra-driver-gpu", description="Namespace of the DRA driver.")


class GpuOperatorSpec(SpecModel):
    """The NVIDIA GPU Operator release and the GPU software stack on the workers."""

    enabled: bool = Field(default=True, description="Install the GPU Operator.")
    chart_version: Literal["v26.7.0", "v25.10.1"] = Field(default="v26.7.0", description="Chart version.")
    namespace: Name = Field(default="gpu-operator", description="Namespace of the operator.")
    driver_mode: Literal["host", "operator"] = Field(
        default="host",
        description="host: the guest bootstrap installs the driver; operator: a driver container.",
    )
    driver_branch: DriverBranch = Field(default="580", description="Driver branch, e.g. ``580``.")
    driver_version: DriverVersion | None = Field(
        default=None,
        description="Exact driver version to pin; in operator mode the branch's tested version by default "
        "(proxmox_gpu_cluster.core.drivers), never the chart's.",
    )
    driver_upgrade: DriverUpgradeSpec = Field(
        default_factory=DriverUpgradeSpec,
        description="How the operator rolls a new driver over the nodes (operator mode): one node at a time, drained.",
    )
    kernel_module_type: Literal["auto", "open", "proprietary"] = Field(
        default="auto", description="Open or proprietary kernel modules; auto lets the driver choose."
    )
    cdi: bool | None = Field(
        default=None,
        description="Use the Container Device Interface. Unset: the pinned chart's default (on since v25.10) in "
        "operator mode, off in host mode, whose containerd the operator does not configure (docs/gpu-stack.md).",
    )
    dcgm: bool = Field(default=True, description="Deploy the DCGM exporter.")
    mig_strategy: Literal["none", "single", "mixed"] = Field(
        default="none",
        description="How MIG devices are advertised: as nvidia.com/gpu (single) or per profile.",
    )
    nfd: bool = Field(default=True, description="Deploy Node Feature Discovery; off when the cluster has it.")
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec, description="DCGM metrics and alerts.")
    smoke_test: SmokeTestSpec = Field(default_factory=SmokeTestSpec, description="Post-install smoke test.")
    capacity_gate_seconds: Int = Field(
        default=600,
        ge=0,
        le=7200,
        description="After the GPU stack, wait at most this long for each worker node to advertise what the "
        "capacity table says, and fail the update naming the node otherwise (0: no gate).",
    )
    dra: DraSpec = Field(default_factory=DraSpec, description="DRA driver settings (used by ``dra`` workers).")

    @model_validator(mode="after")
    def _consistent(self) -> GpuOperatorSpec:
        problems = []
        if not on_branch(self.driver_version, self.driver_branch):
            problems.append(Problem("driverVersion", f"{self.driver_version} is not on branch {self.driver_branch}"))
        if self.monitoring.prometheus and not (self.enabled and self.dcgm):
            problems.append(Problem("monitoring.prometheus", "needs the operator's DCGM exporter (enabled, dcgm)"))
        if self.smoke_test.enabled and not self.enabled:
            problems.append(Problem("smokeTest.enabled", "the smoke test runs after the operator (enabled: false)"))
        cuda = cuda_image_problem(self.smoke_test.image, self.driver_branch) if self.smoke_test.enabled else None
        if cuda is not None:
            problems.append(Problem("smokeTest.image", cuda))
        if problems:
            raise SpecViolations(problems)
        return self

    @property
    def cdi_enabled(self) -> bool:
        """Whether the operator (and, in host mode, the guest) uses CDI: ``cdi`` if set, else the chart's default
        in operator mode and off in host mode (see the field)."""
        if self.cdi is not None:
            return self.cdi
        return self.driver_mode == "operator" and CHART_CDI_DEFAULT[self.chart_version]
