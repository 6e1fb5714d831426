"""The Proxmox layer under mocks: preflight outcomes, host prep, mappings, VMs, ordering and change isolation."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from proxmox_gpu_cluster.core.names import StackScope, short_hash
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.proxmox.worker_vm import _reported_address
from proxmox_gpu_cluster.render.agent_bundle import bundle_files, step_command
from proxmox_gpu_cluster.testing import Recording, redact
from proxmox_gpu_cluster.testing_pci import spec_shaped_pci
from tests.support import base_spec, make_vm_worker, plan_stack, shared_group

SCOPE = StackScope("proxmox-gpu-cluster", "test")
"""The project and stack ``components.testing.run`` plans as."""
DEFAULT_IMAGE = "https://cloud-images.ubuntu.com/jammy/current/jammy-server-cloudimg-amd64.img"
VM = "proxmoxve:index/vmLegacy:VmLegacy"
MAPPING = "proxmoxve:hardware/mapping/pci:Pci"
REMOTE = "command:remote:Command"


def prepped() -> dict[str, Any]:
    raw = base_spec()
    for node in raw["proxmox"]["nodes"]:
        node["hostPrep"] = True
    return raw


def test_components_children_and_names() -> None:
    rec = plan_stack(prepped())
    vms = {r.name for r in rec.of_type(VM)}
    assert vms == {"cluster-mig-1-vm", "cluster-mig-2-vm", "cluster-ts-1-vm"}
    for r in rec.resources:
        if r.type.startswith("proxmox-gpu-cluster:"):
            # The gates' group keeps its children's names from when they were the cluster's, a MIG settle its steps'
            # from when they were the two-phase rollout's (named as the drain): URNs stay stable.
            keeps = {":NodeCapacityGates": "-capacity-gates", ":MigSettle": "-settle"}
            prefix = next((r.name.removesuffix(s) for t, s in keeps.items() if r.type.endswith(t)), r.name)
            for child in rec.children(r):
                assert child.name.startswith(f"{prefix}-"), (r.name, child.name)
    # One mapping per declared GPU but the console T4, whether a worker claims it (pve1's A10 is unclaimed).
    assert {r.name for r in rec.of_type(MAPPING)} == {"cluster-pve1-pci-0000:41:00", "cluster-pve1-pci-0000:42:00",
                                                      "cluster-pve1-pci-0000:81:00", "cluster-pve2-pci-0000:17:00",
                                                      "cluster-pve2-pci-0000:18:00"}  # fmt: skip
    preps = rec.of_type("proxmox-gpu-cluster:host_gpu_prep:ProxmoxHostGpuPrep")
    assert sorted(p.name for p in preps) == ["cluster-pve1-host-prep", "cluster-pve2-host-prep"]
    proxmox = rec.one("pulumi:providers:proxmoxve").urn
    assert all(r.provider == proxmox for r in rec.resources if r.type.startswith("proxmoxve:"))
    cmd = rec.one("pulumi:providers:command").urn
    assert all(r.provider == cmd for r in rec.resources if r.type.startswith("command:"))


def test_vm_inputs() -> None:
    raw = prepped()
    raw["workers"][0]["protect"] = True
    rec = plan_stack(raw)
    vm = rec.named("cluster-mig-1-vm")
    i = vm.plain_inputs
    assert i["machine"] == "q35" and i["bios"] == "ovmf"
    assert i["efiDisk"] == {"datastoreId": "local-lvm", "fileFormat": "raw", "type": "4m", "preEnrolledKeys": False}
    assert i["cpu"]["type"] == "host"
    assert i["memory"] == {"dedicated": 32768, "floating": 0}
    assert i["agent"]["enabled"] is True
    assert i["hostpcis"] == [{"device": "hostpci0", "mapping": SCOPE.mapping_id("pve1", "a100-0"), "pcie": True,
                              "rombar": True, "xvga": False}]  # fmt: skip
    assert i["vmId"] == 2001 and i["nodeName"] == "pve1" and i["name"] == "mig-1" and i["onBoot"] is True
    assert "a100-pcie-40gb" in i["tags"] and "proxmox-gpu-cluster" in i["tags"]
    init = i["initialization"]
    assert init["userAccount"]["username"] == "ubuntu" and init["userAccount"]["keys"][0].startswith("ssh-ed25519")
    assert init["ipConfigs"] == [{"ipv4": {"address": "dhcp"}}]
    # The snippet's volume id, known in advance, with an ordering edge: no property dependency on the snippet, whose
    # delete-first replacement would otherwise delete the VM first (WorkerBootFiles.vendor_data_file_id).
    snippet = next(r for r in rec.resources if r.name == "cluster-pve1-boot-files-vendor-data")
    assert init["vendorDataFileId"] == f"local:snippets/{snippet.inputs['sourceRaw']['fileName']}"
    assert snippet.urn in vm.dependencies and not vm.property_dependencies.get("initialization")
    image = rec.named(f"cluster-pve1-boot-files-image-{short_hash(DEFAULT_IMAGE, 8)}")
    assert i["disks"][0]["fileId"] == f"{image.name}-id" and i["disks"][0]["size"] == 100
    assert vm.protect is True and rec.named("cluster-mig-2-vm").protect is False
    assert "hostpcis[*].id" in vm.ignore_changes
    # day 2: delete-first replacement, no provider-initiated restarts, boot inputs never replace a running VM
    assert vm.delete_before_replace and i["rebootAfterUpdate"] is False
    assert {"disks[*].fileId", "clone", "initialization.vendorDataFileId"} <= set(vm.ignore_changes)
    ts1 = rec.named("cluster-ts-1-vm").plain_inputs["initialization"]
    assert ts1["ipConfigs"] == [{"ipv4": {"address": "192.0.2.60/24", "gateway": "192.0.2.1"}}]
    assert ts1["dns"] == {"servers": ["192.0.2.1"]}


def test_mapping_inputs_from_preflight() -> None:
    rec = plan_stack(prepped())
    m = rec.named("cluster-pve2-pci-0000:18:00").plain_inputs
    assert m["name"] == SCOPE.mapping_id("pve2", "a10-1")
    (entry,) = m["maps"]
    assert entry == {"id": "10de:2236", "node": "pve2", "path": "0000:18:00", "iommuGroup": 21,
                     "subsystemId": "10de:1482"}  # fmt: skip


def test_ordering() -> None:
    rec = plan_stack(prepped())
    vm = rec.named("cluster-mig-1-vm")
    assert rec.depends_on(vm, rec.named("cluster-pve1-pci-0000:41:00"))
    assert rec.depends_on(vm, rec.named("cluster-pve1-host-prep-verify"))
    assert not rec.depends_on(vm, rec.named("cluster-pve2-host-prep-verify"))
    assert rec.depends_on(rec.named("cluster-pve1-pci-0000:41:00"), rec.named("cluster-pve1-host-prep-verify"))
    verify, wait, prep = (rec.named(f"cluster-pve1-host-prep-{s}") for s in ("verify", "wait", "prep"))
    assert rec.depends_on(verify, wait) and rec.depends_on(wait, prep)


def test_workers_output() -> None:
    outputs = plan_stack(prepped()).outputs
    assert outputs["workers"]["ts-1"] == {"vmId": 2003, "ipAddress": "192.0.2.60", "nodeName": "ts-1"}
    assert outputs["iommuChecks"] == {"pve1": "plan", "pve2": "plan"}


def test_host_prep_commands_quote_arguments_and_run_the_installed_agent() -> None:
    rec = plan_stack(prepped())
    prep = rec.named("cluster-pve2-host-prep-prep").plain_inputs
    assert prep["create"] == (f"{step_command('root', 'host-prep', [])} --owner {SCOPE.token} --cpu-vendor intel --boot-loader auto --acs-override 0 "
                              "--reboot-policy when-idle --gpu 0000:17:00=10de:2236 --gpu 0000:18:00=10de:2236")  # fmt: skip
    assert "stdin" not in prep  # the script is on the node (the agent copy), not in state
    agent = rec.named("cluster-pve2-host-prep-agent")
    assert agent.urn in rec.named("cluster-pve2-host-prep-prep").dependencies
    assert prep["connection"]["host"] == "192.0.2.12" and prep["connection"]["user"] == "root"
    verify = rec.named("cluster-pve2-host-prep-verify").plain_inputs
    assert verify["create"].endswith("/step.sh --gpu 0000:17:00 --gpu 0000:18:00")  # no IOMMU words (issue 24)


def test_no_host_prep_without_opt_in() -> None:
    rec = plan_stack(base_spec())
    assert rec.of_type("proxmox-gpu-cluster:host_gpu_prep:ProxmoxHostGpuPrep") == []
    assert len(rec.of_type(VM)) == 3


def failing(raw: dict[str, Any], devices: dict[str, list[dict[str, Any]]]) -> tuple[str, Recording]:
    recording = Recording()
    with pytest.raises(pulumi.RunError) as err:
        plan_stack(raw, devices, recording)
    return str(err.value), recording


def test_shared_iommu_group_names_the_other_device() -> None:
    message, _ = failing(prepped(), shared_group(prepped()))
    assert "cluster.proxmox.nodes[1].gpus[1].pciPath: IOMMU group 21 of 0000:18:00 also holds 0000:19:00.0 " \
           "(I210 Gigabit); set acsOverride: true" in message  # fmt: skip


def test_wrong_model_and_missing_path_reported_together() -> None:
    raw = prepped()
    devices = spec_shaped_pci(load_spec(raw), "pve1")
    for d in devices:
        if d["id"] == "0000:41:00.0":
            d["device"] = "0x20b5"  # an A100 80GB where the spec says 40GB
    devices = [d for d in devices if d["id"] != "0000:42:00.0"]
    message, _ = failing(raw, {"pve1": devices})
    assert "cluster.proxmox.nodes[0].gpus[0].model: 0000:41:00.0 on pve1 is 10de:20b5" in message
    assert "not a A100-PCIE-40GB (10de:20f1)" in message
    assert "cluster.proxmox.nodes[0].gpus[1].pciPath: no PCI device at 0000:42:00.0 on node pve1" in message


def test_nothing_but_providers_registers_when_preflight_fails() -> None:
    _, recording = failing(prepped(), shared_group(prepped()))
    registered = {r.type for r in recording.resources}
    assert registered == {"pulumi:pulumi:Stack", "proxmox-gpu-cluster:cluster:GpuCluster", "pulumi:providers:proxmoxve",
                          "pulumi:providers:kubernetes", "pulumi:providers:command"}  # fmt: skip


def test_unknown_groups_defer_to_host_verify() -> None:
    raw = prepped()
    spec = load_spec(raw)
    rec = plan_stack(raw, {"pve1": spec_shaped_pci(spec, "pve1", iommu=False)})
    assert rec.outputs["iommuChecks"] == {"pve1": "host-verify", "pve2": "plan"}
    mapping = rec.named("cluster-pve1-pci-0000:41:00")
    # the group comes from the verify step's output, so the mapping waits for it
    assert rec.depends_on(mapping, rec.named("cluster-pve1-host-prep-verify"))
    assert redact(mapping.inputs)["maps"][0]["iommuGroup"] == "[unknown]"  # known after the verify step runs
    assert rec.named("cluster-pve2-pci-0000:17:00").plain_inputs["maps"][0]["iommuGroup"] == 20


def test_unknown_groups_without_host_prep_is_an_error() -> None:
    raw = base_spec()
    message, _ = failing(raw, {"pve1": spec_shaped_pci(load_spec(raw), "pve1", iommu=False)})
    assert "cluster.proxmox.nodes[0].hostPrep: node pve1 reports no IOMMU groups (IOMMU is off)" in message


def test_sharing_and_operator_changes_leave_vms_and_mappings_alone() -> None:
    before = plan_stack(prepped())
    raw = prepped()
    raw["workers"][2]["timeSlicing"]["replicas"] = 8
    raw["workers"][1]["gpus"][0]["mig"] = {"7g.40gb": 1}
    raw["gpuOperator"].update(driverMode="operator", driverVersion="580.95.05", chartVersion="v25.10.1",
                              monitoring={"prometheus": True}, smokeTest={"enabled": True})  # fmt: skip
    after = plan_stack(raw)
    for type_ in (VM, MAPPING, "proxmoxve:download/file:File", "proxmoxve:index/fileLegacy:FileLegacy", REMOTE):
        # (the guest bootstraps, MIG rollouts and capacity gates are not the Proxmox layer: they follow the GPU stack
        # on purpose)
        guest = ("-bootstrap-", "-capacity-", "-mig-")
        for r in (r for r in before.of_type(type_) if not any(g in r.name for g in guest)):
            assert redact(after.named(r.name).inputs) == redact(r.inputs), r.name


def test_large_bar_token_mode_uses_qm_set_on_the_host() -> None:
    rec = plan_stack(prepped())
    cmd = rec.named("cluster-mig-1-large-bar").plain_inputs
    large_bar = step_command("root", "large-bar", [])
    assert cmd["create"] == f"{large_bar} 2001 65536 --address" and "stdin" not in cmd  # mig-1: DHCP
    assert b"X-PciMmio64Mb" in dict(bundle_files("large-bar"))["step.sh"]  # the window is in the installed script
    assert rec.depends_on(rec.named("cluster-mig-1-large-bar"), rec.named("cluster-mig-1-vm"))
    # It runs the node agent host prep installed on the node (one copy per node, not per worker).
    assert rec.depends_on(rec.named("cluster-mig-1-large-bar"), rec.named("cluster-pve1-host-prep-agent"))
    assert sorted(r.name for r in rec.of_type("command:remote:CopyToRemote") if "pve" in r.name) == [
        "cluster-pve1-host-prep-agent", "cluster-pve2-host-prep-agent"]  # fmt: skip
    vm = rec.named("cluster-mig-1-vm")
    assert "kvmArguments" not in vm.plain_inputs and "kvmArguments" in vm.ignore_changes
    # Created stopped: the large-BAR step sets the window, then starts it: one boot, no restart.
    assert vm.plain_inputs["started"] is False and "started" in vm.ignore_changes
    assert rec.named("cluster-ts-1-vm").plain_inputs["started"] is True  # A10: no window, started by the provider
    assert sorted(r.name for r in rec.of_type(REMOTE) if r.name.endswith("large-bar")) == ["cluster-mig-1-large-bar",
                                                                                   "cluster-mig-2-large-bar"]  # fmt: skip


def test_a_dhcp_large_bar_worker_is_reached_at_the_address_its_first_start_reports() -> None:
    raw = prepped()
    raw["workers"][0]["network"] = {"ipv4": "dhcp"}
    rec = plan_stack(raw)
    large_bar = step_command("root", "large-bar", [])
    assert rec.named("cluster-mig-1-large-bar").plain_inputs["create"] == f"{large_bar} 2001 65536 --address"
    # The bootstrap connects where large_bar.sh's output says, so it waits for that step.
    assert rec.depends_on(rec.named("cluster-mig-1-bootstrap-cloud-init"), rec.named("cluster-mig-1-large-bar"))
    assert _reported_address("large-bar: set; first start\naddress: 10.20.0.57\n") == "10.20.0.57"
    assert _reported_address("large-bar: unchanged\n") == ""


def test_large_bar_password_mode_uses_kvm_arguments() -> None:
    raw = prepped()
    raw["proxmox"]["authMode"] = "password"
    rec = plan_stack(raw)
    vm = rec.named("cluster-mig-1-vm")
    assert vm.plain_inputs["kvmArguments"] == "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=65536"
    assert "kvmArguments" not in vm.ignore_changes and vm.plain_inputs["started"] is True  # window set at creation
    assert not [r for r in rec.of_type(REMOTE) if r.name.endswith("large-bar")]
    assert "kvmArguments" not in rec.named("cluster-ts-1-vm").plain_inputs  # A10: no large BAR


def test_template_clone_instead_of_download() -> None:
    raw = prepped()
    raw["workers"][2]["image"] = {"templateVmid": 9000}
    rec = plan_stack(raw)
    vm = rec.named("cluster-ts-1-vm").plain_inputs
    assert vm["clone"] == {"vmId": 9000, "full": True} and "fileId" not in vm["disks"][0]
    assert [r.name for r in rec.of_type("proxmoxve:download/file:File")] == [
        f"cluster-pve1-boot-files-image-{short_hash(DEFAULT_IMAGE, 8)}"
    ]


def test_secrets_stay_secret() -> None:
    rec = plan_stack(prepped())
    for r in rec.resources:
        # canary secrets appear only inside secret envelopes
        assert "CANARY" not in repr(redact(r.inputs)), r.name


@pytest.mark.parametrize(("workload", "machine"), [("container", "q35"), ("vm-passthrough", "q35,viommu=intel"),
                                                    ("vm-vgpu", "q35,viommu=intel")])  # fmt: skip
def test_kubevirt_workers_get_a_virtual_iommu(workload: str, machine: str) -> None:
    raw = base_spec() if workload == "container" else make_vm_worker(base_spec(), 2, workload)
    rec = plan_stack(raw)
    vm = rec.named("cluster-ts-1-vm").plain_inputs
    assert vm["machine"] == machine
    assert vm["cpu"]["type"] == "host"  # nested virtualization for the worker's own VMs
    assert rec.named("cluster-mig-1-vm").plain_inputs["machine"] == "q35"


def test_without_host_prep_every_node_with_workers_gets_the_agent_once() -> None:
    raw = base_spec()  # no host prep; mig-1/mig-2 (A100, token mode) on pve1, ts-1 (A10) on pve2
    raw["proxmox"]["nodes"].append({**raw["proxmox"]["nodes"][1], "name": "pve9", "sshAddress": "192.0.2.99"})
    rec = plan_stack(raw)
    agents = {r.name for r in rec.of_type("command:remote:CopyToRemote") if "pve" in r.name}
    # The workers' retirements (and pve1's large-BAR windows) run on their nodes; pve9 has no worker and is never
    # reached over SSH.
    assert agents == {"cluster-pve1-agent", "cluster-pve2-agent"}
    for worker in ("mig-1", "mig-2"):
        assert rec.depends_on(rec.named(f"cluster-{worker}-large-bar"), rec.named("cluster-pve1-agent"))
    assert rec.depends_on(rec.named("cluster-ts-1-retirement-drain"), rec.named("cluster-pve2-agent"))
    assert not [r for r in rec.resources if r.name.endswith("-host-agent")]  # the layer's copy, not one per VM
