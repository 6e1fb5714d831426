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

from proxmox_gpu_cluster.core.errors import Problem
from proxmox_gpu_cluster.core.spec import ClusterSpec
from proxmox_gpu_cluster.errors import InvalidComponentArgs


@dataclass(frozen=True)
class Secrets:
    """Secret inputs, each a secret Output (None where the spec does not need it: ``ssh_private_key`` with
    ``proxmox.sshAgent``, where the ssh-agent authenticates instead)."""

    ssh_private_key: pulumi.Output[str] | None
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
    do; nodes are listed explicitly so the provider does not have to guess their addresses. With
    ``proxmox.sshAgent`` it gets ``agent: true`` and no key: in bpg/terraform-provider-proxmox (v0.104.0, what
    pulumi-proxmoxve v8.1.0 wraps; v0.111.1 in v8.3.0 alike), proxmox/ssh/client.go ``openNodeShell`` tries the
    agent first (``createSSHClientAgent``: the socket in ``agent_socket``, default ``SSH_AUTH_SOCK`` or
    ``PROXMOX_VE_SSH_AUTH_SOCK``, fwprovider/provider.go), then a private key, then the password.
    """
    px = spec.proxmox
    key = ssh_key(spec, secrets, name)
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
                private_key=key,
                agent=True if key is None else None,
                nodes=[proxmoxve.ProviderSshNodeArgs(name=n.name, address=n.ssh_address) for n in px.nodes],
            ),
        ),
        opts=opts,
    )


def needed_secrets(spec: ClusterSpec) -> dict[str, str]:
    """``Secrets`` field -> why ``spec`` needs it: the one rule behind ``GpuClusterArgs`` and the stack's config
    (``stacks/config.py`` ``required_secrets``)."""
    px, token, kubeadm = spec.proxmox, spec.proxmox.auth_mode == "token", spec.kubernetes.join_method == "kubeadm"
    rules = [
        ("ssh_private_key", not px.ssh_agent, "SSH to the Proxmox nodes and guests (or proxmox.sshAgent)"),
        ("kubeconfig", True, "the kubeconfig of the target cluster"),
        ("proxmox_api_token", token, "the Proxmox API token (proxmox.authMode token)"),
        ("proxmox_password", not token, "the password of proxmox.username (proxmox.authMode password)"),
        ("ca_cert_hash", kubeadm, "the kubeadm discovery CA cert hash (kubernetes.joinMethod kubeadm)"),
        ("vgpu_registry_password", spec.kubevirt.vgpu_manager is not None,
         "the vGPU Manager registry's password (kubevirt.vgpuManager)"),
    ]  # fmt: skip
    return {field: why for field, needed, why in rules if needed}


def ssh_key(spec: ClusterSpec, secrets: Secrets, component: str = "GpuCluster") -> pulumi.Output[str] | None:
    """The key every SSH connection carries: None with ``proxmox.sshAgent`` (the ssh-agent; a key in ``secrets`` is
    then left unused, so no state holds it), else ``secrets.ssh_private_key``, which must then be set."""
    if spec.proxmox.ssh_agent:
        return None
    if secrets.ssh_private_key is None:
        problem = Problem("secrets.ssh_private_key", "required without proxmox.sshAgent (or turn the agent on)")
        raise InvalidComponentArgs(component, [problem])
    return secrets.ssh_private_key


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
