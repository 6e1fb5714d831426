"""MigRollout: a MIG geometry change on a live node drains it first and waits for mig-manager before uncordoning."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.core.errors import Problem
from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.render.agent_bundle import installed_step, step_command
from proxmox_gpu_cluster.render.guest_scripts import mig_args
from proxmox_gpu_cluster.render.host_scripts import mig_restart_args
from proxmox_gpu_cluster.ssh import connection as ssh_connection

AGENT_WAIT_SECONDS = 600
"""How long the restart step waits for the VM's QEMU guest agent after a start."""


@dataclass(frozen=True)
class MigVm:
    """The worker's VM, for the Proxmox-side restart that applies a pending MIG mode."""

    vmid: int
    host: pulumi.Input[str]
    """The SSH address of the Proxmox node the VM runs on."""
    ssh_user: str
    """The Proxmox node's SSH user (root, or passwordless sudo)."""
    guest_user: str
    """The guest's SSH user (where the guest's agent copy, with its MIG step, is installed)."""
    host_agent: pulumi.Resource
    """The node agent's copy on that Proxmox node (its mig-restart step)."""


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

    MIG mode (``bootstrap.mig_modes``): begin also sets each GPU's mode after the drain. With ``vm``, a third step,
    ``<name>-restart``, runs on the VM's Proxmox node after the label patch (``settle``): it asks the guest (QEMU
    guest agent) whether a mode waits for a GPU reset and only then stops and starts the VM (a new QEMU process
    resets the passed-through GPUs), so a re-run does nothing; end runs after it. ``settle_later``: the caller
    creates the restart and end steps with ``settle(after=[<the label patch>])`` (mig-manager must see the new label
    before the VM restarts, or it would put back the old mode at its start).
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
        vm: MigVm | None = None,
        settle_later: bool = False,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """``bootstrap``: the node's bootstrap spec (its name, API endpoint and ``rollout`` settings). ``after``:
        what must be done first (the node's bootstrap). ``replace_with``: what makes a fresh machine (the VM).
        ``ssh_private_key``: None means the ssh-agent (``proxmox.sshAgent``), and no step carries a key. ``vm``: the
        worker's VM, for the restart step (a worker with MIG modes). ``settle_later``: create only the begin
        step now; the caller calls ``settle`` with the label patch."""
        super().__init__("proxmox-gpu-cluster:mig_rollout:MigRollout", name, None, opts)
        if bootstrap.rollout is None:
            raise InvalidComponentArgs(name, [Problem("bootstrap.rollout", "a MIG rollout needs rollout settings")])
        connection = ssh_connection(host, user, ssh_private_key, port)
        self._bootstrap, self._vm, self._key, self._replace = bootstrap, vm, ssh_private_key, list(replace_with)
        self._mig = (mig_config, operator_namespace, timeout_seconds)
        self._provider = provider

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

        self._step, self._name = step, name
        rollout = bootstrap.rollout
        self.begin = step("begin", after, rollout.wait_seconds + rollout.drain_timeout_seconds + 300)
        self.restart: command.remote.Command | None = None
        if not settle_later:
            self.settle()

    def settle(self, after: Sequence[pulumi.Resource] = ()) -> None:
        """The restart step (with ``vm`` and MIG modes) and the end step, after ``after`` (the label patch)."""
        mig_config, namespace, timeout = self._mig
        previous: list[pulumi.Resource] = [self.begin, *after]
        if self._vm is not None and self._bootstrap.mig_modes:
            vm = self._vm
            guest = mig_args(self._bootstrap, "restart", mig_config, timeout, namespace)
            args = mig_restart_args(vm.vmid, self._bootstrap.node_name, AGENT_WAIT_SECONDS,
                                    installed_step(vm.guest_user, "mig"), guest)  # fmt: skip
            # Two guest-agent waits, two guest runs, the shutdown (qm's 300 s), and slack.
            limit = 2 * AGENT_WAIT_SECONDS + 2 * (AGENT_WAIT_SECONDS + 60) + 600
            self.restart = command.remote.Command(
                f"{self._name}-restart",
                command.remote.CommandArgs(
                    connection=ssh_connection(vm.host, vm.ssh_user, self._key),
                    create=step_command(vm.ssh_user, "mig-restart", args),
                ),
                opts=pulumi.ResourceOptions(
                    parent=self,
                    provider=self._provider,
                    depends_on=[*previous, vm.host_agent],
                    replace_with=self._replace,
                    custom_timeouts=pulumi.CustomTimeouts(create=f"{limit}s", update=f"{limit}s"),
                ),
            )
            previous = [self.restart]
        # After the restart step; else after begin (and ``after``): end polls for the new label itself.
        end = self._step("end", previous, timeout + 300)
        self.settled = end.stdout
        self.register_outputs({"settled": self.settled})
