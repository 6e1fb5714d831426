"""Fake ``get_pci`` answers for the mock engine: hosts shaped like the spec, or device lists you give (in the
provider's field names or the Proxmox API's)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from proxmox_gpu_cluster.core.iommu import PciDevice, described_devices
from proxmox_gpu_cluster.core.spec import ClusterSpec, HostGpu, ProxmoxNode

InvokeHook = Callable[[Mapping[str, Any]], Mapping[str, Any]]

GET_PCI = "proxmoxve:hardware/getPci:getPci"

API_FIELDS = {
    "iommugroup": "iommuGroup",
    "subsystem_vendor": "subsystemVendor",
    "subsystem_device": "subsystemDevice",
    "vendor_name": "vendorName",
    "device_name": "deviceName",
    "subsystem_vendor_name": "subsystemVendorName",
    "subsystem_device_name": "subsystemDeviceName",
}
"""The Proxmox API's snake-case PCI fields (``pvesh get /nodes/<node>/hardware/pci --output-format json``, and
``GET /api2/json/nodes/{node}/hardware/pci`` in the API viewer) -> the provider's ``get_pci`` fields."""


def provider_fields(device: Mapping[str, Any]) -> dict[str, Any]:
    """One device in the provider's field names, whichever spelling it came in."""
    return {API_FIELDS.get(k, k): v for k, v in device.items()}


def spec_shaped_pci(
    spec: ClusterSpec | ProxmoxNode, node: str | None = None, *, iommu: bool = True
) -> list[dict[str, Any]]:
    """A ``get_pci`` device list of a host exactly as the spec describes it: each GPU at its path with its
    model's ids, in an IOMMU group of its own (behind its own root port); all groups -1 with ``iommu=False``,
    as a host reports before IOMMU is on. ``spec``: a cluster spec and the ``node``'s name, or the node itself."""
    host = spec if isinstance(spec, ProxmoxNode) else spec.node(str(node))
    return _shaped(list(host.gpus), iommu=iommu)


def _shaped(gpus: Sequence[HostGpu], *, iommu: bool = True) -> list[dict[str, Any]]:
    return [_answer(d) for d in described_devices(list(gpus), iommu=iommu)]


def _answer(d: PciDevice) -> dict[str, Any]:
    vendor, device = d.vendor_device.split(":")
    sub_vendor, sub_device = d.subsystem.split(":")
    return {
        "id": d.address, "vendor": f"0x{vendor}", "device": f"0x{device}", "class": f"0x{d.pci_class}",
        "iommuGroup": d.iommu_group, "subsystemVendor": f"0x{sub_vendor}", "subsystemDevice": f"0x{sub_device}",
        "deviceName": d.name, "vendorName": "", "subsystemVendorName": "", "subsystemDeviceName": "", "mdev": False,
    }  # fmt: skip


def pci_invokes(
    spec: ClusterSpec | Sequence[ClusterSpec] | None, devices: Mapping[str, Sequence[Mapping[str, Any]]] | None = None
) -> dict[str, InvokeHook]:
    """Invoke mocks answering ``get_pci`` per node from ``devices`` (node -> device list, in the provider's field
    names or the Proxmox API's: ``iommuGroup`` or ``iommugroup``), else with a host shaped like the specs
    (``spec_shaped_pci``; a node several specs share has every GPU any of them declares). A node neither names
    gets an answer without a device list, and the preflight then checks the node as the program itself describes
    it: so any cluster or node the program builds plans, whatever specs were given here."""
    given = {node: [provider_fields(d) for d in listed] for node, listed in (devices or {}).items()}
    specs = [spec] if isinstance(spec, ClusterSpec) else list(spec or [])

    def get_pci(args: Mapping[str, Any]) -> dict[str, Any]:
        node = str(args.get("nodeName"))
        if node in given:
            return {"nodeName": node, "devices": given[node]}
        gpus: dict[str, HostGpu] = {}
        for s in specs:
            for n in (n for n in s.proxmox.nodes if n.name == node):
                gpus.update({g.pci_path: g for g in n.gpus if g.pci_path not in gpus})
        return {"nodeName": node, "devices": _shaped(list(gpus.values()))} if gpus else {"nodeName": node}

    return {GET_PCI: get_pci}
