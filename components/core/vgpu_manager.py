"""The vGPU Manager image spec (``kubevirt.vgpuManager``) and the rule its version follows. Pure."""

from __future__ import annotations

import re

from pydantic import Field, model_validator

from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.spec_base import Name, SpecModel, Text

OS_TAG = re.compile(r"-((?:ubuntu|rhel|rhcos|centos|sles|sl-micro|debian|rocky)[0-9][0-9.]*)$")
"""An OS tag ending an image tag: ``<ID><VERSION_ID>`` of the node's os-release, as the GPU Operator builds it."""


def vgpu_version_problem(version: str) -> str | None:
    """Why ``version`` cannot be ``vgpuManager.version``, or None. The GPU Operator appends the node's OS tag to
    the version itself (gpu-operator controllers/object_controls.go: the vGPU Manager container's image goes
    through ``resolveDriverTag``, which adds ``-<osTag>`` unless the version is a digest), so a version that
    already ends in one makes it pull ``...-ubuntu22.04-ubuntu22.04``, which no registry holds."""
    match = OS_TAG.search(version)
    if match is None:
        return None
    bare = version[: match.start()]
    return (
        f"{version} ends in the OS tag -{match[1]}, which the GPU Operator appends itself (it would pull "
        f"{version}-{match[1]}); give the driver version only: {bare}"
    )


class VgpuManagerSpec(SpecModel):
    """The NVIDIA vGPU Manager image the operator runs on vm-vgpu nodes.

    NVIDIA does not publish it: it is built from the licensed vGPU host driver and pushed to a private registry
    (NVIDIA GPU Operator docs, "Build the vGPU Manager image"). The registry password (an NGC API key for nvcr.io)
    is the secret ``vgpuRegistryPassword``; the stack stores it in a pull secret in the operator namespace.
    """

    repository: str = Field(
        pattern=r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9._-]{1,128}){0,8}$",
        description="Registry and path holding the image, e.g. ``registry.example.com/nvidia``.",
    )
    image: str = Field(default="vgpu-manager", pattern=r"^[a-z0-9._/-]{1,128}$", description="Image name.")
    version: str = Field(
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$",
        description="The vGPU host driver version the image was built for, e.g. ``580.95.02``, without the OS tag: "
        "the operator appends each node's own (it pulls ``580.95.02-ubuntu22.04`` on an Ubuntu 22.04 node), so "
        "push the image tagged ``<version>-<os>`` for every OS your vm-vgpu nodes run.",
    )
    pull_secret: Name = Field(
        default="vgpu-manager-registry",
        description="Name of the image pull secret the stack creates in the operator namespace.",
    )
    registry_username: Text = Field(
        default="$oauthtoken",
        min_length=1,
        description="Registry user of the pull secret (``$oauthtoken`` with an NGC API key on nvcr.io).",
    )

    @model_validator(mode="after")
    def _no_os_tag(self) -> VgpuManagerSpec:
        why = vgpu_version_problem(self.version)
        if why is not None:
            raise SpecViolations([Problem("version", why)])
        return self

    @property
    def registry(self) -> str:
        """The registry host (with port) the pull secret authenticates to."""
        return self.repository.split("/", 1)[0]
