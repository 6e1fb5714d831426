"""Fake ``get_pci`` answers for the mock engine: hosts shaped like the spec, or device lists you give."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.spec import ClusterSpec, HostGpu

InvokeHook = Callable[[Mapping[str, Any]], Mapping[str, Any]]

GET_PCI = "proxmoxve:hardware/getPci:getPci"


def spec_shaped_pci(spec: ClusterSpec, node: str, *, iommu: bool = True) -> list[dict[str, Any]]:
    """A ``get_pci`` device list of a host exactly as the spec describes it: each GPU at its path with its
    model's ids, in an IOMMU group of its own (behind its own root port); all groups -1 with ``iommu=False``,
    as a host reports before IOMMU is on."""
    return _shaped(list(spec.node(node).gpus), iommu=iommu)


def _shaped(gpus: Sequence[HostGpu], *, iommu: bool = True) -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = []
    for j, gpu in enumerate(gpus):
        vendor, device = gpu.vendor_device.split(":")
        group = 20 + j if iommu else -1
        devices.append(_pci(f"0000:00:{j + 1:02x}.1", "1022", "1483", "0x060400", group, "PCIe root port"))
        devices.append(_pci(f"{gpu.pci_path}.0", vendor, device, "0x030200", group, CATALOG[gpu.model].pci_name))
    return devices


def _pci(address: str, vendor: str, device: str, pci_class: str, group: int, name: str) -> dict[str, Any]:  # noqa: PLR0917
    return {
        "id": address, "vendor": f"0x{vendor}", "device": f"0x{device}", "class": pci_class, "iommuGroup": group,
        "subsystemVendor": f"0x{vendor}", "subsystemDevice": "0x1482", "deviceName": name, "vendorName": "",
        "subsystemVendorName": "", "subsystemDeviceName": "", "mdev": False,
    }  # fmt: skip


def pci_invokes(
    spec: ClusterSpec | Sequence[ClusterSpec] | None, devices: Mapping[str, list[dict[str, Any]]] | None = None
) -> dict[str, InvokeHook]:
    """Invoke mocks answering ``get_pci`` per node from ``devices`` (node -> device list), else with a host
    shaped like the specs (``spec_shaped_pci``; a node several specs share has every GPU any of them declares;
    no devices for a node no spec has)."""
    given = dict(devices or {})
    specs = [spec] if isinstance(spec, ClusterSpec) else list(spec or [])

    def get_pci(args: Mapping[str, Any]) -> dict[str, Any]:
        node = str(args.get("nodeName"))
        gpus: dict[str, HostGpu] = {}
        for s in specs:
            for n in (n for n in s.proxmox.nodes if n.name == node):
                gpus.update({g.pci_path: g for g in n.gpus if g.pci_path not in gpus})
        return {"nodeName": node, "devices": given.get(node) or _shaped(list(gpus.values()))}

    return {GET_PCI: get_pci}
