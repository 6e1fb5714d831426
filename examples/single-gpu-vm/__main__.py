"""One passthrough GPU VM plus its guest bootstrap, wired to a PCI mapping another module owns."""

import pulumi
import pulumi_command as command
import pulumi_proxmoxve as proxmoxve

from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.guest_spec import ExpectedGpu, GuestBootstrapSpec
from proxmox_gpu_cluster.core.worker_spec import Worker
from proxmox_gpu_cluster.guest.guest_bootstrap import GuestBootstrap, GuestBootstrapArgs
from proxmox_gpu_cluster.outputs import item
from proxmox_gpu_cluster.proxmox.boot_files import WorkerBootFiles, WorkerBootFilesArgs
from proxmox_gpu_cluster.proxmox.worker_vm import GpuWorkerVm, WorkerVmArgs
from proxmox_gpu_cluster.stacks.config import load_model

config = pulumi.Config()
worker = load_model(Worker, "worker")
model = CATALOG[config.require("gpuModel")]
ssh_key = config.require_secret("sshPrivateKey")
proxmox = proxmoxve.Provider(
    "pve",
    endpoint=config.require("proxmoxEndpoint"),
    api_token=config.require_secret("proxmoxApiToken"),
    ssh=proxmoxve.ProviderSshArgs(username="root", private_key=ssh_key),
)
ssh = command.Provider("ssh")

files = WorkerBootFiles(
    "boot-files",
    WorkerBootFilesArgs(node_name=worker.node, images=(worker.image,)),
    pulumi.ResourceOptions(provider=proxmox),
)
url = worker.image.cloud_image_url or ""
vm = GpuWorkerVm(
    "gpu-vm",
    WorkerVmArgs(
        worker=worker,
        gpu_models=(model.key,),
        ssh_public_keys=tuple(config.require_object("sshPublicKeys")),
        mappings={"gpu0": config.require("pciMapping")},
        # The known volume id plus an ordering edge (below), so a new vendor-data text never deletes the VM first.
        vendor_data_file_id=files.vendor_data_volume,
        image_file_id=item(files.image_file_ids, url),
        node_ssh_address=config.require("nodeSshAddress"),
        ssh_private_key=ssh_key,
    ),
    pulumi.ResourceOptions(providers=[proxmox, ssh], depends_on=[files.vendor_data_snippet]),
)
bootstrap = GuestBootstrap(
    "gpu-vm-bootstrap",
    GuestBootstrapArgs(
        bootstrap=GuestBootstrapSpec(
            node_name=worker.name,
            gpus=(ExpectedGpu(vendor_device=model.vendor_device, product=model.product),),
            driver_mode="host",
            driver_branch="580",
            kernel_modules="open",
            toolkit=True,
            api_endpoint=config.require("apiEndpoint"),
            kubernetes_minor=config.require_int("kubernetesMinor"),
        ),
        host=vm.ip_address,
        user=worker.ssh_user,
        ssh_private_key=ssh_key,
        join_token=config.require_secret("kubeadmJoinToken"),
        ca_cert_hash=config.require_secret("kubeadmCaCertHash"),
        replace_with=(vm.vm,),
    ),
    pulumi.ResourceOptions(provider=ssh),
)
pulumi.export("vm", {"vmId": vm.vm_id, "ipAddress": vm.ip_address, "nodeName": vm.node_name})
