"""IOMMU preflight: does each passthrough GPU sit where the spec says, and alone in its IOMMU group? Pure.

Input is the node's PCI device list as ``proxmoxve.hardware.get_pci`` reports it (all classes, bridges
included). A GPU can only be passed through safely when its IOMMU group holds nothing but the card's own
functions and PCI bridges; anything else in the group would be handed to the VM too, or block the start.

When the host has no IOMMU enabled yet, every group is reported as -1 (the first run, before host prep has
rebooted the node), or when the node asks for the ACS override (which changes the groups at the next boot): then
the check is deferred to host prep's verify step, which performs it from /sys/kernel/iommu_groups after the
reboot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.errors import Problem
from proxmox_gpu_cluster.core.spec import ClusterSpec, HostGpu, ProxmoxNode

BRIDGE_CLASS = "0604"
"""PCI class 06 (bridge), subclass 04 (PCI-to-PCI): root ports and switches may share a GPU's group."""


@dataclass(frozen=True)
class PciDevice:
    """One PCI function on a Proxmox node, normalised (lower-case hex, no 0x)."""

    address: str
    """domain:bus:device.function, e.g. ``0000:41:00.0``."""
    vendor_device: str
    """``10de:2236``."""
    pci_class: str
    """Class code without 0x, e.g. ``030200``."""
    iommu_group: int
    """-1 when the host has no IOMMU enabled."""
    subsystem: str
    """Subsystem vendor:device, e.g. ``10de:1482``."""
    name: str = ""
    """Human-readable device name."""

    @property
    def slot(self) -> str:
        """The address without the function (what the spec's ``pciPath`` names)."""
        return self.address.rsplit(".", 1)[0]


def _hex(value: str) -> str:
    return value.lower().removeprefix("0x")


def pci_device(  # noqa: PLR0917 (mirrors get_pci's fields one to one)
    address: str,
    vendor: str,
    device: str,
    pci_class: str,
    iommu_group: int,
    subsystem_vendor: str = "",
    subsystem_device: str = "",
    name: str = "",
) -> PciDevice:
    """A PciDevice from the fields get_pci reports (hex with or without 0x)."""
    subsystem = f"{_hex(subsystem_vendor)}:{_hex(subsystem_device)}" if subsystem_vendor else ""
    return PciDevice(
        address=address.lower(),
        vendor_device=f"{_hex(vendor)}:{_hex(device)}",
        pci_class=_hex(pci_class),
        iommu_group=int(iommu_group),
        subsystem=subsystem,
        name=name,
    )


@dataclass(frozen=True)
class GpuPlacement:
    """What the preflight learned about one passthrough GPU."""

    gpu: str
    """The GPU's name in the spec."""
    slot: str
    """Its PCI path."""
    iommu_group: int | None
    """Its IOMMU group, or None when the host reports none yet."""
    subsystem: str | None
    """Subsystem id of function 0, for the PCI mapping."""


@dataclass(frozen=True)
class NodePreflight:
    """The preflight of one Proxmox node."""

    node: str
    check: Literal["plan", "host-verify"]
    """plan: isolation was checked now; host-verify: groups are unknown, host prep's verify step checks."""
    problems: list[Problem] = field(default_factory=list)
    gpus: list[GpuPlacement] = field(default_factory=list)


def empty_device_list(node: str) -> str:
    """Why an empty device list for ``node`` says nothing about the host."""
    return (
        f"the PCI device list answered for node {node} is empty, which no running host reports (it lists at least "
        "its host bridge), so the preflight cannot check its GPUs; under mocks answer get_pci for this node "
        f"(testing.pci_invokes), in the offline plan give --pci {node}=FILE"
    )


def _describe(d: PciDevice) -> str:
    return f"{d.address} ({d.name or d.vendor_device})"


def preflight(spec: ClusterSpec, node: str, devices: list[PciDevice]) -> NodePreflight:
    """``preflight_node`` for the node called ``node`` of ``spec``, its problems at ``proxmox.nodes[<i>]``."""
    node_index = next(i for i, n in enumerate(spec.proxmox.nodes) if n.name == node)
    return preflight_node(spec.proxmox.nodes[node_index], devices, at=f"proxmox.nodes[{node_index}]")


def preflight_node(spec_node: ProxmoxNode, devices: list[PciDevice], *, at: str = "") -> NodePreflight:
    """Check the node's passthrough GPUs (every declared GPU but the console one) against its PCI device list;
    a problem's path is below ``at``, the node's own path (empty: the node is the root, as for a node built alone).

    With ``acsOverride`` the groups the host reports now are not the groups the GPUs will have once host prep has
    rebooted it with the override, so the isolation check (and the groups the mappings record) moves to host
    prep's verify step, as when the IOMMU is still off.
    """
    node = spec_node.name
    if not devices:
        # Every running host lists its host bridge and root ports; an empty list was never read from a host, so
        # nothing can be said about its GPUs (a mock engine or an offline plan that was given no device list).
        return NodePreflight(node, "plan", [Problem(at, empty_device_list(node))])
    by_slot: dict[str, list[PciDevice]] = {}
    for d in devices:
        by_slot.setdefault(d.slot, []).append(d)
    problems: list[Problem] = []
    placements: list[GpuPlacement] = []
    gpus = spec_node.passthrough_gpus
    iommu_off = any(d.iommu_group < 0 for _, g in gpus for d in by_slot.get(g.pci_path, []))
    deferred = iommu_off or spec_node.acs_override
    for i, gpu in gpus:
        at_gpu = f"{at}.gpus[{i}]" if at else f"gpus[{i}]"
        functions = sorted(by_slot.get(gpu.pci_path, []), key=lambda d: d.address)
        primary = next((d for d in functions if d.address == f"{gpu.pci_path}.0"), None)
        if primary is None:
            problems.append(Problem(f"{at_gpu}.pciPath", f"no PCI device at {gpu.pci_path}.0 on node {node}"))
            continue
        if primary.vendor_device != gpu.vendor_device:
            model = CATALOG[gpu.model]
            problems.append(
                Problem(
                    f"{at_gpu}.model",
                    f"{gpu.pci_path}.0 on {node} is {primary.vendor_device} ({primary.name or 'unknown device'}), "
                    f"not a {model.key} ({gpu.vendor_device})",
                )
            )
            continue
        group = None if deferred else primary.iommu_group
        placements.append(GpuPlacement(gpu.name, gpu.pci_path, group, primary.subsystem or None))
        if deferred:
            continue
        groups = {d.iommu_group for d in functions}
        others = [
            d
            for d in devices
            if d.iommu_group in groups and d.slot != gpu.pci_path and not d.pci_class.startswith(BRIDGE_CLASS)
        ]
        if others:
            names = ", ".join(_describe(d) for d in sorted(others, key=lambda d: d.address))
            problems.append(
                Problem(
                    f"{at_gpu}.pciPath",
                    f"IOMMU group {', '.join(map(str, sorted(groups)))} of {gpu.pci_path} also holds {names}; "
                    "set acsOverride: true on this node (weakens isolation) or move the card to another slot",
                )
            )
    return NodePreflight(node, "host-verify" if deferred else "plan", problems, placements)


ROOT_PORT = ("1022:1483", "060400", "1022:1482", "PCIe root port")
"""What ``described_devices`` puts above each GPU: a root port of its own (AMD's, as on an EPYC host)."""


def described_devices(gpus: list[HostGpu], *, iommu: bool = True) -> list[PciDevice]:
    """The PCI functions of a host exactly as ``gpus`` describe it: each GPU at its path with its model's ids,
    alone in an IOMMU group behind its own root port; every group -1 with ``iommu=False`` (IOMMU off). What the
    preflight checks when the lookup brought no device list (a mock engine that answers ``{}``)."""
    devices: list[PciDevice] = []
    for j, gpu in enumerate(gpus):
        group = 20 + j if iommu else -1
        port, port_class, port_subsystem, port_name = ROOT_PORT
        devices.append(PciDevice(f"0000:00:{j + 1:02x}.1", port, port_class, group, port_subsystem, port_name))
        name = CATALOG[gpu.model].pci_name
        vendor = gpu.vendor_device.split(":")[0]
        devices.append(PciDevice(f"{gpu.pci_path}.0", gpu.vendor_device, "030200", group, f"{vendor}:1482", name))
    return devices
