"""Shared building blocks of the Helm-installed components: a privileged namespace and a cautious release."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

CHART_REPO = "https://helm.ngc.nvidia.com/nvidia"
"""NVIDIA's NGC Helm repository (gpu-operator, nvidia-dra-driver-gpu)."""


def privileged_namespace(resource_name: str, name: str, opts: pulumi.ResourceOptions) -> kubernetes.core.v1.Namespace:
    """A namespace for host-level daemons (drivers, device plugins): pod security ``privileged``."""
    return kubernetes.core.v1.Namespace(
        resource_name,
        kubernetes.core.v1.NamespaceInitArgs(
            metadata=kubernetes.meta.v1.ObjectMetaArgs(
                name=name, labels={"pod-security.kubernetes.io/enforce": "privileged"}
            )
        ),
        opts=opts,
    )


def nvidia_release(
    resource_name: str,
    *,
    chart: str,
    version: str,
    namespace: pulumi.Input[str],
    values: pulumi.Input[Mapping[str, Any]],
    timeout: int,
    opts: pulumi.ResourceOptions,
) -> kubernetes.helm.v3.Release:
    """A ``helm.v3.Release`` of an NVIDIA chart: atomic (a failed upgrade rolls back), cleaned up on failure,
    ten revisions of history. ``timeout`` in seconds covers the chart's own validation pods."""
    return kubernetes.helm.v3.Release(
        resource_name,
        kubernetes.helm.v3.ReleaseArgs(
            name=chart,
            chart=chart,
            version=version,
            repository_opts=kubernetes.helm.v3.RepositoryOptsArgs(repo=CHART_REPO),
            namespace=namespace,
            values=values,
            atomic=True,
            cleanup_on_fail=True,
            timeout=timeout,
            max_history=10,
        ),
        opts=opts,
    )
