"""NodeCapacityGate: after the GPU stack is applied, wait until a node advertises what the plan says it will."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.render.guest_scripts import capacity_args, capacity_script
from proxmox_gpu_cluster.render.host_scripts import remote_command
from proxmox_gpu_cluster.ssh import connection as ssh_connection


class NodeCapacityGate(pulumi.ComponentResource):
    """Runs ``guest_capacity.sh`` on the node over SSH: a bounded wait until ``.status.allocatable`` holds every
    expected resource count, read with kubelet's own credential. On timeout the update fails naming the node, the
    expected and seen counts and the likely cause (MIG pending or failed, device-plugin config label missing,
    operator not ready). A new expectation (sharing, MIG geometry) is a new command line, so the gate runs again.
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
        ssh_private_key: pulumi.Input[str],
        port: int = 22,
        timeout_seconds: int = 600,
        device_plugin_config: str | None = None,
        replace_with: Sequence[pulumi.Resource] = (),
        depends_on: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """``resources``: extended resource -> count the node must advertise (the capacity table's row).
        ``device_plugin_config``: the config label the node should carry, to name a missing label as the cause.
        ``depends_on``: the GPU stack (operator release, the node's labels). ``replace_with``: the VM."""
        super().__init__("proxmox-gpu-cluster:capacity_gate:NodeCapacityGate", name, None, opts)
        args = capacity_args(node_name, resources, timeout=timeout_seconds, device_plugin_config=device_plugin_config)
        limit = f"{timeout_seconds + 300}s"
        check = command.remote.Command(
            f"{name}-check",
            command.remote.CommandArgs(
                connection=ssh_connection(host, user, ssh_private_key, port),
                create=remote_command(user, args),
                stdin=capacity_script(),
            ),
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=provider,
                depends_on=list(depends_on),
                replace_with=list(replace_with),
                # The wait is bounded by the script; the command must not give up first.
                custom_timeouts=pulumi.CustomTimeouts(create=limit, update=limit),
            ),
        )
        self.verified = check.stdout
        self.register_outputs({"verified": self.verified})
