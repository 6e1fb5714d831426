"""SSH connection settings and the reboot wait shared by every remote command (Proxmox nodes and guests)."""

from __future__ import annotations

import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.render.host_scripts import script

SSH_DIAL_RETRIES = 30
"""Dial attempts per command (x PER_DIAL_TIMEOUT seconds): covers a host that is still finishing its boot."""
PER_DIAL_TIMEOUT = 10


def connection(
    host: pulumi.Input[str], user: str, private_key: pulumi.Input[str], port: int = 22
) -> command.remote.ConnectionArgs:
    """Key-based SSH to ``user@host:port`` with bounded dial retries (about five minutes)."""
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
