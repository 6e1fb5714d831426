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
from proxmox_gpu_cluster.proxmox.host_gpu_prep import ProxmoxHostGpuPrep, ProxmoxHostGpuPrepArgs
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
        args = ProxmoxHostGpuPrepArgs(node=NODE, owner="dev-1a2b3c4d", ssh_user="root", ssh_private_key="k")
        ProxmoxHostGpuPrep("prep", args, ResourceOptions(provider=command.Provider("ssh")))

    rec = run(program)
    steps = {r.name for r in rec.of_type("command:remote:Command")}
    assert steps == {"prep-prep", "prep-verify"}
    prep = rec.named("prep-prep")
    assert "10de:27b8" in prep.plain_inputs["create"]  # the L4 goes to vfio-pci
    assert " --owner dev-1a2b3c4d --cpu-vendor amd " in prep.plain_inputs["create"]
    # Destroying it releases the owner's claim, with the same bundle; a forced replacement releases first.
    create, delete = prep.plain_inputs["create"], prep.plain_inputs["delete"]
    assert delete == create.split(" --owner ")[0] + " --owner dev-1a2b3c4d --release"
    assert prep.delete_before_replace


def vm_args(**changes: object) -> WorkerVmArgs:
    base: dict[str, object] = {
        "worker": worker(image={"templateVmid": 9000}), "gpu_models": ("L4",), "ssh_public_keys": (KEY,),
        "mappings": {"l4-0": "map-l4"}, "vendor_data_file_id": "local:snippets/v.yaml",
    }  # fmt: skip
    return WorkerVmArgs(**{**base, **changes})  # type: ignore[arg-type]


def test_worker_vm_from_its_args() -> None:
    def program() -> None:
        GpuWorkerVm("vm", vm_args(), ResourceOptions(provider=proxmoxve.Provider("pve")))

    rec = run(program)
    vm = rec.one("proxmoxve:index/vmLegacy:VmLegacy")
    assert vm.plain_inputs["hostpcis"][0]["mapping"] == "map-l4"
    assert vm.plain_inputs["tags"] == ["l4", "proxmox-gpu-cluster"]
    assert vm.provider.endswith("pulumi:providers:proxmoxve::pve")  # inherited from the component's opts
    assert not rec.of_type("command:remote:Command")  # an L4 needs no large-BAR window


def test_worker_vm_args_refuse_what_cannot_be_built() -> None:
    with pytest.raises(InvalidComponentArgs) as err:
        vm_args(gpu_models=("L4", "L4"), mappings={"other": "m"})
    assert isinstance(err.value, pulumi.RunError)
    assert err.value.lines == [
        "WorkerVmArgs.gpu_models: one model per GPU claim (1)",
        "WorkerVmArgs.worker.gpus[0]: no PCI mapping for GPU l4-0 in mappings (has: other)",
    ]
    with pytest.raises(InvalidComponentArgs) as err:
        vm_args(gpu_modles=(), port="22")
    assert err.value.lines == [
        "WorkerVmArgs.gpu_modles: unknown field (check the spelling)",
        "WorkerVmArgs.port: unknown field (check the spelling)",
    ]
    with pytest.raises(InvalidComponentArgs) as err:
        vm_args(worker=worker(), gpu_models=("A100-PCIE-40GB",))
    assert err.value.lines == [
        "WorkerVmArgs.image_file_id: the worker boots from a cloud image: pass its downloaded file",
        "WorkerVmArgs.node_ssh_address: a large-BAR GPU in token mode is set up over SSH on the node",
    ]
    with pytest.raises(InvalidComponentArgs) as err:
        vm_args(gpu_models=("A100-80GB",))
    assert err.value.lines[0].startswith("WorkerVmArgs.gpu_models[0]: unknown GPU model 'A100-80GB'; known: ")


def test_a_large_bar_worker_in_token_mode_sets_its_window_with_the_callers_command_provider() -> None:
    args = vm_args(gpu_models=("A100-PCIE-40GB",), node_ssh_address="192.0.2.19")

    def program() -> None:
        providers = [proxmoxve.Provider("pve"), command.Provider("ssh")]
        GpuWorkerVm("vm", args, ResourceOptions(providers=providers))

    rec = run(program)
    window, agent = rec.named("vm-large-bar"), rec.named("vm-host-agent")
    assert window.provider.endswith("pulumi:providers:command::ssh") and agent.provider == window.provider
    assert rec.one("proxmoxve:index/vmLegacy:VmLegacy").provider.endswith("pulumi:providers:proxmoxve::pve")
    assert agent.urn in window.dependencies
