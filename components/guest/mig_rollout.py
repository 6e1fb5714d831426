"""MigRollout: a MIG geometry change on a live node drains it first and waits for mig-manager before uncordoning."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.core.errors import Problem
from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.render.agent_bundle import step_command
from proxmox_gpu_cluster.render.guest_scripts import mig_args
from proxmox_gpu_cluster.ssh import connection as ssh_connection


class MigRollout(pulumi.ComponentResource):
    """Two steps over SSH on the node (``guest_mig.sh``) around its ``nvidia.com/mig.config`` label change:

    ``<name>-begin``: when the node already runs another geometry, take a rollout slot, cordon and drain it
    (a first provisioning takes none). Pass ``begin`` to the node's label patch (``GpuNodeLabels`` ``node_ready``)
    so the label changes only after it. ``<name>-end``: for a node begin cordoned, wait (bounded) for the new label
    and ``nvidia.com/mig.config.state=success``, then uncordon and free the slot; ``failed`` fails the update naming
    the node, the geometry and mig-manager's logs, and the node stays cordoned. Both carry the geometry in their
    command, so they run again exactly when it changes. They act as the node itself (kubelet's credential on the
    machine, with the cluster's ``NodeStepAccess``), so they carry no credential. They run the node agent's ``mig``
    bundle, which the node's ``GuestBootstrap`` installs: pass it in ``after``.
    """

    begin: command.remote.Command
    """The drain step; the label patch waits for it."""
    settled: pulumi.Output[str]
    """What the end step printed (``mig: <node> runs <geometry> ...`` or that nothing was waited for)."""

    def __init__(
        self,
        name: str,
        bootstrap: GuestBootstrapSpec,
        *,
        mig_config: str,
        operator_namespace: str,
        timeout_seconds: int,
        provider: command.Provider,
        host: pulumi.Input[str],
        user: str,
        ssh_private_key: pulumi.Input[str] | None,
        port: int = 22,
        after: Sequence[pulumi.Resource] = (),
        replace_with: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """``bootstrap``: the node's bootstrap spec (its name, API endpoint and ``rollout`` settings). ``after``:
        what must be done first (the node's bootstrap). ``replace_with``: what makes a fresh machine (the VM).
        ``ssh_private_key``: None means the ssh-agent (``proxmox.sshAgent``), and no step carries a key."""
        super().__init__("proxmox-gpu-cluster:mig_rollout:MigRollout", name, None, opts)
        if bootstrap.rollout is None:
            raise InvalidComponentArgs(name, [Problem("bootstrap.rollout", "a MIG rollout needs rollout settings")])
        connection = ssh_connection(host, user, ssh_private_key, port)

        def step(phase: str, depends_on: Sequence[pulumi.Resource], limit: int) -> command.remote.Command:
            args = mig_args(bootstrap, phase, mig_config, timeout_seconds, operator_namespace)
            return command.remote.Command(
                f"{name}-{phase}",
                command.remote.CommandArgs(connection=connection, create=step_command(user, "mig", args)),
                opts=pulumi.ResourceOptions(
                    parent=self,
                    provider=provider,
                    depends_on=list(depends_on),
                    replace_with=list(replace_with),
                    # The script bounds its waits; the command must not give up first.
                    custom_timeouts=pulumi.CustomTimeouts(create=f"{limit}s", update=f"{limit}s"),
                ),
            )

        rollout = bootstrap.rollout
        self.begin = step("begin", after, rollout.wait_seconds + rollout.drain_timeout_seconds + 300)
        # Not after the label patch: end polls for the new label itself, so the patch needs no edge to it.
        end = step("end", [self.begin], timeout_seconds + 300)
        self.settled = end.stdout
        self.register_outputs({"settled": self.settled})
