"""NodeCapacityGate: after the GPU stack is applied, wait until a node advertises what the plan says it will."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated

import pulumi
import pulumi_command as command
from pydantic import Field

from proxmox_gpu_cluster.args import ComponentArgs, Input
from proxmox_gpu_cluster.core.spec_base import EXTENDED_RESOURCE, HostName, Name
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import agent_unless_installed, caller_dependencies
from proxmox_gpu_cluster.render.agent_bundle import step_command
from proxmox_gpu_cluster.render.guest_scripts import capacity_args
from proxmox_gpu_cluster.ssh import connection as ssh_connection

ResourceCounts = Mapping[Annotated[str, Field(pattern=EXTENDED_RESOURCE, max_length=253)], Annotated[int, Field(ge=0)]]
ConfigName = Annotated[str, Field(pattern=r"^[-._a-zA-Z0-9]{1,253}$")]
TIMEOUT_SECONDS = Field(default=600, ge=1, le=7200, description="How long the gate waits (the script bounds it).")
SSH_PRIVATE_KEY = Field(
    description="SSH private key (a secret); None means the ssh-agent (``proxmox.sshAgent``): no step carries a key."
)


class GateTarget(ComponentArgs):
    """One node for ``NodeCapacityGates``: what it must advertise and how to reach it."""

    resources: ResourceCounts = Field(
        min_length=1, description="Extended resource -> count the node must advertise (the capacity table's row)."
    )
    host: Input[HostName] = Field(description="The node's SSH address (``GuestBootstrap.host``).")
    user: str = Field(description="The node's SSH user (passwordless sudo).")
    port: int = Field(default=22, ge=1, le=65535, description="The node's SSH port.")
    device_plugin_config: ConfigName | None = Field(
        default=None, description="The device-plugin config label the node should carry, to name a missing one."
    )
    ready: Sequence[pulumi.Resource] = Field(
        default=(),
        description="This node's own prerequisites (its labels, its agent copy), waited for by its gate alone: "
        "per-node ordering, which the group's ``opts.depends_on`` cannot express.",
    )
    replace_with: Sequence[pulumi.Resource] = Field(
        default=(), description="What makes a fresh machine (the bootstrap's final step): the gate runs again."
    )
    agent_installed: bool = Field(
        default=False,
        description="The node agent is already on the node (its ``GuestBootstrap.agent``, in ``ready``).",
    )


class NodeCapacityGateArgs(GateTarget):
    """One node's gate on its own."""

    node_name: Input[Name] = Field(description="The Kubernetes node (``GuestBootstrap.node_name``).")
    ssh_private_key: Input[str] | None = SSH_PRIVATE_KEY
    timeout_seconds: int = TIMEOUT_SECONDS


class NodeCapacityGate(pulumi.ComponentResource):
    """Runs ``guest_capacity.sh`` on the node over SSH: a bounded wait until ``.status.allocatable`` holds every
    expected resource count, read with kubelet's own credential. On timeout the update fails naming the node, the
    expected and seen counts and the likely cause (MIG pending or failed, device-plugin config label missing,
    operator not ready). A new expectation (sharing, MIG geometry) is a new command line, so the gate runs again.
    Runs the node agent's ``capacity`` bundle: installed by the gate itself (``<name>-agent``) unless
    ``agent_installed`` says the node's ``GuestBootstrap`` did (then name it in ``ready`` or ``opts.depends_on``).
    """

    verified: pulumi.Output[str]
    """What the gate printed (``capacity: ok: <node> advertises ...``)."""

    def __init__(self, name: str, args: NodeCapacityGateArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the command provider in ``opts.provider``; ``opts.depends_on`` (the GPU stack: the operator
        release, the node's labels) reaches the gate's first steps."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:capacity_gate:NodeCapacityGate", name, None, opts)
        a = args

        def build(node: str) -> str:
            argv = capacity_args(
                node, a.resources, timeout=a.timeout_seconds, device_plugin_config=a.device_plugin_config
            )
            return step_command(a.user, "capacity", argv)

        node = a.node_name
        create = build(node) if isinstance(node, str) else pulumi.Output.all(node).apply(lambda v: build(str(v[0])))
        limit = f"{a.timeout_seconds + 300}s"
        connection = ssh_connection(a.host, a.user, a.ssh_private_key, a.port)
        first = [*caller_dependencies(opts), *a.ready]
        after = [*first, *agent_unless_installed(
            a.agent_installed, f"{name}-agent", "guest", connection=connection, parent=self,
            replace_with=a.replace_with, depends_on=first,
        )]  # fmt: skip
        check = command.remote.Command(
            f"{name}-check",
            command.remote.CommandArgs(connection=connection, create=create),
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=after,
                replace_with=list(a.replace_with),
                # The wait is bounded by the script; the command must not give up first.
                custom_timeouts=pulumi.CustomTimeouts(create=limit, update=limit),
            ),
        )
        self.verified = check.stdout
        self.register_outputs({"verified": self.verified})


class NodeCapacityGatesArgs(ComponentArgs):
    """Every node's gate, after one shared prerequisite (the group's ``opts.depends_on``)."""

    targets: Mapping[Name, GateTarget] = Field(description="Node name -> what it must advertise and how to reach it.")
    ssh_private_key: Input[str] | None = SSH_PRIVATE_KEY
    timeout_seconds: int = TIMEOUT_SECONDS
    child_prefix: str | None = Field(
        default=None, description="Gates are named ``<child_prefix>-<node>-capacity`` (default prefix: the name)."
    )
    child_aliases: Sequence[pulumi.Alias] = Field(
        default=(), description="Where the gates were before this group existed (``Alias(parent=...)``)."
    )


class NodeCapacityGates(pulumi.ComponentResource):
    """A ``NodeCapacityGate`` per node, all after ``opts.depends_on`` (the GPU stack: the operator release).

    Why a group: Pulumi's Python SDK checks every dependency edge for a cycle by walking everything behind its
    target (``pulumi/runtime/resource_cycle_breaker.py``), and the operator release waits for every node's labels,
    so one edge to it per node cost time quadratic in the nodes (a third of a 1000-worker plan). The group takes
    that edge once (its ``opts.depends_on``, which is not passed on to the gates); its children are ordered after it
    because the SDK registers a child only once its parent's URN is known, and a component's registration waits for
    its ``depends_on`` (``prepare_resource`` in ``pulumi/runtime/resource.py``; pulumi/pulumi#7833). The recorded
    plan follows parents, so it shows the order.
    """

    gates: dict[str, NodeCapacityGate]
    """Node name -> its gate."""

    def __init__(self, name: str, args: NodeCapacityGatesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the command provider in ``opts.provider`` (every gate inherits it); ``opts.depends_on``: what
        every gate waits for, through this group."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:capacity_gate:NodeCapacityGates", name, None, opts)
        prefix = args.child_prefix or name
        self.gates = {
            node: NodeCapacityGate(
                f"{prefix}-{node}-capacity",
                NodeCapacityGateArgs(
                    **dict(target),
                    node_name=node,
                    ssh_private_key=args.ssh_private_key,
                    timeout_seconds=args.timeout_seconds,
                ),
                pulumi.ResourceOptions(parent=self, aliases=list(args.child_aliases)),
            )
            for node, target in args.targets.items()
        }
        self.register_outputs({})
