"""WorkerRetirement: drain, reset and remove a worker VM's Kubernetes node before the VM is destroyed or replaced."""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.core.spec import DrainSpec
from proxmox_gpu_cluster.node_agent import agent_unless_installed
from proxmox_gpu_cluster.render.agent_bundle import installed_step, step_command
from proxmox_gpu_cluster.render.guest_scripts import drain_args
from proxmox_gpu_cluster.render.host_scripts import retire_args
from proxmox_gpu_cluster.ssh import connection as ssh_connection


class WorkerRetirement(pulumi.ComponentResource):
    """A command whose *delete* retires the node: on the VM's Proxmox node, the node agent's ``retire`` step runs
    the guest's installed ``drain`` step (the guest's own agent copy) through the QEMU guest agent: cordon, drain
    (evictions: PodDisruptionBudgets are respected; bounded by ``drain.timeout_seconds``, failing with the pods that
    block), deletion of the Node object, ``kubeadm reset``. Its create step proves the guest agent
    answers and the drain step is installed.

    Order comes from the dependency graph: pass the node's bootstrap and label patch in ``depends_on`` (this is
    deleted before them, so nothing is taken from a node that still runs pods, and the guest's agent copy is in place
    whenever the command changes), and the VM in ``replace_with`` (a replaced VM, which is deleted first, takes this
    with it, so the drain runs before the old VM goes). A VM that is already down, or whose agent no longer answers,
    does not block the destroy: the step warns that the node was not drained and names the ``kubectl delete node``
    to run.

    The guest acts as the node itself (kubelet's credential there, with the cluster's ``NodeStepAccess``: put it
    in ``depends_on`` too), so no credential passes through this step; ``protect`` should follow the VM's, so
    removing a protected worker stops before anything is drained.
    """

    ready: pulumi.Output[str]
    """The create step's report (``retire: ready: ...``)."""

    def __init__(
        self,
        name: str,
        *,
        node_name: str,
        vmid: int,
        host: pulumi.Input[str],
        ssh_user: str,
        guest_user: str,
        ssh_private_key: pulumi.Input[str] | None,
        api_endpoint: str,
        drain: DrainSpec,
        kubeadm_reset: bool,
        provider: command.Provider,
        protect: bool = False,
        replace_with: Sequence[pulumi.Resource] = (),
        depends_on: Sequence[pulumi.Resource] = (),
        host_agent_installed: bool = False,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """``node_name``: the Kubernetes node (the VM name). ``host``/``ssh_user``: the Proxmox node the VM runs on
        (root, or passwordless sudo). ``api_endpoint``: the API server ``host:port`` the node joined through (kubectl
        in the guest uses it). ``kubeadm_reset``: the node joined with kubeadm. ``ssh_private_key``: None means the
        ssh-agent (``proxmox.sshAgent``), and no step carries a key."""
        super().__init__("proxmox-gpu-cluster:worker_retirement:WorkerRetirement", name, None, opts)
        guest = drain_args(node_name, api_endpoint, drain, kubeadm_reset)
        guest_step = installed_step(guest_user, "drain")

        def run(*, check: bool) -> str:
            args = retire_args(vmid, node_name, drain.timeout_seconds, guest_step, guest, check=check)
            return step_command(ssh_user, "retire", args)

        connection = ssh_connection(host, ssh_user, ssh_private_key)
        after = [*depends_on, *agent_unless_installed(
            host_agent_installed, f"{name}-host-agent", "host", connection=connection, provider=provider, parent=self
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
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=provider,
                protect=protect,
                replace_with=list(replace_with),
                depends_on=after,
            ),
        )
        self.ready = step.stdout
        self.register_outputs({"ready": self.ready})
