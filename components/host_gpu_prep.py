"""ProxmoxHostGpuPrep: IOMMU, vfio and driver blacklist on a Proxmox node, one reboot if needed, then verify."""

from __future__ import annotations

import pulumi
import pulumi_command as command

from components.host_scripts import REBOOT_SCHEDULED, parse_groups, prep_args, remote_command, script, verify_args
from components.spec import ClusterSpec
from components.ssh import connection as ssh_connection
from components.ssh import reboot_wait_args


class ProxmoxHostGpuPrep(pulumi.ComponentResource):
    """Three steps over SSH, each waiting for the previous one:

    1. ``prep``: host_prep.sh writes kernel arguments, vfio modules, blacklist and vfio-pci ids, rebuilds the
       initramfs and schedules a reboot only when something changed (or the running kernel lacks the args).
    2. ``wait``: where ``pulumi up`` runs, waits for the node to go down and answer again (bounded), if and only
       if step 1 scheduled a reboot.
    3. ``verify``: host_verify.sh checks IOMMU, interrupt remapping, vfio-pci binding and IOMMU-group isolation
       and reports each GPU's group, which the PCI mappings use when the preflight could not read them.

    Failures name the step and what was seen (the scripts print ``host-prep: <step>: ...``).
    """

    reboot: pulumi.Output[bool]
    """Whether this run rebooted the node."""
    groups: pulumi.Output[dict[str, int]]
    """PCI path -> IOMMU group, as verified on the host."""

    def __init__(
        self,
        name: str,
        spec: ClusterSpec,
        node_name: str,
        *,
        provider: command.Provider,
        ssh_private_key: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("proxmox-gpu-cluster:host_gpu_prep:ProxmoxHostGpuPrep", name, None, opts)
        node = spec.node(node_name)
        user = spec.proxmox.ssh_user
        connection = ssh_connection(node.ssh_address, user, ssh_private_key)
        prep = command.remote.Command(
            f"{name}-prep",
            command.remote.CommandArgs(
                connection=connection,
                create=remote_command(user, prep_args(spec, node)),
                stdin=script("host_prep.sh"),
            ),
            opts=pulumi.ResourceOptions(parent=self, provider=provider),
        )
        wait = command.local.Command(
            f"{name}-wait",
            # Each prep run may have rebooted the node, so waiting (and verifying) runs again after it.
            reboot_wait_args(node.ssh_address, 22, prep.stdout, triggers=[prep.stdout]),
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[prep]),
        )
        verify = command.remote.Command(
            f"{name}-verify",
            command.remote.CommandArgs(
                connection=connection,
                create=remote_command(user, verify_args(spec, node)),
                stdin=script("host_verify.sh"),
                triggers=[prep.stdout],
            ),
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[wait]),
        )
        self.reboot = prep.stdout.apply(lambda out: REBOOT_SCHEDULED in out)
        self.groups = verify.stdout.apply(parse_groups)
        self.register_outputs({"reboot": self.reboot, "groups": self.groups})
