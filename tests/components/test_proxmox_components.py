"""The Proxmox-layer components built directly, each with minimal args and no cluster spec: WorkerBootFiles,
GpuPciMappings, ProxmoxHostGpuPrep and GpuWorkerVm (its args model refuses what it cannot build)."""

from __future__ import annotations

import pulumi
import pulumi_command as command
import pulumi_proxmoxve as proxmoxve
import pytest
from pulumi import ResourceOptions

from proxmox_gpu_cluster.core.iommu import GpuPlacement, NodePreflight
from proxmox_gpu_cluster.core.spec import ProxmoxNode
from proxmox_gpu_cluster.core.worker_spec import Image, Worker
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.proxmox.boot_files import WorkerBootFiles, WorkerBootFilesArgs
from proxmox_gpu_cluster.proxmox.host_gpu_prep import ProxmoxHostGpuPrep
from proxmox_gpu_cluster.proxmox.pci_mapping import GpuPciMappings, GpuPciMappingsArgs
from proxmox_gpu_cluster.proxmox.worker_vm import GpuWorkerVm, WorkerVmArgs
from proxmox_gpu_cluster.testing import run

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBxYhxkAFq8yGtzKQpNLT3ZN0r6Jw1c0Kf3z8lL0Q1u1 ops@example"
URL = "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"
NODE = ProxmoxNode(
    name="pve9",
    ssh_address="192.0.2.19",
    cpu_vendor="amd",
    gpus=({"name": "l4-0", "pciPath": "0000:c1:00", "model": "L4"},),  # type: ignore[arg-type]
)


def worker(**changes: object) -> Worker:
    base: dict[str, object] = {"name": "gpu-9", "vmid": 9001, "node": "pve9", "gpus": ("l4-0",)}
    return Worker.model_validate({**base, **changes})


def test_boot_files_on_a_named_node() -> None:
    def program() -> None:
        provider = proxmoxve.Provider("pve")
        images = (Image(cloud_image_url=URL), Image(cloud_image_url=URL))
        WorkerBootFiles(
            "files", WorkerBootFilesArgs(node_name="pve9", images=images), ResourceOptions(provider=provider)
        )

    rec = run(program)
    (download,) = rec.of_type("proxmoxve:download/file:File")
    assert download.plain_inputs["nodeName"] == "pve9" and download.plain_inputs["url"] == URL
    snippet = rec.one("proxmoxve:index/fileLegacy:FileLegacy").plain_inputs
    assert snippet["datastoreId"] == "local" and snippet["contentType"] == "snippets"


def test_pci_mappings_from_a_preflight() -> None:
    result = NodePreflight(node="pve9", check="plan", gpus=[GpuPlacement("l4-0", "0000:c1:00", 42, "10de:16c1")])

    def program() -> None:
        GpuPciMappings(
            "pci", GpuPciMappingsArgs(node=NODE, result=result), ResourceOptions(provider=proxmoxve.Provider("pve"))
        )

    mapping = run(program).one("proxmoxve:hardware/mapping/pci:Pci").plain_inputs
    assert mapping["maps"] == [
        {"id": "10de:27b8", "node": "pve9", "path": "0000:c1:00", "iommuGroup": 42, "subsystemId": "10de:16c1"}
    ]


def test_host_prep_on_one_node() -> None:
    def program() -> None:
        ProxmoxHostGpuPrep("prep", NODE, ssh_user="root", provider=command.Provider("ssh"), ssh_private_key="k")

    rec = run(program)
    steps = {r.name for r in rec.of_type("command:remote:Command")}
    assert steps == {"prep-prep", "prep-verify"}
    assert "10de:27b8" in rec.named("prep-prep").plain_inputs["create"]  # the L4 goes to vfio-pci


def test_worker_vm_from_its_args() -> None:
    args = WorkerVmArgs(worker=worker(), gpu_models=("L4",), ssh_public_keys=(KEY,))

    def program() -> None:
        GpuWorkerVm(
            "vm", args, provider=proxmoxve.Provider("pve"), mappings={"l4-0": "map-l4"}, vendor_data_file_id="s"
        )

    rec = run(program)
    vm = rec.one("proxmoxve:index/vmLegacy:VmLegacy").plain_inputs
    assert vm["hostpcis"][0]["mapping"] == "map-l4" and vm["tags"] == ["l4", "proxmox-gpu-cluster"]
    assert not rec.of_type("command:remote:Command")  # an L4 needs no large-BAR window


def test_worker_vm_needs_a_mapping_per_claimed_gpu() -> None:
    args = WorkerVmArgs(worker=worker(), gpu_models=("L4",), ssh_public_keys=(KEY,))

    def program() -> None:
        GpuWorkerVm("vm", args, provider=proxmoxve.Provider("pve"), mappings={"other": "m"}, vendor_data_file_id="s")

    with pytest.raises(InvalidComponentArgs) as err:
        run(program)
    assert err.value.lines == ["vm.worker.gpus[0]: no PCI mapping for GPU l4-0"]


def test_worker_vm_args_refuse_what_cannot_be_built() -> None:
    with pytest.raises(ValueError, match="one model per GPU claim"):
        WorkerVmArgs(worker=worker(), gpu_models=("L4", "L4"), ssh_public_keys=(KEY,))
    with pytest.raises(ValueError, match="set up over SSH on the node"):
        WorkerVmArgs(worker=worker(), gpu_models=("A100-PCIE-40GB",), ssh_public_keys=(KEY,))
    args = WorkerVmArgs(
        worker=worker(), gpu_models=("A100-PCIE-40GB",), ssh_public_keys=(KEY,), node_ssh_address="192.0.2.19"
    )

    def program() -> None:
        GpuWorkerVm("vm", args, provider=proxmoxve.Provider("pve"), mappings={"l4-0": "m"}, vendor_data_file_id="s")

    with pytest.raises(InvalidComponentArgs) as err:
        run(program)
    assert isinstance(err.value, pulumi.RunError)
    # No ssh_private_key is fine (the ssh-agent); the command provider is what the qm step cannot do without.
    assert err.value.lines == ["vm.hostCommand: a large-BAR worker in token mode needs host_command"]
