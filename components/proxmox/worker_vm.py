"""GpuWorkerVm: a Proxmox VM with its GPUs passed through, ready for the guest bootstrap."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_command as command
import pulumi_proxmoxve as proxmoxve
from pydantic import Field, model_validator

from proxmox_gpu_cluster.args import ComponentArgs, Input
from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.spec_base import GpuModelKey, HostName
from proxmox_gpu_cluster.core.worker_spec import Worker
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import agent_unless_installed, caller_dependencies
from proxmox_gpu_cluster.render.agent_bundle import step_command
from proxmox_gpu_cluster.ssh import connection as ssh_connection

MMIO_MB = 65536
"""64-bit MMIO window for large-BAR GPUs (OVMF's default is too small for an A100/H100 BAR1)."""
LARGE_BAR_ARGS = f"-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string={MMIO_MB}"
BOOT_INPUTS = ("disks[*].fileId", "clone", "initialization.vendorDataFileId")
"""VM inputs that only matter at creation and that the provider would replace the VM for (they are ForceNew in
bpg/terraform-provider-proxmox): a new image or snippet name applies to new VMs only."""


class WorkerVmArgs(ComponentArgs):
    """What a GPU worker VM is made of, and the resources it is wired to (its GPUs' mappings, its boot files)."""

    worker: Worker = Field(description="The VM: id, node, size, image, network, GPU claims (by mapping key).")
    gpu_models: tuple[GpuModelKey, ...] = Field(
        min_length=1, description="Catalog model of each claimed GPU, in claim order (large BAR, tags)."
    )
    ssh_public_keys: tuple[str, ...] = Field(min_length=1, description="Keys cloud-init installs for the user.")
    mappings: Mapping[str, Input[str]] = Field(
        description="GPU name -> PCI mapping name (``GpuPciMappings.by_gpu[gpu].name``), for every claimed GPU."
    )
    vendor_data_file_id: Input[str] = Field(
        description="The vendor-data snippet's volume id (``WorkerBootFiles.vendor_data_file_id``)."
    )
    image_file_id: Input[str] | None = Field(
        default=None,
        description="The downloaded cloud image's volume id (``WorkerBootFiles.image_file_ids``); None when the "
        "worker clones a template.",
    )
    password_auth: bool = Field(
        default=False,
        description="The provider logs in as root@pam with a password, so the VM can carry raw kvm arguments "
        "(the large-BAR window); otherwise they are set with qm on the node over SSH.",
    )
    node_ssh_address: HostName | None = Field(
        default=None, description="SSH address of the VM's Proxmox node (large-BAR GPUs in token mode)."
    )
    node_ssh_user: str = Field(default="root", description="SSH user on the Proxmox node.")
    ssh_private_key: Input[str] | None = Field(
        default=None,
        description="SSH private key for the Proxmox node (a secret; large-BAR GPUs in token mode); None means the "
        "ssh-agent (``proxmox.sshAgent``): no step carries a key.",
    )
    host_agent_installed: bool = Field(
        default=False,
        description="The node agent is already on the Proxmox node (its copy in ``opts.depends_on``); otherwise the "
        "large-BAR step installs it (``<name>-host-agent``).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> WorkerVmArgs:
        problems = []
        if len(self.gpu_models) != len(self.worker.gpus):
            problems.append(Problem("gpu_models", f"one model per GPU claim ({len(self.worker.gpus)})"))
        if self.large_bar and not self.password_auth and self.node_ssh_address is None:
            problems.append(Problem("node_ssh_address", "a large-BAR GPU in token mode is set up over SSH on the node"))
        known = ", ".join(sorted(self.mappings)) or "none"
        problems += [
            Problem(f"worker.gpus[{i}]", f"no PCI mapping for GPU {claim.ref} in mappings (has: {known})")
            for i, claim in enumerate(self.worker.gpus)
            if claim.ref not in self.mappings
        ]
        if self.worker.image.cloud_image_url is not None and self.image_file_id is None:
            problems.append(Problem("image_file_id", "the worker boots from a cloud image: pass its downloaded file"))
        if problems:
            raise SpecViolations(problems)
        return self

    @property
    def large_bar(self) -> bool:
        """Whether any GPU has a BAR too large for OVMF's default MMIO window."""
        return any(CATALOG[m].large_bar for m in self.gpu_models)


def machine_type(worker: Worker) -> str:
    """q35 for every worker; KubeVirt workers also get an emulated Intel IOMMU (Proxmox's ``viommu=intel`` option),
    without which the guest has no IOMMU groups and cannot hand the GPU to its own VMs through vfio-pci
    (Proxmox VE admin guide, "vIOMMU"). The guest enables it with ``intel_iommu=on`` (guest bootstrap)."""
    return "q35,viommu=intel" if worker.workload != "container" else "q35"


def vm_tags(args: WorkerVmArgs) -> list[str]:
    """Proxmox tags: the project, the GPU models, then the spec's own tags (Proxmox stores them sorted)."""
    return sorted({"proxmox-gpu-cluster", *(m.lower() for m in args.gpu_models), *args.worker.tags})


class GpuWorkerVm(pulumi.ComponentResource):
    """A ``proxmoxve.VmLegacy`` (q35, OVMF without pre-enrolled keys, cpu host, no ballooning, GPUs by mapping).

    Day 2: a worker VM has a fixed vmid and holds its GPUs exclusively, so a new VM cannot exist beside the old
    one: it is replaced delete-first (``delete_before_replace``), and whatever must start over on a fresh machine
    lists ``vm`` in ``replace_with``. Its boot inputs (cloud image, template, vendor data) only matter when it is
    created, so changing them never replaces a running worker (``ignore_changes``; rebuild one with ``pulumi up
    --replace``). The provider never restarts it (``reboot_after_update: false``): a change that needs a restart
    (cores, memory, GPUs, the network device) stays pending in the VM's config, and the bootstrap's VM-restart step
    applies it with the node held in its rollout slot (``GuestBootstrapArgs.vm_restart``); cloud-init settings only
    matter at the first boot; a change that needs the VM stopped fails instead.

    cpu host also passes the host's virtualization extensions through, which a KubeVirt worker needs for its own
    VMs (nested virtualization must be enabled in the Proxmox node's kvm module, the default on current kernels;
    the guest bootstrap's verify step checks ``/dev/kvm``).

    ``proxmoxve.Vm`` has no hostpci support in pulumi-proxmoxve 8.x, hence the legacy resource.
    """

    vm_id: pulumi.Output[int]
    """Proxmox VM id."""
    ip_address: pulumi.Output[str]
    """The static address from the spec, or the first address the guest agent reports."""
    node_name: pulumi.Output[str]
    """The Kubernetes node name the VM will join as (its VM name)."""
    vm: proxmoxve.VmLegacy
    """The VM resource itself, for ``replace_with`` on whatever must start over when the VM is replaced."""

    def __init__(self, name: str, args: WorkerVmArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the providers in ``opts.providers`` (Proxmox for the VM; in token mode with a large-BAR GPU
        also a command provider for the ``qm set`` step on the node, the node agent's ``large-bar`` step), or only
        the Proxmox one in ``opts.provider`` (the step then uses the default command provider); ``opts.depends_on``
        (the GPUs' mappings, host prep, the node's agent copy) reaches the VM."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:worker_vm:GpuWorkerVm", name, None, opts)
        worker = args.worker
        password_mode = args.password_auth
        large_bar = args.large_bar
        net = worker.network
        mappings = args.mappings
        hostpcis = [
            proxmoxve.VmLegacyHostpciArgs(
                device=f"hostpci{i}",
                mapping=mappings[claim.ref],
                pcie=True,  # q35 PCIe root port: what the NVIDIA driver expects of a datacenter GPU
                rombar=True,
                xvga=False,  # compute GPUs are not the VM's display; the console stays on the emulated VGA
            )
            for i, claim in enumerate(worker.gpus)
        ]
        ip_config = proxmoxve.VmLegacyInitializationIpConfigArgs(
            ipv4=proxmoxve.VmLegacyInitializationIpConfigIpv4Args(address=net.ipv4, gateway=net.gateway)
        )
        dns = (
            proxmoxve.VmLegacyInitializationDnsArgs(servers=list(net.dns), domain=net.search_domain)
            if net.dns or net.search_domain
            else None
        )
        image = worker.image
        # Mapped hostpci entries come back from the API with a computed `id` the spec never sets, which shows
        # as a change on every preview (bpg/terraform-provider-proxmox#517); mapping changes still apply.
        ignore = ["hostpcis[*].id", *BOOT_INPUTS]
        window_on_host = large_bar and not password_mode
        if window_on_host:
            # Set on the host with `qm set --args` (root-only in the API); do not let the provider remove it. The VM
            # is created stopped and the large-BAR step starts it once the window is set, so it boots once; the
            # provider must never act on `started` afterwards (it would stop a running worker).
            ignore += ["kvmArguments", "started"]
        vm = proxmoxve.VmLegacy(
            f"{name}-vm",
            proxmoxve.VmLegacyArgs(
                node_name=worker.node,
                vm_id=worker.vmid,
                name=worker.name,
                description="GPU worker managed by proxmox-gpu-cluster",
                tags=vm_tags(args),
                on_boot=worker.on_boot,
                started=not window_on_host,
                reboot_after_update=False,
                machine=machine_type(worker),
                bios="ovmf",
                # 4m OVMF vars; no pre-enrolled keys, so Secure Boot is off and the unsigned NVIDIA module loads.
                efi_disk=proxmoxve.VmLegacyEfiDiskArgs(
                    datastore_id=worker.datastore, file_format="raw", type="4m", pre_enrolled_keys=False
                ),
                cpu=proxmoxve.VmLegacyCpuArgs(cores=worker.cores, sockets=1, type="host"),
                # Passthrough pins all guest RAM for DMA, so ballooning cannot reclaim any: floating 0 turns it off.
                memory=proxmoxve.VmLegacyMemoryArgs(dedicated=worker.memory_mib, floating=0),
                agent=proxmoxve.VmLegacyAgentArgs(enabled=True, trim=True),
                operating_system=proxmoxve.VmLegacyOperatingSystemArgs(type="l26"),
                scsi_hardware="virtio-scsi-single",
                serial_devices=[proxmoxve.VmLegacySerialDeviceArgs(device="socket")],
                clone=proxmoxve.VmLegacyCloneArgs(vm_id=image.template_vmid, full=True)
                if image.template_vmid is not None
                else None,
                disks=[
                    proxmoxve.VmLegacyDiskArgs(
                        interface="scsi0",
                        datastore_id=worker.datastore,
                        file_id=args.image_file_id,
                        size=worker.disk_gib,
                        discard="on",
                        iothread=True,
                        ssd=True,
                    )
                ],
                network_devices=[
                    proxmoxve.VmLegacyNetworkDeviceArgs(bridge=net.bridge, vlan_id=net.vlan, model="virtio")
                ],
                hostpcis=hostpcis,
                kvm_arguments=LARGE_BAR_ARGS if large_bar and password_mode else None,
                initialization=proxmoxve.VmLegacyInitializationArgs(
                    datastore_id=worker.datastore,
                    ip_configs=[ip_config],
                    dns=dns,
                    user_account=proxmoxve.VmLegacyInitializationUserAccountArgs(
                        username=worker.ssh_user, keys=list(args.ssh_public_keys)
                    ),
                    vendor_data_file_id=args.vendor_data_file_id,
                ),
            ),
            opts=pulumi.ResourceOptions(
                parent=self,
                protect=worker.protect,
                ignore_changes=ignore,
                delete_before_replace=True,
                depends_on=caller_dependencies(opts),
            ),
        )
        # Derived from VM outputs, not the plain spec value, so whoever connects to the address waits for the VM
        # (and for the large-BAR restart, below).
        dhcp = net.ipv4 == "dhcp"
        if dhcp:
            address = vm.ipv4_addresses.apply(_first_address)
        else:
            static = net.ipv4.split("/")[0]
            address = vm.vm_id.apply(lambda _: static)
        if window_on_host and args.node_ssh_address is not None:  # the args require the address then
            user = args.node_ssh_user
            connection = ssh_connection(args.node_ssh_address, user, args.ssh_private_key)
            after = [vm, *agent_unless_installed(
                args.host_agent_installed, f"{name}-host-agent", "host", connection=connection, parent=self,
            )]  # fmt: skip
            window = command.remote.Command(
                f"{name}-large-bar",
                command.remote.CommandArgs(
                    connection=connection,
                    create=step_command(
                        user, "large-bar", [str(worker.vmid), str(MMIO_MB), *(["--address"] if dhcp else [])]
                    ),
                ),
                # A replaced VM is created stopped again, without the args: set them and start it.
                opts=pulumi.ResourceOptions(parent=self, depends_on=after, replace_with=[vm]),
            )
            # The VM runs only after this step: a static address is worth connecting to then; a DHCP one is what
            # the guest agent reported once it did (the provider saw a stopped VM, so it has none).
            address = pulumi.Output.all(address, window.stdout).apply(
                lambda values: _reported_address(values[1]) if dhcp else str(values[0])
            )
        self.vm = vm
        self.vm_id = vm.vm_id
        self.node_name = pulumi.Output.from_input(worker.name)
        self.ip_address = address
        self.register_outputs({"vmId": self.vm_id, "ipAddress": self.ip_address, "nodeName": self.node_name})


def _reported_address(stdout: str | None) -> str:
    """The ``address: IP`` line large_bar.sh prints for a DHCP worker."""
    for line in (stdout or "").splitlines():
        if line.startswith("address: "):
            return line.removeprefix("address: ").strip()
    return ""


def _first_address(addresses: Sequence[Sequence[str]] | None) -> str:
    """The first non-loopback IPv4 address the guest agent reports (per interface lists)."""
    for iface in addresses or []:
        for address in iface:
            if not address.startswith("127."):
                return address
    return ""
