"""NodeCapacityGate: after the GPU stack is applied, wait until a node advertises what the plan says it will."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.node_agent import agent_unless_installed
from proxmox_gpu_cluster.render.agent_bundle import step_command
from proxmox_gpu_cluster.render.guest_scripts import capacity_args
from proxmox_gpu_cluster.ssh import connection as ssh_connection


class NodeCapacityGate(pulumi.ComponentResource):
    """Runs ``guest_capacity.sh`` on the node over SSH: a bounded wait until ``.status.allocatable`` holds every
    expected resource count, read with kubelet's own credential. On timeout the update fails naming the node, the
    expected and seen counts and the likely cause (MIG pending or failed, device-plugin config label missing,
    operator not ready). A new expectation (sharing, MIG geometry) is a new command line, so the gate runs again.
    Runs the node agent's ``capacity`` bundle: installed by the gate itself (``<name>-agent``) unless
    ``agent_installed`` says the node's ``GuestBootstrap`` did (then name it in ``depends_on``).
    """

    verified: pulumi.Output[str]
    """What the gate printed (``capacity: ok: <node> advertises ...``)."""

    def __init__(
        self,
        name: str,
        *,
        node_name: str,
        resources: Mapping[str, int],
        provider: command.Provider,
        host: pulumi.Input[str],
        user: str,
        ssh_private_key: pulumi.Input[str] | None,
        port: int = 22,
        timeout_seconds: int = 600,
        device_plugin_config: str | None = None,
        replace_with: Sequence[pulumi.Resource] = (),
        depends_on: Sequence[pulumi.Resource] = (),
        agent_installed: bool = False,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """``resources``: extended resource -> count the node must advertise (the capacity table's row).
        ``device_plugin_config``: the config label the node should carry, to name a missing label as the cause.
        ``depends_on``: the GPU stack (operator release, the node's labels). ``replace_with``: the VM.
        ``ssh_private_key``: None means the ssh-agent (``proxmox.sshAgent``), and no step carries a key."""
        super().__init__("proxmox-gpu-cluster:capacity_gate:NodeCapacityGate", name, None, opts)
        args = capacity_args(node_name, resources, timeout=timeout_seconds, device_plugin_config=device_plugin_config)
        limit = f"{timeout_seconds + 300}s"
        connection = ssh_connection(host, user, ssh_private_key, port)
        after = [*depends_on, *agent_unless_installed(
            agent_installed, f"{name}-agent", "guest", connection=connection, provider=provider, parent=self,
            replace_with=replace_with,
        )]  # fmt: skip
        check = command.remote.Command(
            f"{name}-check",
            command.remote.CommandArgs(
                connection=connection,
                create=step_command(user, "capacity", args),
            ),
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=provider,
                depends_on=after,
                replace_with=list(replace_with),
                # The wait is bounded by the script; the command must not give up first.
                custom_timeouts=pulumi.CustomTimeouts(create=limit, update=limit),
            ),
        )
        self.verified = check.stdout
        self.register_outputs({"verified": self.verified})


@dataclass(frozen=True)
class GateTarget:
    """One node for ``NodeCapacityGates``: what it must advertise and how to reach it."""

    resources: Mapping[str, int]
    """Extended resource -> count (the capacity table's row)."""
    host: pulumi.Input[str]
    user: str
    device_plugin_config: str | None = None
    ready: Sequence[pulumi.Resource] = ()
    """This node's own prerequisites (its labels), waited for by its gate alone."""
    replace_with: Sequence[pulumi.Resource] = ()
    agent_installed: bool = False
    """Whether the node agent is already on the node (its ``GuestBootstrap.agent``, in ``ready``)."""


class NodeCapacityGates(pulumi.ComponentResource):
    """A ``NodeCapacityGate`` per node, all after ``after`` (the GPU stack: the operator release).

    Why a group: Pulumi's Python SDK checks every dependency edge for a cycle by walking everything behind its
    target (``pulumi/runtime/resource_cycle_breaker.py``), and the operator release waits for every node's labels,
    so one edge to it per node cost time quadratic in the nodes (a third of a 1000-worker plan). The group takes
    that edge once; its children are ordered after it because the SDK registers a child only once its parent's URN
    is known, and a component's registration waits for its ``depends_on`` (``prepare_resource`` in
    ``pulumi/runtime/resource.py``; pulumi/pulumi#7833). The recorded plan follows parents, so it shows the order.
    """

    gates: dict[str, NodeCapacityGate]
    """Node name -> its gate."""

    def __init__(
        self,
        name: str,
        targets: Mapping[str, GateTarget],
        *,
        provider: command.Provider,
        ssh_private_key: pulumi.Input[str] | None,
        timeout_seconds: int = 600,
        after: Sequence[pulumi.Resource] = (),
        child_prefix: str | None = None,
        child_aliases: Sequence[pulumi.Alias] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """Gates are named ``<child_prefix>-<node>-capacity`` (default prefix: ``name``). ``child_aliases``: where
        they were before this group existed (GpuCluster passes ``Alias(parent=<itself>)``). ``ssh_private_key``:
        None means the ssh-agent (``proxmox.sshAgent``), and no step carries a key."""
        super().__init__(
            "proxmox-gpu-cluster:capacity_gate:NodeCapacityGates",
            name,
            None,
            pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=list(after))),
        )
        prefix = child_prefix or name
        self.gates = {
            node: NodeCapacityGate(
                f"{prefix}-{node}-capacity",
                node_name=node,
                resources=target.resources,
                provider=provider,
                host=target.host,
                user=target.user,
                ssh_private_key=ssh_private_key,
                timeout_seconds=timeout_seconds,
                device_plugin_config=target.device_plugin_config,
                replace_with=target.replace_with,
                depends_on=target.ready,
                agent_installed=target.agent_installed,
                opts=pulumi.ResourceOptions(parent=self, aliases=list(child_aliases)),
            )
            for node, target in targets.items()
        }
        self.register_outputs({})
