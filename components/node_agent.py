"""The node agent's copy on a machine: one ``CopyToRemote`` of every step bundle of its kind (render/agent_bundle.py).

The copy is the only resource that carries the scripts; steps name their bundle by fingerprint in their command.
pulumi-command (v1.2.1, provider/pkg/provider/remote/copyController.go) copies again on an update only when the
archive's hash or the remote path changed, never removes the files on destroy, and a change of ``connection`` alone
(another address) copies nothing: so the copy is replaced with the machine (``replace_with``), like every step.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.render.agent_bundle import REMOTE_DIR, materialize


def caller_dependencies(opts: pulumi.ResourceOptions | None) -> list[pulumi.Resource]:
    """The resources a component's caller made it depend on (``opts.depends_on``), for its first children: Pulumi
    does not pass a component's dependencies on to its children."""
    depends_on = opts.depends_on if opts is not None else None
    if depends_on is None:
        return []
    if isinstance(depends_on, pulumi.Resource):
        return [depends_on]
    return [d for d in depends_on if isinstance(d, pulumi.Resource)]  # type: ignore[union-attr]


def install_agent(
    name: str,
    kind: str,
    *,
    connection: command.remote.ConnectionArgs,
    parent: pulumi.Resource,
    provider: command.Provider | None = None,
    replace_with: Sequence[pulumi.Resource] = (),
    depends_on: Sequence[pulumi.Resource] = (),
) -> command.remote.CopyToRemote:
    """Copy the agent of ``kind`` (``guest`` or ``host``) to ``~/.proxmox-gpu-cluster/agent`` on the machine.
    ``provider``: None takes the parent's (a component's ``opts.provider``)."""
    return command.remote.CopyToRemote(
        name,
        command.remote.CopyToRemoteArgs(
            connection=connection, source=pulumi.FileArchive(materialize(kind)), remote_path=REMOTE_DIR
        ),
        opts=pulumi.ResourceOptions(
            parent=parent, provider=provider, replace_with=list(replace_with), depends_on=list(depends_on)
        ),
    )


def agent_unless_installed(
    installed: bool,
    name: str,
    kind: str,
    *,
    connection: command.remote.ConnectionArgs,
    parent: pulumi.Resource,
    provider: command.Provider | None = None,
    replace_with: Sequence[pulumi.Resource] = (),
    depends_on: Sequence[pulumi.Resource] = (),
) -> list[pulumi.Resource]:
    """What a component's step on a machine waits for besides its caller's dependencies: nothing when another
    component ``installed`` the agent there (the caller names that copy), else this component's own copy."""
    if installed:
        return []
    return [
        install_agent(
            name,
            kind,
            connection=connection,
            provider=provider,
            parent=parent,
            replace_with=replace_with,
            depends_on=depends_on,
        )
    ]
