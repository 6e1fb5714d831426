"""ProxmoxHostGpuPrep: IOMMU, vfio-pci by PCI address on a Proxmox node, a reboot only if needed, then verify."""

from __future__ import annotations

from typing import Annotated

import pulumi
import pulumi_command as command
from pydantic import Field

from proxmox_gpu_cluster.args import ComponentArgs, Input
from proxmox_gpu_cluster.core.spec import ProxmoxNode
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import caller_dependencies, install_agent
from proxmox_gpu_cluster.render.agent_bundle import step_command
from proxmox_gpu_cluster.render.host_scripts import (
    OWNER,
    REBOOT_REQUIRED,
    REBOOT_SCHEDULED,
    parse_groups,
    prep_args,
    release_args,
    verify_args,
)
from proxmox_gpu_cluster.ssh import connection as ssh_connection
from proxmox_gpu_cluster.ssh import reboot_wait_args


class ProxmoxHostGpuPrepArgs(ComponentArgs):
    """One Proxmox node's host prep: the node as the spec describes it, whose claim it is, how to reach it."""

    node: ProxmoxNode = Field(
        description="The Proxmox node as the spec describes it; nothing else feeds host prep, so no change to the "
        "workers can change (and so re-run or reboot) it."
    )
    owner: Annotated[str, Field(pattern=OWNER.pattern)] = Field(
        description="The stack's or cluster's scope token (``core/names.py`` ``StackScope.token``), whose claim on "
        "the node this is."
    )
    ssh_user: str = Field(description="root, or a user with passwordless sudo.")
    ssh_private_key: Input[str] | None = Field(
        description="SSH private key (a secret); None means the ssh-agent (``proxmox.sshAgent``): no step carries "
        "a key."
    )


class ProxmoxHostGpuPrep(pulumi.ComponentResource):
    """Three steps over SSH, each waiting for the previous one, after ``<name>-agent`` (the node agent's host
    bundles copied to the node once; each step runs its bundle by fingerprint, see ``render/agent_bundle.py``):

    1. ``prep``: host_prep.sh decides the IOMMU from what runs (populated /sys/kernel/iommu_groups, the kernel
       version): AMD's IOMMU is on by default and Intel's from kernel 6.8, so it adds ``intel_iommu=on`` only on
       an older Intel kernel (or one with the IOMMU off) and ``iommu=pt`` only when ``iommuPassthrough`` asks;
       it binds exactly the declared GPUs' PCI functions to vfio-pci by address (driver_override from vfio-pci's
       modprobe install command, softdeps before the host drivers; never ``ids=``, which would take a console GPU
       of the same model), blacklists the host drivers only when every NVIDIA card is passed through, rebuilds the
       initramfs, binds at runtime when the IOMMU is on, and reboots only when the running kernel lacks a wanted
       argument (or a GPU will not unbind), and then only as ``rebootPolicy`` allows (``when-idle``: no VM or
       container running; otherwise the step fails naming them).
    2. ``wait``: where ``pulumi up`` runs, waits for the node to go down and answer again (bounded), if and only
       if step 1 scheduled a reboot.
    3. ``verify``: host_verify.sh checks IOMMU, interrupt remapping, vfio-pci binding and IOMMU-group isolation
       and reports each GPU's group, which the PCI mappings use when the preflight could not read them.

    Several owners (stacks, or clusters of one program) may prepare one node: each run records ``owner``'s claim
    (its GPUs, ``iommuPassthrough``, ``acsOverride``) in its own drop-in there and writes the node's files from the
    union of all claims. Destroying this component releases the claim (the prep step's delete removes the drop-in
    only; the next host prep of another owner writes the node's files without its GPUs; nothing is unbound or
    rebooted then).

    Failures name the step, what was expected and what was seen (``host-prep: <what>: expected <x>, saw <y>``).
    """

    reboot: pulumi.Output[bool]
    """Whether this run rebooted the node."""
    reboot_required: pulumi.Output[bool]
    """Whether the node still needs a reboot that ``rebootPolicy: never`` left to you."""
    groups: pulumi.Output[dict[str, int]]
    """PCI path -> IOMMU group, as verified on the host."""
    agent: command.remote.CopyToRemote
    """The node agent's copy on the node; other steps on the node (large-BAR window, retirement) can wait for it."""

    def __init__(self, name: str, args: ProxmoxHostGpuPrepArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the command provider in ``opts.provider`` (every step inherits it); ``opts.depends_on`` reaches
        the agent copy, and so every step."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:host_gpu_prep:ProxmoxHostGpuPrep", name, None, opts)
        node, user, owner = args.node, args.ssh_user, args.owner
        connection = ssh_connection(node.ssh_address, user, args.ssh_private_key)
        agent = self.agent = install_agent(
            f"{name}-agent", "host", connection=connection, parent=self, depends_on=caller_dependencies(opts)
        )
        prep = command.remote.Command(
            f"{name}-prep",
            command.remote.CommandArgs(
                connection=connection,
                create=step_command(user, "host-prep", prep_args(node, owner=owner)),
                # Destroying host prep releases the owner's claim (its drop-in); a changed input is an update,
                # which runs create again and never this.
                delete=step_command(user, "host-prep", release_args(owner)),
                # The delete step would otherwise get the create step's output in its environment.
                add_previous_output_in_env=False,
            ),
            # A forced replacement (pulumi up --replace) releases first, so the old claim's release never removes
            # the claim the new create just recorded.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[agent], delete_before_replace=True),
        )
        wait = command.local.Command(
            f"{name}-wait",
            # Each prep run may have rebooted the node, so waiting (and verifying) runs again after it.
            reboot_wait_args(node.ssh_address, 22, prep.stdout, triggers=[prep.stdout]),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[prep]),
        )
        verify = command.remote.Command(
            f"{name}-verify",
            command.remote.CommandArgs(
                connection=connection,
                create=step_command(user, "host-verify", verify_args(node)),
                triggers=[prep.stdout],
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[wait]),
        )
        self.reboot = prep.stdout.apply(lambda out: REBOOT_SCHEDULED in (out or ""))
        self.reboot_required = prep.stdout.apply(lambda out: REBOOT_REQUIRED in (out or ""))
        self.groups = verify.stdout.apply(lambda out: parse_groups(out or ""))
        self.register_outputs({"reboot": self.reboot, "rebootRequired": self.reboot_required, "groups": self.groups})
