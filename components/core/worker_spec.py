"""Spec models of a worker VM: its GPUs, sharing, boot image and network. Pure."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, GetJsonSchemaHandler, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.core.net_checks import check_http_url, check_ip_or_cidr, check_ipv4, check_unicast
from proxmox_gpu_cluster.core.spec_base import (
    DNS_LABEL,
    BridgeId,
    DnsName,
    Int,
    IpAddress,
    MigConfig,
    Name,
    SpecModel,
    StorageId,
    VgpuType,
    camel_alias,
    check_cloud_image,
    with_string_shorthand,
)

MAX_MEMORY_MIB = 4 * 1024 * 1024
"""4 TiB: far above any GPU worker, and a bound that keeps absurd values out of the Proxmox API."""


class GpuAssignment(SpecModel):
    """A GPU a worker claims. A plain string is shorthand for ``{ref: <string>}``."""

    ref: Name = Field(description="Name of a GPU in the worker's Proxmox node.")
    mig: MigConfig | None = Field(default=None, description="MIG config for this GPU; overrides the worker's ``mig``.")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"ref": data} if isinstance(data, str) else data

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return with_string_shorthand(core_schema, handler, {"type": "string", "pattern": DNS_LABEL})


class TimeSlicing(SpecModel):
    """Time-slicing settings of the device plugin for one worker."""

    replicas: Int = Field(ge=2, le=64, description="Pods that may share each GPU (at least 2).")
    rename_by_default: bool = Field(
        default=False, description="Advertise ``<resource>.shared`` instead of the plain resource name."
    )
    fail_requests_greater_than_one: bool = Field(
        default=False, description="Reject pods that ask for more than one shared replica."
    )


class Image(SpecModel):
    """Where the worker's boot disk comes from: a cloud image download or a template clone."""

    cloud_image_url: Annotated[str, AfterValidator(check_http_url), AfterValidator(check_cloud_image)] | None = Field(
        default=None,
        description="Cloud image to import (Ubuntu 22.04/24.04 server cloud image, qcow2 or raw). The file stored on "
        "the datastore gets a name derived from the URL and the stack, so two stacks or two URLs never share one.",
    )
    checksum: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="SHA-256 of the cloud image, checked on download.",
    )
    template_vmid: Int | None = Field(
        default=None, ge=100, le=999_999_999, description="Clone this template VM instead of importing."
    )
    datastore: StorageId = Field(default="local", description="Datastore for the downloaded image.")

    @model_validator(mode="after")
    def _one_source(self) -> Image:
        if (self.cloud_image_url is None) == (self.template_vmid is None):
            raise ValueError("set exactly one of cloudImageUrl or templateVmid")
        if self.checksum is not None and self.cloud_image_url is None:
            raise ValueError("checksum only applies to cloudImageUrl")
        return self


def _static_unicast(value: str) -> str:
    return value if value == "dhcp" else check_unicast(value)


class Network(SpecModel):
    """The worker's network interface and guest IP configuration (cloud-init)."""

    bridge: BridgeId = Field(default="vmbr0", description="Proxmox bridge.")
    vlan: Int | None = Field(default=None, ge=1, le=4094, description="VLAN tag, if any.")
    ipv4: Annotated[str, AfterValidator(check_ip_or_cidr), AfterValidator(_static_unicast)] = Field(
        default="dhcp", description="``dhcp`` or a static address with prefix (``10.0.0.51/24``)."
    )
    gateway: Annotated[str, AfterValidator(check_ipv4), AfterValidator(check_unicast)] | None = Field(
        default=None, description="IPv4 gateway for a static address; inside its subnet."
    )
    dns: tuple[Annotated[IpAddress, AfterValidator(check_unicast)], ...] = Field(
        default=(), max_length=3, description="DNS servers (at most three)."
    )
    search_domain: DnsName | None = Field(default=None, description="DNS search domain.")

    @model_validator(mode="after")
    def _gateway_in_subnet(self) -> Network:
        if self.ipv4 == "dhcp":
            if self.gateway is not None:
                raise SpecViolations([Problem("gateway", "only used with a static ipv4 address")])
            return self
        iface = ipaddress.IPv4Interface(self.ipv4)
        if self.gateway is not None:
            gateway = ipaddress.IPv4Address(self.gateway)
            if gateway not in iface.network:
                raise SpecViolations([Problem("gateway", f"{gateway} is outside {iface.network}")])
            if gateway == iface.ip:
                raise SpecViolations([Problem("gateway", f"{gateway} is the worker's own address")])
            if gateway in (iface.network.network_address, iface.network.broadcast_address):
                raise SpecViolations([Problem("gateway", f"{gateway} is not a host address of {iface.network}")])
        return self

    @property
    def static_address(self) -> str | None:
        """The static IPv4 address without its prefix, or None with DHCP."""
        return None if self.ipv4 == "dhcp" else self.ipv4.split("/")[0]


class Worker(SpecModel):
    """A Kubernetes GPU worker: a Proxmox VM with GPUs passed through. Its VM name is its node name."""

    model_config = ConfigDict(alias_generator=camel_alias(memory_mib="memoryMiB", disk_gib="diskGiB"))
    name: Name = Field(description="VM name and Kubernetes node name.")
    vmid: Int = Field(ge=100, le=999_999_999, description="Proxmox VM id.")
    node: Name = Field(description="Proxmox node the VM runs on.")
    cores: Int = Field(default=8, ge=1, le=512, description="vCPU cores (cpu type host).")
    memory_mib: Int = Field(
        default=32768, ge=2048, le=MAX_MEMORY_MIB, description="Guest RAM in MiB; pinned, no ballooning."
    )
    disk_gib: Int = Field(default=100, ge=20, le=65536, description="Boot disk size in GiB.")
    datastore: StorageId = Field(default="local-lvm", description="Datastore for the VM's disks.")
    image: Image = Field(
        default_factory=lambda: Image(
            cloud_image_url="https://cloud-images.ubuntu.com/jammy/current/jammy-server-cloudimg-amd64.img"
        ),
        description="Boot disk source; defaults to the Ubuntu 22.04 cloud image.",
    )
    network: Network = Field(default_factory=Network, description="Network and IP settings.")
    ssh_user: str = Field(default="ubuntu", pattern=r"^[a-z_][a-z0-9_-]{0,31}$", description="Guest login user.")
    gpus: tuple[GpuAssignment, ...] = Field(min_length=1, description="GPUs passed through to this VM.")
    workload: Literal["container", "vm-passthrough", "vm-vgpu"] = Field(
        default="container",
        description="What the node runs: containers, or KubeVirt VMs with whole GPUs or vGPUs.",
    )
    sharing: Literal["none", "time-slicing", "mig"] = Field(
        default="none", description="How containers share this node's GPUs."
    )
    time_slicing: TimeSlicing | None = Field(default=None, description="Settings when sharing is time-slicing.")
    mig: MigConfig | None = Field(default=None, description="MIG config for every GPU without its own.")
    vgpu_type: VgpuType | None = Field(default=None, description="vGPU type for vm-vgpu, e.g. ``A10-24Q``.")
    dra: bool = Field(
        default=False,
        description="Allocate this node's GPUs with the NVIDIA DRA driver instead of the device plugin "
        "(Kubernetes 1.34+, driver branch 580+).",
    )
    taint: bool = Field(default=False, description="Taint the node nvidia.com/gpu=true:NoSchedule.")
    protect: bool = Field(default=False, description="Protect the VM from deletion by Pulumi.")
    on_boot: bool = Field(default=True, description="Start the VM when its Proxmox node boots.")
    tags: tuple[Annotated[str, Field(pattern=r"^[a-z0-9_][a-z0-9_.+-]{0,63}$")], ...] = Field(
        default=(), max_length=32, description="Extra Proxmox tags."
    )
