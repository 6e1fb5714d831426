"""Compose the stack: explicit providers from the spec and secrets, then the components for each layer.

Default providers are disabled in Pulumi.yaml, so every resource below names one of these providers.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_kubernetes as kubernetes
import pulumi_proxmoxve as proxmoxve

from components.capacity import WorkerCapacity, capacity_table
from components.gpu_node import GpuNodeLabels
from components.gpu_operator import GpuOperator
from components.gpu_quota import GpuQuotas
from components.spec import ClusterSpec
from stacks.config import Secrets


@dataclass(frozen=True)
class Providers:
    """The explicit providers every resource uses."""

    proxmox: proxmoxve.Provider
    kubernetes: kubernetes.Provider
    command: command.Provider


@dataclass(frozen=True)
class Cluster:
    """What ``build`` created, for ``export`` and for programs that compose further."""

    spec: ClusterSpec
    providers: Providers
    capacity: list[WorkerCapacity]


def proxmox_provider(spec: ClusterSpec, secrets: Secrets) -> proxmoxve.Provider:
    """The Proxmox provider: API token by default, user + password in password mode.

    Its SSH settings serve the provider's own file uploads (cloud-init snippets), which the Proxmox API cannot
    do; nodes are listed explicitly so the provider does not have to guess their addresses.
    """
    px = spec.proxmox
    token_mode = px.auth_mode == "token"
    return proxmoxve.Provider(
        "proxmox",
        proxmoxve.ProviderArgs(
            endpoint=px.endpoint,
            insecure=not px.tls_verify,
            api_token=secrets.proxmox_api_token if token_mode else None,
            username=None if token_mode else px.username,
            password=None if token_mode else secrets.proxmox_password,
            ssh=proxmoxve.ProviderSshArgs(
                username=px.ssh_user,
                private_key=secrets.ssh_private_key,
                nodes=[proxmoxve.ProviderSshNodeArgs(name=n.name, address=n.ssh_address) for n in px.nodes],
            ),
        ),
    )


def build(spec: ClusterSpec, secrets: Secrets) -> Cluster:
    """Create every resource of the stack described by ``spec``."""
    providers = Providers(
        proxmox=proxmox_provider(spec, secrets),
        kubernetes=kubernetes.Provider("kubernetes", kubernetes.ProviderArgs(kubeconfig=secrets.kubeconfig)),
        command=command.Provider("command"),
    )
    if spec.gpu_operator.enabled:
        labels = GpuNodeLabels("gpu-nodes", spec, list(spec.workers), provider=providers.kubernetes)
        GpuOperator("gpu-operator", spec, provider=providers.kubernetes, depends_on=[labels])
    if spec.quotas:
        GpuQuotas("gpu-quotas", spec, provider=providers.kubernetes)
    return Cluster(spec=spec, providers=providers, capacity=capacity_table(spec))


def export(cluster: Cluster) -> None:
    """Stack outputs: the workers (VM and node names) and what each node will advertise."""
    pulumi.export(
        "capacity",
        {
            row.worker: {
                "proxmoxNode": row.node,
                "gpus": row.gpus,
                "workload": row.workload,
                "resources": row.resources,
            }
            for row in cluster.capacity
        },
    )
