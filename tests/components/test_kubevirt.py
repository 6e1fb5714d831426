"""KubeVirt as data (permitted devices, gates, pull secret, example VMs) and the KubeVirtGpuDevices patch under
mocks, with the bare-metal nodes, the vGPU pull secret and the capacity they add."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest

from proxmox_gpu_cluster.core.capacity import capacity_table
from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.cluster_nodes import gpu_nodes
from proxmox_gpu_cluster.core.spec import ClusterSpec, load_spec
from proxmox_gpu_cluster.render.kubevirt import docker_config_json, example_virtual_machines, kubevirt_patch_spec
from tests.support import SECRETS, base_spec, make_vm_worker, plain_strings, plan_stack

PATCH = "kubernetes:kubevirt.io/v1:KubeVirtPatch"


def bare_metal(*nodes: dict[str, Any], **kubevirt: Any) -> dict[str, Any]:
    """The base spec with worker 2 on vm-passthrough and the given bare-metal KubeVirt nodes."""
    raw = make_vm_worker(base_spec(), 2, "vm-passthrough")
    raw["kubevirt"].update(nodes=list(nodes), **kubevirt)
    if any(n["workload"] == "vm-vgpu" for n in nodes):
        raw["kubevirt"]["vgpuManager"] = {"repository": "registry.example.test/nvidia", "version": "580.95.02"}
    return raw


def permitted(spec: ClusterSpec) -> dict[str, Any]:
    return dict(
        kubevirt_patch_spec(gpu_nodes(spec), spec.kubevirt.feature_gates)["configuration"]["permittedHostDevices"]
    )


@pytest.mark.parametrize("key", list(CATALOG))
def test_every_catalog_model_is_permitted_under_its_advertised_name(key: str) -> None:
    spec = load_spec(bare_metal({"name": "bm-1", "workload": "vm-passthrough", "gpus": {key: 2}}))
    model = CATALOG[key]
    entries = [e for e in permitted(spec)["pciHostDevices"] if e["resourceName"] == model.sandbox_resource_name]
    assert [e["pciVendorSelector"] for e in entries] == [f"10DE:{d.upper()}" for d in model.device_ids]
    assert all(e["externalResourceProvider"] is True for e in entries)
    # The name the patch permits is the name the node advertises.
    row = next(r for r in capacity_table(spec) if r.worker == "bm-1")
    assert row.resources == {model.sandbox_resource_name: 2}
    assert row.node == "" and row.gpus == {key: 2}


def test_worker_models_and_vgpu_types_are_permitted() -> None:
    raw = bare_metal(
        {"name": "bm-1", "workload": "vm-vgpu", "gpus": {"L4": 1}, "vgpuType": "L4-6Q"},
        {"name": "bm-2", "workload": "vm-vgpu", "gpus": {"A10": 2}, "vgpuType": "A10-24Q"},
    )
    spec = load_spec(raw)
    devices = permitted(spec)
    assert devices["pciHostDevices"] == [
        {"pciVendorSelector": "10DE:2236", "resourceName": "nvidia.com/GA102GL_A10", "externalResourceProvider": True}
    ]
    assert devices["mediatedDevices"] == [
        {
            "mdevNameSelector": f"NVIDIA {t}",
            "resourceName": f"nvidia.com/NVIDIA_{t}",
            "externalResourceProvider": True,
        }
        for t in ("A10-24Q", "L4-6Q")
    ]
    advertised = {name for row in capacity_table(spec) for name in row.resources}
    assert {"nvidia.com/NVIDIA_A10-24Q", "nvidia.com/NVIDIA_L4-6Q", "nvidia.com/GA102GL_A10"} <= advertised


def test_passthrough_only_permits_no_mediated_devices() -> None:
    assert "mediatedDevices" not in permitted(load_spec(bare_metal()))


def test_feature_gates_keep_the_spec_gates_and_add_host_devices() -> None:
    spec = load_spec(bare_metal(featureGates=["Snapshot", "LiveMigration", "HostDevices", "Snapshot"]))
    gates = kubevirt_patch_spec(gpu_nodes(spec), spec.kubevirt.feature_gates)["configuration"][
        "developerConfiguration"
    ]["featureGates"]
    assert gates == ["HostDevices", "LiveMigration", "Snapshot"]
    assert kubevirt_patch_spec(gpu_nodes(load_spec(bare_metal())), load_spec(bare_metal()).kubevirt.feature_gates)[
        "configuration"
    ]["developerConfiguration"] == {"featureGates": ["HostDevices"]}


def test_example_vms_request_exactly_what_the_patch_permits() -> None:
    raw = bare_metal(
        {"name": "bm-1", "workload": "vm-passthrough", "gpus": {"A100-PCIE-40GB": 1}},
        {"name": "bm-2", "workload": "vm-vgpu", "gpus": {"L4": 1}, "vgpuType": "L4-6Q"},
    )
    spec = load_spec(raw)
    devices = permitted(spec)
    allowed = {e["resourceName"] for kind in devices.values() for e in kind}
    vms = example_virtual_machines(gpu_nodes(spec), spec.guest.ssh_public_keys)
    requested = [g["deviceName"] for vm in vms for g in vm["spec"]["template"]["spec"]["domain"]["devices"]["gpus"]]
    assert sorted(requested) == sorted(allowed)  # every permitted resource once, nothing else
    for vm in vms:
        assert (vm["apiVersion"], vm["kind"]) == ("kubevirt.io/v1", "VirtualMachine")
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", vm["metadata"]["name"])
        template = vm["spec"]["template"]["spec"]
        disks = {d["name"] for d in template["domain"]["devices"]["disks"]}
        assert disks == {v["name"] for v in template["volumes"]}


def test_docker_config_json() -> None:
    config = json.loads(docker_config_json("nvcr.io", "$oauthtoken", "s3cret"))
    entry = config["auths"]["nvcr.io"]
    assert base64.b64decode(entry["auth"]).decode() == "$oauthtoken:s3cret"
    assert (entry["username"], entry["password"]) == ("$oauthtoken", "s3cret")


def test_patch_targets_the_configured_kubevirt_cr() -> None:
    rec = plan_stack(bare_metal())
    component = rec.one("proxmox-gpu-cluster:kubevirt_devices:KubeVirtGpuDevices")
    patch = rec.one(PATCH)
    assert patch.name == "cluster-kubevirt-gpus-kubevirt" and patch.parent == component.urn
    inputs = patch.plain_inputs
    assert (inputs["apiVersion"], inputs["kind"]) == ("kubevirt.io/v1", "KubeVirt")
    assert inputs["metadata"] == {
        "name": "kubevirt",
        "namespace": "kubevirt",
        "annotations": {"pulumi.com/patchForce": "true"},
    }
    assert inputs["spec"] == kubevirt_patch_spec(
        gpu_nodes(load_spec(bare_metal())), load_spec(bare_metal()).kubevirt.feature_gates
    )
    assert patch.provider == rec.one("pulumi:providers:kubernetes").urn
    assert "hyperConvergedPermittedHostDevices" not in rec.outputs
    custom = plan_stack(bare_metal(name="kv", namespace="openshift-cnv")).one(PATCH).plain_inputs
    assert (custom["metadata"]["name"], custom["metadata"]["namespace"]) == ("kv", "openshift-cnv")


def test_no_patch_without_kubevirt() -> None:
    rec = plan_stack(base_spec())
    assert not rec.of_type(PATCH)
    assert "kubevirtPermittedHostDevices" not in rec.outputs
    assert not rec.of_type("proxmox-gpu-cluster:kubevirt_devices:KubeVirtGpuDevices")


def test_bare_metal_nodes_are_labelled_by_name() -> None:
    raw = bare_metal(
        {"name": "bm-1", "workload": "vm-vgpu", "gpus": {"A10": 2}, "vgpuType": "A10-12Q", "taint": True},
        {"name": "bm-2", "workload": "vm-passthrough", "gpus": {"L4": 1, "A10": 2}},
    )
    rec = plan_stack(raw)
    bm1 = rec.named("cluster-gpu-nodes-bm-1").plain_inputs
    assert bm1["metadata"]["name"] == "bm-1"
    assert bm1["metadata"]["labels"] == {
        "nvidia.com/gpu.workload.config": "vm-vgpu",
        "nvidia.com/vgpu.config": "A10-12Q",
        "proxmox-gpu-cluster.io/accelerator": "A10",
    }
    assert bm1["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]
    bm2 = rec.named("cluster-gpu-nodes-bm-2").plain_inputs["metadata"]["labels"]
    assert bm2["nvidia.com/gpu.workload.config"] == "vm-passthrough" and "nvidia.com/vgpu.config" not in bm2
    # Bare-metal nodes are not provisioned: no VM and no bootstrap for them, and their labels wait for nothing.
    assert not [r for r in rec.resources if "bm-1" in r.name and r.type.startswith(("proxmoxve:", "command:"))]
    assert not rec.named("cluster-gpu-nodes-bm-1").dependencies


def test_vgpu_pull_secret_stays_secret_and_the_release_waits_for_it() -> None:
    raw = bare_metal({"name": "bm-1", "workload": "vm-vgpu", "gpus": {"A10": 1}, "vgpuType": "A10-24Q"})
    rec = plan_stack(raw)
    secret = rec.named("cluster-gpu-operator-vgpu-pull-secret")
    assert secret.type == "kubernetes:core/v1:Secret"
    inputs = secret.plain_inputs
    assert inputs["type"] == "kubernetes.io/dockerconfigjson"
    assert inputs["metadata"] == {"name": "vgpu-manager-registry", "namespace": "gpu-operator"}
    config = json.loads(inputs["stringData"][".dockerconfigjson"])
    assert config["auths"]["registry.example.test"]["password"] == SECRETS["vgpuRegistryPassword"]
    release = rec.one("kubernetes:helm.sh/v3:Release")
    assert rec.depends_on(release, secret)
    assert release.plain_inputs["values"]["vgpuManager"]["imagePullSecrets"] == ["vgpu-manager-registry"]
    for r in rec.resources:
        assert not [s for s in plain_strings(r.inputs) if SECRETS["vgpuRegistryPassword"] in s], r.name


def test_no_pull_secret_without_vgpu() -> None:
    rec = plan_stack(bare_metal())
    assert not rec.of_type("kubernetes:core/v1:Secret")


def test_hco_clusters_skip_the_patch_but_get_the_device_list() -> None:
    raw = bare_metal(patchKubeVirt=False)
    rec = plan_stack(raw)
    assert not rec.of_type(PATCH)
    assert rec.outputs["kubevirtPermittedHostDevices"] == permitted(load_spec(raw))
    # HCO's HyperConverged CR spells the PCI selector pciDeviceSelector (it copies the list into the KubeVirt CR).
    assert rec.outputs["hyperConvergedPermittedHostDevices"] == {
        "pciHostDevices": [
            {
                "pciDeviceSelector": "10DE:2236",
                "resourceName": "nvidia.com/GA102GL_A10",
                "externalResourceProvider": True,
            }
        ]
    }
    assert rec.named("cluster-gpu-nodes-ts-1")  # labels and operator values still apply
    assert rec.one("kubernetes:helm.sh/v3:Release").plain_inputs["values"]["sandboxWorkloads"]["enabled"] is True
