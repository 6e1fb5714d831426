"""The cluster spec: one typed, validated description of the whole GPU cluster.

It is what ``proxmox-gpu-cluster:cluster`` in ``Pulumi.<stack>.yaml`` holds. Keys are camelCase, the only
spelling accepted (snake_case keys are refused as unknown). Secrets are never part of it: they are separate
secret config keys (see ``stacks.config``). Field-level rules live on the fields; rules that relate several
parts of the spec live in ``components.validation`` and run from ``ClusterSpec``'s validator. Load a spec with
``components.errors.load_spec`` to get every problem at once as ``cluster.<path>: message``.

Pure: nothing here imports Pulumi.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from components.catalog import CATALOG
from components.errors import Problem, SpecError, SpecViolations, problems_from_validation_error

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
PCI_PATH = r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}$"
VENDOR_DEVICE = r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$"
EXTENDED_RESOURCE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
SUPPORTED_CHARTS = ("v26.7.0", "v25.10.1")


class SpecModel(BaseModel):
    """Base for every spec model: immutable, no unknown keys, camelCase keys only."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
        str_strip_whitespace=True,
    )


def _known_model(key: str) -> str:
    if key not in CATALOG:
        raise ValueError(f"unknown GPU model {key!r}; known: {', '.join(CATALOG)}")
    return key


def _pci_path(value: str) -> str:
    if not re.fullmatch(PCI_PATH, value):
        raise ValueError(f"expected a PCI path domain:bus:device without function, like 0000:41:00; got {value!r}")
    return value.lower()


def _vendor_device(value: str) -> str:
    if not re.fullmatch(VENDOR_DEVICE, value):
        raise ValueError(f"expected a PCI vendor:device id like 10de:20f1; got {value!r}")
    return value.lower()


def _ip_or_cidr(value: str) -> str:
    if value == "dhcp":
        return value
    try:
        ipaddress.IPv4Interface(value)
    except ValueError:
        raise ValueError(f"expected 'dhcp' or an IPv4 address with prefix like 10.0.0.5/24, got {value!r}") from None
    if "/" not in value:
        raise ValueError(f"static address needs a prefix length (e.g. {value}/24)")
    return value


def _ip(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"not an IP address: {value!r}") from None
    return value


Name = Annotated[str, Field(pattern=DNS_LABEL, description="A lower-case DNS label (RFC 1123).")]
GpuModelKey = Annotated[str, AfterValidator(_known_model)]
IpAddress = Annotated[str, AfterValidator(_ip)]
MigConfig = str | dict[str, int]
"""A named operator MIG config (``all-1g.5gb``) or a custom geometry ``{profile: count}`` for one GPU."""


class HostGpu(SpecModel):
    """A physical GPU installed in a Proxmox node."""

    name: Name = Field(description="Name workers use to claim this GPU; unique within its Proxmox node.")
    pci_path: Annotated[str, AfterValidator(_pci_path)] = Field(
        description="PCI address without the function, domain:bus:device (``0000:41:00``), so every function of "
        "the card passes through together.",
    )
    model: GpuModelKey = Field(description="Catalog key of the GPU model, e.g. ``A100-PCIE-40GB`` or ``A10``.")
    device_id: Annotated[str, AfterValidator(_vendor_device)] | None = Field(
        default=None,
        description="vendor:device id when the card is a variant with a non-canonical id (e.g. ``10de:20b1``); "
        "must belong to the model. Defaults to the model's canonical id.",
    )
    console: bool = Field(
        default=False,
        description="This GPU drives the host console; it must never be passed through.",
    )

    @model_validator(mode="after")
    def _normalise_and_check_id(self) -> HostGpu:
        if self.device_id is not None and self.device_id not in CATALOG[self.model].vendor_devices:
            known = ", ".join(CATALOG[self.model].vendor_devices)
            raise ValueError(f"deviceId {self.device_id} is not a {self.model} (known ids: {known})")
        return self

    @property
    def vendor_device(self) -> str:
        """The vendor:device id this GPU is expected to report, lower case."""
        return self.device_id or CATALOG[self.model].vendor_device


class ProxmoxNode(SpecModel):
    """A Proxmox VE node that hosts GPU workers."""

    name: Name = Field(description="Proxmox node name as shown in the datacenter tree.")
    ssh_address: str = Field(min_length=1, description="Host name or IP address SSH reaches the node at.")
    cpu_vendor: Literal["intel", "amd"] = Field(description="CPU vendor; selects intel_iommu or amd_iommu.")
    boot_loader: Literal["grub", "systemd-boot", "auto"] = Field(
        default="auto", description="Where kernel arguments go; auto detects it on the host."
    )
    host_prep: bool = Field(
        default=False, description="Opt in to IOMMU/vfio host preparation (may reboot the node once)."
    )
    acs_override: bool = Field(
        default=False,
        description="Add pcie_acs_override=downstream,multifunction (splits IOMMU groups; weakens isolation).",
    )
    gpus: tuple[HostGpu, ...] = Field(default=(), description="GPUs installed in this node.")


class ProxmoxSpec(SpecModel):
    """How to reach the Proxmox VE cluster."""

    endpoint: str = Field(
        pattern=r"^https?://[^\s/]+(:\d+)?/?$", description="Proxmox API URL, e.g. ``https://pve1:8006/``."
    )
    tls_verify: bool = Field(default=True, description="Verify the API's TLS certificate.")
    auth_mode: Literal["token", "password"] = Field(
        default="token",
        description="token: API token (secret ``proxmoxApiToken``); password: user + password (secret "
        "``proxmoxPassword``), needed for root-only features such as raw hostpci ids and kvm arguments.",
    )
    username: str = Field(
        default="root@pam",
        pattern=r"^[^@\s]+@[^@\s]+$",
        description="user@realm for password authentication and for SSH-based provider operations.",
    )
    ssh_user: str = Field(
        default="root",
        pattern=r"^[a-z_][a-z0-9_-]*$",
        description="SSH user on the Proxmox nodes (host preparation, snippet uploads); key in ``sshPrivateKey``.",
    )
    nodes: tuple[ProxmoxNode, ...] = Field(min_length=1, description="Proxmox nodes this stack manages.")


class GpuAssignment(SpecModel):
    """A GPU a worker claims. A plain string is shorthand for ``{ref: <string>}``."""

    ref: Name = Field(description="Name of a GPU in the worker's Proxmox node.")
    mig: MigConfig | None = Field(default=None, description="MIG config for this GPU; overrides the worker's ``mig``.")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"ref": data} if isinstance(data, str) else data


class TimeSlicing(SpecModel):
    """Time-slicing settings of the device plugin for one worker."""

    replicas: int = Field(ge=2, le=64, description="Pods that may share each GPU (at least 2).")
    rename_by_default: bool = Field(
        default=False, description="Advertise ``<resource>.shared`` instead of the plain resource name."
    )
    fail_requests_greater_than_one: bool = Field(
        default=False, description="Reject pods that ask for more than one shared replica."
    )


class Image(SpecModel):
    """Where the worker's boot disk comes from: a cloud image download or a template clone."""

    cloud_image_url: str | None = Field(
        default=None,
        pattern=r"^https?://\S+\.(img|qcow2|raw)$",
        description="Cloud image to import (Ubuntu 22.04/24.04 server cloud image).",
    )
    checksum: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="SHA-256 of the cloud image, checked on download.",
    )
    template_vmid: int | None = Field(
        default=None, ge=100, le=999_999_999, description="Clone this template VM instead of importing."
    )
    datastore: str = Field(default="local", min_length=1, description="Datastore for the downloaded image.")

    @model_validator(mode="after")
    def _one_source(self) -> Image:
        if (self.cloud_image_url is None) == (self.template_vmid is None):
            raise ValueError("set exactly one of cloudImageUrl or templateVmid")
        if self.checksum is not None and self.cloud_image_url is None:
            raise ValueError("checksum only applies to cloudImageUrl")
        return self


class Network(SpecModel):
    """The worker's network interface and guest IP configuration (cloud-init)."""

    bridge: str = Field(default="vmbr0", min_length=1, description="Proxmox bridge.")
    vlan: int | None = Field(default=None, ge=1, le=4094, description="VLAN tag, if any.")
    ipv4: Annotated[str, AfterValidator(_ip_or_cidr)] = Field(
        default="dhcp", description="``dhcp`` or a static address with prefix (``10.0.0.51/24``)."
    )
    gateway: IpAddress | None = Field(default=None, description="IPv4 gateway for a static address.")
    dns: tuple[IpAddress, ...] = Field(default=(), description="DNS servers.")
    search_domain: str | None = Field(default=None, description="DNS search domain.")

    @model_validator(mode="after")
    def _gateway_in_subnet(self) -> Network:
        if self.ipv4 == "dhcp":
            if self.gateway is not None:
                raise ValueError("gateway is only used with a static ipv4 address")
            return self
        iface = ipaddress.IPv4Interface(self.ipv4)
        if self.gateway is not None and ipaddress.ip_address(self.gateway) not in iface.network:
            raise ValueError(f"gateway {self.gateway} is outside {iface.network}")
        return self


class Worker(SpecModel):
    """A Kubernetes GPU worker: a Proxmox VM with GPUs passed through. Its VM name is its node name."""

    name: Name = Field(description="VM name and Kubernetes node name.")
    vmid: int = Field(ge=100, le=999_999_999, description="Proxmox VM id.")
    node: Name = Field(description="Proxmox node the VM runs on.")
    cores: int = Field(default=8, ge=1, le=512, description="vCPU cores (cpu type host).")
    memory_mib: int = Field(
        default=32768, alias="memoryMiB", ge=2048, description="Guest RAM in MiB; pinned, no ballooning."
    )
    disk_gib: int = Field(default=100, alias="diskGiB", ge=20, le=65536, description="Boot disk size in GiB.")
    datastore: str = Field(default="local-lvm", min_length=1, description="Datastore for the VM's disks.")
    image: Image = Field(
        default_factory=lambda: Image(
            cloudImageUrl="https://cloud-images.ubuntu.com/jammy/current/jammy-server-cloudimg-amd64.img"
        ),
        description="Boot disk source; defaults to the Ubuntu 22.04 cloud image.",
    )
    network: Network = Field(default_factory=Network, description="Network and IP settings.")
    ssh_user: str = Field(default="ubuntu", pattern=r"^[a-z_][a-z0-9_-]*$", description="Guest login user.")
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
    vgpu_type: str | None = Field(
        default=None, pattern=r"^[A-Z0-9]+-\d+[QCBA]$", description="vGPU type for vm-vgpu, e.g. ``A10-24Q``."
    )
    taint: bool = Field(default=False, description="Taint the node nvidia.com/gpu=true:NoSchedule.")
    protect: bool = Field(default=False, description="Protect the VM from deletion by Pulumi.")
    on_boot: bool = Field(default=True, description="Start the VM when its Proxmox node boots.")
    tags: tuple[Annotated[str, Field(pattern=r"^[a-z0-9_][a-z0-9_.+-]*$")], ...] = Field(
        default=(), description="Extra Proxmox tags."
    )


class KubernetesSpec(SpecModel):
    """The Kubernetes cluster workers join."""

    api_endpoint: str = Field(
        pattern=r"^[A-Za-z0-9.-]+:\d{1,5}$", description="API server host:port used by kubeadm join."
    )
    version: str = Field(pattern=r"^1\.\d{2}$", description="Kubernetes minor version, e.g. ``1.34``.")
    join_method: Literal["kubeadm", "none"] = Field(
        default="kubeadm", description="kubeadm joins the VMs; none leaves joining to you."
    )

    @property
    def minor(self) -> int:
        """The minor version number (34 for ``1.34``)."""
        return int(self.version.split(".")[1])


class GpuOperatorSpec(SpecModel):
    """The NVIDIA GPU Operator release and the GPU software stack on the workers."""

    enabled: bool = Field(default=True, description="Install the GPU Operator.")
    chart_version: Literal["v26.7.0", "v25.10.1"] = Field(default="v26.7.0", description="Chart version.")
    namespace: Name = Field(default="gpu-operator", description="Namespace of the operator.")
    driver_mode: Literal["host", "operator"] = Field(
        default="host",
        description="host: the guest bootstrap installs the driver; operator: a driver container.",
    )
    driver_branch: str = Field(default="580", pattern=r"^\d{3}$", description="Driver branch, e.g. ``580``.")
    driver_version: str | None = Field(
        default=None, pattern=r"^\d{3}\.\d{1,3}(\.\d{1,3})?$", description="Exact driver version to pin."
    )
    kernel_module_type: Literal["auto", "open", "proprietary"] = Field(
        default="auto", description="Open or proprietary kernel modules; auto lets the driver choose."
    )
    cdi: bool = Field(default=False, description="Use the Container Device Interface.")
    dcgm: bool = Field(default=True, description="Deploy the DCGM exporter.")
    mig_strategy: Literal["none", "single", "mixed"] = Field(
        default="none",
        description="How MIG devices are advertised: as nvidia.com/gpu (single) or per profile.",
    )
    nfd: bool = Field(default=True, description="Deploy Node Feature Discovery; off when the cluster has it.")

    @model_validator(mode="after")
    def _version_in_branch(self) -> GpuOperatorSpec:
        if self.driver_version is not None and self.driver_version.split(".")[0] != self.driver_branch:
            raise ValueError(f"driverVersion {self.driver_version} is not on branch {self.driver_branch}")
        return self


class KubeVirtSpec(SpecModel):
    """KubeVirt integration for VM workloads."""

    enabled: bool = Field(default=False, description="Configure KubeVirt to use the GPUs.")


class Quota(SpecModel):
    """A ResourceQuota on GPU resources in one namespace."""

    namespace: Name = Field(description="Namespace the quota applies to.")
    resources: dict[Annotated[str, Field(pattern=EXTENDED_RESOURCE)], Annotated[int, Field(ge=0)]] = Field(
        min_length=1, description="Extended resource -> maximum requested, e.g. ``nvidia.com/gpu: 4``."
    )

    @model_validator(mode="after")
    def _no_prefix(self) -> Quota:
        # Kubernetes only allows `requests.` quotas for extended resources; we add the prefix ourselves.
        prefixed = [r for r in self.resources if r.startswith(("requests.", "limits."))]
        if prefixed:
            raise SpecViolations(
                Problem(
                    f"resources.{r}",
                    f"write the resource name only ({r.split('.', 1)[1]}); the requests. prefix is added for you",
                )
                for r in prefixed
            )
        return self


class ClusterSpec(SpecModel):
    """Everything one stack provisions."""

    proxmox: ProxmoxSpec = Field(description="Proxmox VE API and nodes.")
    workers: tuple[Worker, ...] = Field(min_length=1, description="GPU worker VMs.")
    kubernetes: KubernetesSpec = Field(description="Target Kubernetes cluster.")
    gpu_operator: GpuOperatorSpec = Field(default_factory=GpuOperatorSpec, description="GPU Operator settings.")
    kubevirt: KubeVirtSpec = Field(default_factory=KubeVirtSpec, description="KubeVirt settings.")
    quotas: tuple[Quota, ...] = Field(default=(), description="GPU quotas per namespace.")

    @model_validator(mode="after")
    def _cross_checks(self) -> ClusterSpec:
        from components.validation import cross_check  # noqa: PLC0415 (validation imports this module)

        problems = cross_check(self)
        if problems:
            raise SpecViolations(problems)
        return self

    def node(self, name: str) -> ProxmoxNode:
        """The Proxmox node called ``name`` (KeyError if absent; validated specs always have it)."""
        for n in self.proxmox.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


def load_spec(data: Any, root: str = "cluster") -> ClusterSpec:
    """Validate ``data`` (parsed YAML or JSON) into a ClusterSpec, or raise SpecError listing every problem."""
    if not isinstance(data, Mapping):
        raise SpecError([Problem("", f"expected a mapping, got {type(data).__name__}")], root)
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(problems_from_validation_error(err), root) from None
