"""The cluster's secrets and explicit providers.

Default providers are disabled in the project's Pulumi.yaml, so every resource names one of these providers; a
program that embeds ``GpuCluster`` may pass its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_kubernetes as kubernetes
import pulumi_proxmoxve as proxmoxve

from proxmox_gpu_cluster.core.spec import ClusterSpec


@dataclass(frozen=True)
class Secrets:
    """Secret inputs, each a secret Output (None where the spec does not need it)."""

    ssh_private_key: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    proxmox_api_token: pulumi.Output[str] | None = None
    proxmox_password: pulumi.Output[str] | None = None
    join_token: pulumi.Output[str] | None = None
    ca_cert_hash: pulumi.Output[str] | None = None
    vgpu_registry_password: pulumi.Output[str] | None = None


@dataclass(frozen=True)
class Providers:
    """The explicit providers every resource uses."""

    proxmox: proxmoxve.Provider
    kubernetes: kubernetes.Provider
    command: command.Provider


def proxmox_provider(
    name: str, spec: ClusterSpec, secrets: Secrets, opts: pulumi.ResourceOptions | None = None
) -> proxmoxve.Provider:
    """The Proxmox provider: API token by default, user + password in password mode.

    Its SSH settings serve the provider's own file uploads (cloud-init snippets), which the Proxmox API cannot
    do; nodes are listed explicitly so the provider does not have to guess their addresses.
    """
    px = spec.proxmox
    token_mode = px.auth_mode == "token"
    return proxmoxve.Provider(
        name,
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
        opts=opts,
    )


def default_providers(prefix: str, spec: ClusterSpec, secrets: Secrets, *, parent: pulumi.Resource) -> Providers:
    """Providers built from the spec and secrets, named ``<prefix>-proxmox|kubernetes|command``."""
    opts = pulumi.ResourceOptions(parent=parent)
    return Providers(
        proxmox=proxmox_provider(f"{prefix}-proxmox", spec, secrets, opts),
        kubernetes=kubernetes.Provider(
            f"{prefix}-kubernetes", kubernetes.ProviderArgs(kubeconfig=secrets.kubeconfig), opts=opts
        ),
        command=command.Provider(f"{prefix}-command", opts=opts),
    )
