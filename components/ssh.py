"""SSH connection settings and the reboot wait shared by every remote command (Proxmox nodes and guests)."""

from __future__ import annotations

import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.render.host_scripts import script

SSH_DIAL_RETRIES = 30
"""Dial attempts per command (x PER_DIAL_TIMEOUT seconds): covers a host that is still finishing its boot."""
PER_DIAL_TIMEOUT = 10


def connection(
    host: pulumi.Input[str], user: str, private_key: pulumi.Input[str] | None, port: int = 22
) -> command.remote.ConnectionArgs:
    """Key-based SSH to ``user@host:port`` with bounded dial retries (about five minutes). ``private_key`` None
    means the ssh-agent: the connection then carries no key at all (nor an ``agentSocketPath``: the provider reads
    ``SSH_AUTH_SOCK`` where ``pulumi up`` runs), so no step's state holds it.

    How pulumi-command authenticates (provider/pkg/provider/remote/connection.go, ``Connection.SSHConfig``, tags
    v1.0.1, the floor, and v1.2.1): a ``privateKey`` adds public-key auth with it, a ``password`` adds password and
    keyboard-interactive auth, and then, key or not, the socket in ``agentSocketPath`` or else ``$SSH_AUTH_SOCK``
    (connection_unix.go ``tryGetDefaultAgentSocket``) adds the agent's keys; a socket that is set but cannot be
    dialled fails the step. With neither a key nor an agent there is no auth method and the handshake fails."""
    return command.remote.ConnectionArgs(
        host=host,
        port=port,
        user=user,
        private_key=private_key,
        dial_error_limit=SSH_DIAL_RETRIES,
        per_dial_timeout=PER_DIAL_TIMEOUT,
    )


def reboot_wait_args(
    host: pulumi.Input[str], port: int, step_output: pulumi.Input[str], triggers: list[pulumi.Input[str]] | None = None
) -> command.local.CommandArgs:
    """A local command (``python3 -`` where ``pulumi up`` runs: a remote command cannot wait for its own host to
    reboot) that waits for ``host:port`` to go down and answer again when ``step_output`` says the step scheduled
    a reboot (``wait_for_reboot.py``), and returns at once otherwise."""
    return command.local.CommandArgs(
        create="python3 -",
        stdin=script("wait_for_reboot.py"),
        environment={"PGC_HOST": host, "PGC_PORT": str(port), "PGC_PREP_OUTPUT": step_output},
        triggers=triggers,
    )
