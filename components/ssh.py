"""SSH connection settings shared by every remote command (Proxmox nodes and guests)."""

from __future__ import annotations

import pulumi
import pulumi_command as command

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
