"""MigDrain and MigSettle: a MIG geometry change on a live node drains it first and waits for mig-manager before
uncordoning; the node's ``nvidia.com/mig.config`` label patch goes between the two."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import pulumi
import pulumi_command as command
from pydantic import Field, model_validator

from proxmox_gpu_cluster.args import ComponentArgs, Input
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.core.spec_base import HostName, Name
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import caller_dependencies
from proxmox_gpu_cluster.render.agent_bundle import installed_step, step_command
from proxmox_gpu_cluster.render.guest_scripts import mig_args
from proxmox_gpu_cluster.render.host_scripts import mig_restart_args
from proxmox_gpu_cluster.ssh import connection as ssh_connection

AGENT_WAIT_SECONDS = 600
"""How long the restart step waits for the VM's QEMU guest agent after a start."""
FORMER_TYPE = "proxmox-gpu-cluster:mig_rollout:MigRollout"
"""Until 2026-11 one two-phase component of this type (named as both of these) held all three steps."""
ConfigMapName = Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253)]
LabelValue = Annotated[str, Field(pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$", max_length=63)]


class MigVm(ComponentArgs):
    """The worker's VM, for the Proxmox-side restart that applies a pending MIG mode."""

    vmid: Input[int] = Field(description="The VM's Proxmox id (``GpuWorkerVm.vm_id``).")
    host: Input[HostName] = Field(description="The SSH address of the Proxmox node the VM runs on.")
    ssh_user: str = Field(description="The Proxmox node's SSH user (root, or passwordless sudo).")
    guest_user: str = Field(description="The guest's SSH user (whose agent copy holds the guest's MIG step).")


class MigStepArgs(ComponentArgs):
    """What both halves of a MIG rollout run on the node: the geometry and how to reach the node."""

    bootstrap: GuestBootstrapSpec = Field(
        description="The node's bootstrap spec: its name, API endpoint and ``rollout`` settings (required)."
    )
    mig_config: LabelValue = Field(description="The node's new ``nvidia.com/mig.config`` label value.")
    operator_namespace: Name = Field(description="The GPU Operator's namespace (mig-manager's logs).")
    timeout_seconds: int = Field(ge=1, le=7200, description="How long the end step waits for mig-manager.")
    host: Input[HostName] = Field(description="The node's SSH address (``GuestBootstrap.host``).")
    user: str = Field(description="The node's SSH user (passwordless sudo).")
    ssh_private_key: Input[str] | None = Field(
        description="SSH private key (a secret); None means the ssh-agent (``proxmox.sshAgent``): no step carries "
        "a key."
    )
    port: int = Field(default=22, ge=1, le=65535, description="The node's SSH port.")
    replace_with: Sequence[pulumi.Resource] = Field(
        default=(),
        description="What makes a fresh machine (the bootstrap's final step). A per-child option that ``opts`` "
        "cannot carry.",
    )

    @model_validator(mode="after")
    def _rollout(self) -> MigStepArgs:
        if self.bootstrap.rollout is None:
            raise SpecViolations([Problem("bootstrap.rollout", "a MIG rollout needs rollout settings")])
        return self


class MigDrainArgs(MigStepArgs):
    """The begin step's arguments."""


class MigSettleArgs(MigStepArgs):
    """The restart and end steps' arguments."""

    vm: MigVm | None = Field(
        default=None, description="The worker's VM, for the restart step (a worker with MIG modes)."
    )
    mig_config_map: ConfigMapName | None = Field(
        default=None,
        description="The mig-parted ConfigMap that names ``mig_config`` (``GpuOperator.mig_config``, or the "
        "operator's ``default-mig-parted-config``): until the node's mig-manager reads it, the end step waits "
        "through its ``failed`` (a new custom geometry reaches mig-manager only with the release, after the label). "
        "None: every ``failed`` fails at once.",
    )
    child_prefix: str | None = Field(
        default=None,
        description="The steps are named ``<child_prefix>-restart`` and ``<child_prefix>-end`` (default prefix: the "
        "name); GpuCluster passes its node's ``MigDrain`` name, which the steps had as prefix before.",
    )


def _mig_step(
    name: str,
    phase: str,
    args: MigStepArgs,
    limit: int,
    *,
    parent: pulumi.Resource,
    opts: pulumi.ResourceOptions,
    config_map: str | None = None,
) -> command.remote.Command:
    a = args
    argv = mig_args(a.bootstrap, phase, a.mig_config, a.timeout_seconds, a.operator_namespace, config_map=config_map)
    return command.remote.Command(
        f"{name}-{phase}",
        command.remote.CommandArgs(
            connection=ssh_connection(a.host, a.user, a.ssh_private_key, a.port),
            create=step_command(a.user, "mig", argv),
        ),
        opts=pulumi.ResourceOptions.merge(
            pulumi.ResourceOptions(
                parent=parent,
                replace_with=list(a.replace_with),
                # The script bounds its waits; the command must not give up first.
                custom_timeouts=pulumi.CustomTimeouts(create=f"{limit}s", update=f"{limit}s"),
            ),
            opts,
        ),
    )


class MigDrain(pulumi.ComponentResource):
    """``<name>-begin`` over SSH on the node (``guest_mig.sh``): when the node already runs another geometry, take
    a rollout slot, cordon and drain it (a first provisioning takes none); with MIG modes
    (``bootstrap.mig_modes``) it also sets each GPU's mode after the drain. Pass this component to the node's
    label patch (``GpuNodeLabels`` ``node_ready``) so the label changes only after it, then create the node's
    ``MigSettle`` (same name) after the label patch. The geometry is in the command, so it runs again exactly when
    the geometry changes. It acts as the node itself (kubelet's credential on the machine, with the cluster's
    ``NodeStepAccess``), so it carries no credential; it runs the node agent's ``mig`` bundle, which the node's
    ``GuestBootstrap`` installs.
    """

    begin: command.remote.Command
    """The drain step; the label patch waits for it."""

    def __init__(self, name: str, args: MigDrainArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the command provider in ``opts.provider``; ``opts.depends_on`` (the node's ``GuestBootstrap``,
        ``NodeStepAccess``) reaches the step."""
        # The begin step keeps its URN: this component answers to the former two-phase component's.
        own = pulumi.ResourceOptions(aliases=[pulumi.Alias(type_=FORMER_TYPE)])
        require_cli()  # before anything registers
        super().__init__(
            "proxmox-gpu-cluster:mig_rollout:MigDrain", name, None, pulumi.ResourceOptions.merge(opts, own)
        )
        rollout = args.bootstrap.rollout
        limit = (rollout.wait_seconds + rollout.drain_timeout_seconds if rollout else 0) + 300
        after = pulumi.ResourceOptions(depends_on=caller_dependencies(opts))
        self.begin = _mig_step(name, "begin", args, limit, parent=self, opts=after)
        self.register_outputs({})


class MigSettle(pulumi.ComponentResource):
    """After the node's ``nvidia.com/mig.config`` label patch (pass it in ``opts.depends_on``, with the node's
    ``MigDrain``): with ``vm`` and MIG modes, ``<name>-restart`` runs on the VM's Proxmox node: it asks the guest
    (QEMU guest agent) whether a mode waits for a GPU reset and only then stops and starts the VM (a new QEMU
    process resets the passed-through GPUs), so a re-run does nothing. Before a restart the guest holds the node:
    unless the drain already did, it takes a rollout slot, cordons and drains it (no slot or no drain in time fails
    the step and restarts nothing), so a VM with workloads is never stopped outside a slot; in operator driver mode it
    also waits, bounded, for the driver container and mig-manager's report. Then ``<name>-end`` on the node: for a
    node the drain or the restart step cordoned, wait (bounded) for the new label and
    ``nvidia.com/mig.config.state=success`` (after the restart), then uncordon and free the slot; ``failed`` fails
    the update naming the node, the geometry and mig-manager's logs, and the node stays cordoned.
    mig-manager must see the new label before the VM restarts, or it would put back the old
    mode at its start: hence the label patch in between.

    Its steps keep the URNs they had under the former two-phase component (``MigRollout``, named as the node's
    ``MigDrain``, which was their ``child_prefix``): each carries an alias to that parent, so ``pulumi up``
    neither replaces nor re-runs them.
    """

    settled: pulumi.Output[str]
    """What the end step printed (``mig: <node> runs <geometry> ...`` or that nothing was waited for)."""
    restart: command.remote.Command | None
    """The VM restart step (with ``vm`` and MIG modes), else None."""

    def __init__(self, name: str, args: MigSettleArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the command provider in ``opts.provider`` (both steps inherit it); ``opts.depends_on``: the
        node's ``MigDrain`` and label patch, the GPU Operator's release (a new custom geometry reaches mig-manager
        with it), and with ``vm`` the node agent's copy on the VM's Proxmox node."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:mig_rollout:MigSettle", name, None, opts)
        prefix = args.child_prefix or name
        former = pulumi.Alias(parent=self.urn.apply(lambda urn: _former_parent(urn, prefix)))
        previous = pulumi.ResourceOptions(depends_on=caller_dependencies(opts), aliases=[former])
        self.restart = None
        vm, b = args.vm, args.bootstrap
        if vm is not None and b.mig_modes:
            guest = mig_args(b, "restart", args.mig_config, args.timeout_seconds, args.operator_namespace)
            step = installed_step(vm.guest_user, "mig")

            def restart_command(vmid: int) -> str:
                restart = mig_restart_args(vmid, b.node_name, AGENT_WAIT_SECONDS, step, guest)
                return step_command(vm.ssh_user, "mig-restart", restart)

            vmid = vm.vmid
            create = (
                restart_command(vmid)
                if isinstance(vmid, int)
                else pulumi.Output.all(vmid).apply(lambda v: restart_command(int(v[0])))
            )
            # Two guest-agent waits, two guest runs (each up to the longer of the agent's wait and the guest's own
            # timeout, mig_restart.sh; the first also holds the node: slot wait and drain), the shutdown (qm's
            # 300 s), and slack.
            hold = b.rollout.wait_seconds + b.rollout.drain_timeout_seconds if b.rollout else 0
            limit = 2 * AGENT_WAIT_SECONDS + 2 * (max(AGENT_WAIT_SECONDS, args.timeout_seconds) + 60) + hold + 600
            self.restart = command.remote.Command(
                f"{prefix}-restart",
                command.remote.CommandArgs(
                    connection=ssh_connection(vm.host, vm.ssh_user, args.ssh_private_key), create=create
                ),
                opts=pulumi.ResourceOptions.merge(
                    pulumi.ResourceOptions(
                        parent=self,
                        replace_with=list(args.replace_with),
                        custom_timeouts=pulumi.CustomTimeouts(create=f"{limit}s", update=f"{limit}s"),
                    ),
                    previous,
                ),
            )
            previous = pulumi.ResourceOptions(depends_on=[self.restart], aliases=[former])
        # After the restart step; else after the drain and the label patch: end polls for the new label itself.
        end = _mig_step(
            prefix, "end", args, args.timeout_seconds + 300, parent=self, opts=previous, config_map=args.mig_config_map
        )
        self.settled = end.stdout
        self.register_outputs({"settled": self.settled})


def _former_parent(urn: str, name: str) -> str:
    """The URN of the former two-phase component called ``name``, a sibling of the component at ``urn``: the same
    parents, its type (the last of the chain) and name replaced."""
    head, _, _ = urn.rpartition("::")
    stack_project, _, chain = head.rpartition("::")
    parents, _, _ = chain.rpartition("$")
    return f"{stack_project}::{f'{parents}$' if parents else ''}{FORMER_TYPE}::{name}"
