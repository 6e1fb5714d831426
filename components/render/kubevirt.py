"""KubeVirt as data: the GPU devices the KubeVirt CR must permit, the pull secret of the vGPU Manager image and
example VirtualMachines that request the GPUs. Pure.

The NVIDIA sandbox device plugin advertises what KubeVirt hands to VMs (``externalResourceProvider: true``):
whole GPUs as ``nvidia.com/<pci.ids name>`` and vGPUs as ``nvidia.com/NVIDIA_<type>``. KubeVirt only schedules
a VM that asks for one of them when the KubeVirt CR lists it under ``spec.configuration.permittedHostDevices``
and the ``HostDevices`` feature gate is on (KubeVirt user guide, "Host Devices Assignment"; the ``GPU`` gate is
GA since KubeVirt 1.4 and no longer needed).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from proxmox_gpu_cluster.core.capacity import vgpu_resource
from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.nodes import GpuNode

API_VERSION = "kubevirt.io/v1"
REQUIRED_FEATURE_GATES = ("HostDevices",)
"""Feature gates the GPU devices need on every KubeVirt version this supports."""
EXAMPLE_IMAGE = "quay.io/containerdisks/ubuntu:24.04"
"""The example VMs' root disk: a KubeVirt containerDisk of Ubuntu's cloud image."""


@dataclass(frozen=True)
class PciHostDevice:
    """A whole GPU KubeVirt may pass to VMs."""

    pci_vendor_selector: str
    """``VENDOR:DEVICE`` in upper case, as KubeVirt matches it (``10DE:2236``)."""
    resource_name: str
    """Extended resource the sandbox device plugin advertises for it."""


@dataclass(frozen=True)
class MediatedDevice:
    """A vGPU type KubeVirt may pass to VMs."""

    mdev_name_selector: str
    """The mdev type's name as the vGPU Manager reports it (``NVIDIA A10-24Q``)."""
    resource_name: str
    """Extended resource the sandbox device plugin advertises for it (``nvidia.com/NVIDIA_A10-24Q``)."""


def passthrough_models(nodes: Sequence[GpuNode]) -> list[str]:
    """Catalog keys of every GPU model on a vm-passthrough node, in catalog order."""
    keys = {m.key for n in nodes if n.workload == "vm-passthrough" for m in n.models}
    return [k for k in CATALOG if k in keys]


def vgpu_types(nodes: Sequence[GpuNode]) -> list[str]:
    """Every vGPU type a vm-vgpu node uses, sorted."""
    return sorted({n.vgpu_type for n in nodes if n.workload == "vm-vgpu" and n.vgpu_type})


def pci_host_devices(nodes: Sequence[GpuNode]) -> list[PciHostDevice]:
    """One entry per PCI id of every passthrough model: a model's variant ids (``10de:20b1`` for an A100 PCIe
    40GB) carry the same pci.ids name (tests/components/test_catalog.py checks it), so the plugin advertises
    them under the model's one resource name."""
    return [
        PciHostDevice(pci_vendor_selector=vd.upper(), resource_name=CATALOG[key].sandbox_resource_name)
        for key in passthrough_models(nodes)
        for vd in CATALOG[key].vendor_devices
    ]


def mediated_devices(nodes: Sequence[GpuNode]) -> list[MediatedDevice]:
    """One entry per vGPU type in use."""
    return [MediatedDevice(mdev_name_selector=f"NVIDIA {t}", resource_name=vgpu_resource(t)) for t in vgpu_types(nodes)]


def feature_gates(gates: Sequence[str]) -> list[str]:
    """The CR's whole feature-gate list: the given gates plus the required ones, sorted and without repeats."""
    return sorted({*gates, *REQUIRED_FEATURE_GATES})


def permitted_host_devices(nodes: Sequence[GpuNode], *, hyperconverged: bool = False) -> dict[str, Any]:
    """``permittedHostDevices`` of the KubeVirt CR, or with ``hyperconverged`` of the HCO ``HyperConverged`` CR,
    which spells the PCI selector ``pciDeviceSelector`` and copies the lists into the KubeVirt CR it owns."""
    selector = "pciDeviceSelector" if hyperconverged else "pciVendorSelector"
    permitted: dict[str, Any] = {}
    pci = pci_host_devices(nodes)
    if pci:
        permitted["pciHostDevices"] = [
            {selector: d.pci_vendor_selector, "resourceName": d.resource_name, "externalResourceProvider": True}
            for d in pci
        ]
    mdev = mediated_devices(nodes)
    if mdev:
        permitted["mediatedDevices"] = [
            {
                "mdevNameSelector": d.mdev_name_selector,
                "resourceName": d.resource_name,
                "externalResourceProvider": True,
            }
            for d in mdev
        ]
    return permitted


def kubevirt_patch_spec(nodes: Sequence[GpuNode], gates: Sequence[str] = ()) -> dict[str, Any]:
    """``spec`` of the patch on the KubeVirt CR.

    Both device lists and the gate list are atomic lists in KubeVirt's schema: a server-side apply replaces
    them whole, so this patch owns them and lists everything they must contain.
    """
    return {
        "configuration": {
            "permittedHostDevices": permitted_host_devices(nodes),
            "developerConfiguration": {"featureGates": feature_gates(gates)},
        }
    }


def docker_config_json(registry: str, username: str, password: str) -> str:
    """``.dockerconfigjson`` of an image pull secret for one registry (call it inside a secret Output)."""
    auth = base64.b64encode(f"{username}:{password}".encode()).decode()
    return json.dumps({"auths": {registry: {"username": username, "password": password, "auth": auth}}})


def example_virtual_machines(
    nodes: Sequence[GpuNode], ssh_public_keys: Sequence[str], namespace: str = "default"
) -> list[dict[str, Any]]:
    """A stopped VirtualMachine per permitted GPU resource, each requesting one device by its resource name.

    Start one with ``virtctl start <name>``; it runs on a node that advertises the resource.
    """
    resources = sorted({d.resource_name for d in pci_host_devices(nodes)})
    resources += [d.resource_name for d in mediated_devices(nodes)]
    # The stack's SSH keys, so whoever reaches the workers reaches the example VMs (virtctl ssh). Emitted, never
    # concatenated: a key comment is data and cannot add or reshape a key of the document.
    config = {"ssh_pwauth": False, "ssh_authorized_keys": list(ssh_public_keys)}
    user_data = "#cloud-config\n" + yaml.safe_dump(config, sort_keys=False, default_flow_style=False, width=1 << 16)
    return [_virtual_machine(resource, namespace, user_data) for resource in resources]


def _virtual_machine(resource: str, namespace: str, user_data: str) -> dict[str, Any]:
    name = "gpu-vm-" + resource.split("/", 1)[1].lower().replace("_", "-").replace(".", "-")
    return {
        "apiVersion": API_VERSION,
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runStrategy": "Halted",
            "template": {
                "metadata": {"labels": {"kubevirt.io/domain": name}},
                "spec": {
                    "domain": {
                        "cpu": {"cores": 4},
                        "memory": {"guest": "16Gi"},
                        "devices": {
                            "disks": [
                                {"name": "rootdisk", "disk": {"bus": "virtio"}},
                                {"name": "cloudinit", "disk": {"bus": "virtio"}},
                            ],
                            "gpus": [{"name": "gpu1", "deviceName": resource}],
                        },
                    },
                    "volumes": [
                        {"name": "rootdisk", "containerDisk": {"image": EXAMPLE_IMAGE}},
                        {"name": "cloudinit", "cloudInitNoCloud": {"userData": user_data}},
                    ],
                },
            },
        },
    }
