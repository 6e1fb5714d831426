"""WorkerRetirement: drain, reset and remove a worker VM's Kubernetes node before the VM is destroyed or replaced."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_command as command
from pydantic import Field

from proxmox_gpu_cluster.args import ComponentArgs, Input
from proxmox_gpu_cluster.core.spec import DrainSpec
from proxmox_gpu_cluster.core.spec_base import ApiEndpoint, HostName, Name
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import agent_unless_installed, caller_dependencies
from proxmox_gpu_cluster.render.agent_bundle import installed_step, step_command
from proxmox_gpu_cluster.render.guest_scripts import drain_args
from proxmox_gpu_cluster.render.host_scripts import retire_args
from proxmox_gpu_cluster.ssh import connection as ssh_connection


class WorkerRetirementArgs(ComponentArgs):
    """Which worker VM's node to retire, and how to reach the VM's Proxmox node."""

    node_name: Input[Name] = Field(description="The Kubernetes node: the VM name (``GpuWorkerVm.node_name``).")
    vmid: Input[int] = Field(description="The VM's Proxmox id (``GpuWorkerVm.vm_id``).")
    host: Input[HostName] = Field(description="SSH address of the Proxmox node the VM runs on.")
    ssh_user: str = Field(description="SSH user on that Proxmox node (root, or passwordless sudo).")
    guest_user: str = Field(description="The guest's SSH user (its home holds the guest's agent copy).")
    ssh_private_key: Input[str] | None = Field(
        description="SSH private key (a secret); None means the ssh-agent (``proxmox.sshAgent``): no step "
        "carries a key."
    )
    api_endpoint: ApiEndpoint = Field(
        description="The API server ``host:port`` the node joined through (kubectl in the guest uses it)."
    )
    drain: DrainSpec = Field(description="How the node is drained.")
    kubeadm_reset: bool = Field(description="The node joined with kubeadm: ``kubeadm reset`` after the drain.")
    replace_with: Sequence[pulumi.Resource] = Field(
        default=(),
        description="The VM (``GpuWorkerVm.vm``): replacing it (delete first) takes this step with it, so the drain "
        "runs before the old VM goes. A per-child option that ``opts`` cannot carry.",
    )
    host_agent_installed: bool = Field(
        default=False,
        description="The node agent is already on the Proxmox node (its copy in ``opts.depends_on``); otherwise "
        "this component installs it (``<name>-host-agent``).",
    )


class WorkerRetirement(pulumi.ComponentResource):
    """A command whose *delete* retires the node: on the VM's Proxmox node, the node agent's ``retire`` step runs
    the guest's installed ``drain`` step (the guest's own agent copy) through the QEMU guest agent: cordon, drain
    (evictions: PodDisruptionBudgets are respected; bounded by ``drain.timeout_seconds``, failing with the pods that
    block), deletion of the Node object, ``kubeadm reset``. Its create step proves the guest agent
    answers and the drain step is installed.

    Order comes from the dependency graph: pass the node's bootstrap and label patch in ``opts.depends_on`` (this is
    deleted before them, so nothing is taken from a node that still runs pods, and the guest's agent copy is in place
    whenever the command changes), and the VM in ``replace_with`` (a replaced VM, which is deleted first, takes this
    with it, so the drain runs before the old VM goes). Only a guest that ``qm`` reports gone (the VM stopped or
    not on the node, no guest agent configured, the agent not running on any of 5 tries) does not block the
    destroy: the step warns that the node was not drained and names the ``kubectl delete node`` to run; any other
    ``qm`` failure is tried again and then fails the step.

    The guest acts as the node itself (kubelet's credential there, with the cluster's ``NodeStepAccess``: put it
    in ``opts.depends_on`` too), so no credential passes through this step; ``opts.protect`` should follow the VM's
    (the step inherits it), so removing a protected worker stops before anything is drained.
    """

    ready: pulumi.Output[str]
    """The create step's report (``retire: ready: ...``)."""

    def __init__(self, name: str, args: WorkerRetirementArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the command provider in ``opts.provider``; ``opts.depends_on`` (the node's bootstrap, label
        patch, ``NodeStepAccess``) reaches the step; ``opts.protect`` reaches it too."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:worker_retirement:WorkerRetirement", name, None, opts)
        a = args
        guest_step = installed_step(a.guest_user, "drain")

        def run(check: bool) -> pulumi.Input[str]:
            def build(node: str, vmid: int) -> str:
                guest = drain_args(node, a.api_endpoint, a.drain, a.kubeadm_reset)
                args = retire_args(vmid, node, a.drain.timeout_seconds, guest_step, guest, check=check)
                return step_command(a.ssh_user, "retire", args)

            if isinstance(a.node_name, str) and isinstance(a.vmid, int):
                return build(a.node_name, a.vmid)  # plain values: a plain command
            return pulumi.Output.all(a.node_name, a.vmid).apply(lambda v: build(str(v[0]), int(v[1])))

        connection = ssh_connection(a.host, a.ssh_user, a.ssh_private_key)
        after = [*caller_dependencies(opts), *agent_unless_installed(
            a.host_agent_installed, f"{name}-host-agent", "host", connection=connection, parent=self,
            depends_on=caller_dependencies(opts),
        )]  # fmt: skip
        step = command.remote.Command(
            f"{name}-drain",
            command.remote.CommandArgs(
                connection=connection,
                create=run(check=True),
                delete=run(check=False),
                # The delete step would otherwise get the create step's output in its environment.
                add_previous_output_in_env=False,
            ),
            opts=pulumi.ResourceOptions(parent=self, replace_with=list(a.replace_with), depends_on=after),
        )
        self.ready = step.stdout
        self.register_outputs({"ready": self.ready})
