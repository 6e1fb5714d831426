"""The cluster spec: one typed, validated description of the whole GPU cluster.

It is what ``proxmox-gpu-cluster:cluster`` in ``Pulumi.<stack>.yaml`` holds. Keys are camelCase, the only
spelling accepted (snake_case keys are refused as unknown). Secrets are never part of it: they are separate
secret config keys (see ``stacks.config``). Field-level rules live on the fields; rules that relate several
parts of the spec live in ``components.validation`` and run from ``ClusterSpec``'s validator. Load a spec with
``components.errors.load_spec`` to get every problem at once as ``cluster.<path>: message``.

Pure: nothing here imports Pulumi.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, ValidationError, model_validator

from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.errors import Problem, SpecError, SpecViolations
from proxmox_gpu_cluster.core.input_safety import budget_problem, spec_problems
from proxmox_gpu_cluster.core.monitoring_spec import DcgmMetric, MonitoringSpec
from proxmox_gpu_cluster.core.net_checks import check_proxmox_endpoint
from proxmox_gpu_cluster.core.operator_spec import DraSpec, GpuOperatorSpec, SmokeTestSpec
from proxmox_gpu_cluster.core.scheduling_spec import PriorityClassSpec, Quota
from proxmox_gpu_cluster.core.spec_base import (
    DEFAULT_TOOLKIT_VERSION,
    ApiEndpoint,
    GpuModelKey,
    HostName,
    Int,
    MigConfig,
    Name,
    SpecModel,
    StorageId,
    ToolkitVersion,
    VgpuType,
    camel_alias,
    check_pci_path,
    check_vendor_device,
    validate_stack_data,
)
from proxmox_gpu_cluster.core.ssh_keys import check_public_key
from proxmox_gpu_cluster.core.validation import cross_check
from proxmox_gpu_cluster.core.vgpu_manager import VgpuManagerSpec
from proxmox_gpu_cluster.core.worker_spec import GpuAssignment, Image, Network, TimeSlicing, Worker

__all__ = [
    "ClusterSpec", "DcgmMetric", "DraSpec", "GpuAssignment", "GpuOperatorSpec", "GuestSpec", "HostGpu", "Image",
    "KubeVirtNode", "KubeVirtSpec", "KubernetesSpec", "MigConfig", "MonitoringSpec", "Network", "PriorityClassSpec",
    "ProxmoxNode", "ProxmoxSpec", "Quota", "SmokeTestSpec", "TimeSlicing", "VgpuManagerSpec", "Worker", "load_spec",
]  # fmt: skip

MIN_KUBERNETES_MINOR = 30
"""Oldest minor the guest bootstrap installs (pkgs.k8s.io repositories and kubeadm's join configuration)."""


class HostGpu(SpecModel):
    """A physical GPU installed in a Proxmox node."""

    name: Name = Field(description="Name workers use to claim this GPU; unique within its Proxmox node.")
    pci_path: Annotated[str, AfterValidator(check_pci_path)] = Field(
        description="PCI address without the function, domain:bus:device (``0000:41:00``), so every function of "
        "the card passes through together.",
    )
    model: GpuModelKey = Field(description="Catalog key of the GPU model, e.g. ``A100-PCIE-40GB`` or ``A10``.")
    device_id: Annotated[str, AfterValidator(check_vendor_device)] | None = Field(
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
    ssh_address: HostName = Field(description="Host name or IP address SSH reaches the node at.")
    cpu_vendor: Literal["intel", "amd"] = Field(description="CPU vendor (Intel kernels before 6.8 need intel_iommu=on)")
    boot_loader: Literal["grub", "systemd-boot", "auto"] = Field(
        default="auto", description="Where kernel arguments go; auto detects it on the host."
    )
    host_prep: bool = Field(
        default=False,
        description="Opt in to IOMMU/vfio host preparation: kernel arguments, vfio-pci for the GPUs declared here "
        "(bound at runtime where the kernel allows), driver blacklist; reboots only as ``rebootPolicy`` allows.",
    )
    reboot_policy: Literal["when-idle", "always", "never"] = Field(
        default="when-idle",
        description="When host prep may reboot the node (only ever needed to change its kernel command line): "
        "``when-idle`` only if no VM or container runs on it (otherwise the step fails and names them), ``always`` "
        "even with running guests, ``never`` (reports 'reboot: required'; you reboot it).",
    )
    acs_override: bool = Field(
        default=False,
        description="Add pcie_acs_override=downstream,multifunction (splits IOMMU groups; weakens isolation). Needs "
        "hostPrep; IOMMU-group isolation is then checked by host verify after the reboot, not by the preflight.",
    )
    iommu_passthrough: bool = Field(
        default=False,
        description="Add ``iommu=pt`` (optional; a running kernel without it reboots once, as ``rebootPolicy`` "
        "allows). Needs hostPrep, which applies it; host prep never removes one already there.",
    )
    nested_virtualization: bool = Field(
        default=False,
        description="Host verify checks that the kvm module allows nested virtualization; required on a hostPrep "
        "node that hosts KubeVirt worker VMs (they run VMs themselves).",
    )
    snippet_datastore: StorageId = Field(
        default="local", description="Datastore (with the snippets content type) for cloud-init snippets."
    )
    gpus: tuple[HostGpu, ...] = Field(
        default=(),
        max_length=64,
        description="GPUs installed in this node. Every one that is not the console GPU is prepared for passthrough "
        "(vfio-pci, a PCI mapping), whether or not a worker claims it yet, so adding or removing workers never "
        "changes the host.",
    )

    @property
    def passthrough_gpus(self) -> list[tuple[int, HostGpu]]:
        """(index in ``gpus``, GPU) for every GPU of this node that is not the console GPU."""
        return [(i, g) for i, g in enumerate(self.gpus) if not g.console]


class ProxmoxSpec(SpecModel):
    """How to reach the Proxmox VE cluster."""

    endpoint: Annotated[str, AfterValidator(check_proxmox_endpoint)] = Field(
        description="Proxmox API URL, e.g. ``https://pve1:8006/``."
    )
    tls_verify: bool = Field(default=True, description="Verify the API's TLS certificate.")
    auth_mode: Literal["token", "password"] = Field(
        default="token",
        description="token: API token (secret ``proxmoxApiToken``); password: user + password (secret "
        "``proxmoxPassword``), needed for root-only features such as raw hostpci ids and kvm arguments.",
    )
    username: str = Field(
        default="root@pam",
        pattern=r"^[A-Za-z0-9._-]{1,64}@[A-Za-z0-9._-]{1,64}$",
        description="user@realm for password authentication and for SSH-based provider operations.",
    )
    ssh_user: str = Field(
        default="root",
        pattern=r"^[a-z_][a-z0-9_-]{0,31}$",
        description="SSH user on the Proxmox nodes (host preparation, snippet uploads); key in ``sshPrivateKey``, "
        "or the ssh-agent with ``sshAgent``.",
    )
    ssh_agent: bool = Field(
        default=False,
        description="Authenticate every SSH connection (the Proxmox nodes' and the worker VMs' steps, the Proxmox "
        "provider's snippet uploads) with the ssh-agent of the machine that runs ``pulumi up`` (``SSH_AUTH_SOCK``) "
        "instead of the ``sshPrivateKey`` secret, which is then not needed: no step's state holds the key. Without "
        "it the key is an input of every remote step, about 11 copies per worker in the state.",
    )
    nodes: tuple[ProxmoxNode, ...] = Field(
        min_length=1, max_length=256, description="Proxmox nodes this stack manages."
    )


class DrainSpec(SpecModel):
    """How a node is drained (evictions, as ``kubectl drain`` does, so PodDisruptionBudgets are respected)."""

    timeout_seconds: Int = Field(
        default=600,
        ge=30,
        le=86400,
        description="How long the drain may take; then it fails, naming the pods still on the node, and the node "
        "stays cordoned.",
    )
    delete_emptydir_data: bool = Field(
        default=True, description="Evict pods with emptyDir volumes too (their data is lost with the node anyway)."
    )
    force: bool = Field(
        default=False,
        description="Also delete pods no controller manages (they are not recreated anywhere); off: such pods make "
        "the drain fail, naming them.",
    )
    max_unavailable: Int = Field(
        default=1,
        ge=1,
        le=1000,
        description="How many joined GPU nodes a rolling change (a new driver, kernel arguments, vfio binding: "
        "anything that reboots the guest) may take out of service at once, cluster-wide: each takes a slot (a "
        "ConfigMap in ``slotNamespace``), is cordoned and drained, changed, verified and uncordoned before giving it "
        "back.",
    )
    slot_lease_seconds: Int = Field(
        default=3600,
        ge=60,
        le=86400,
        description="How long a slot stays taken when the run that took it dies without giving it back; then "
        "another node may take it over. Must exceed ``timeoutSeconds``.",
    )
    slot_wait_seconds: Int = Field(
        default=21600,
        ge=0,
        le=604800,
        description="How long a node waits for a free slot before its step fails, naming the holders.",
    )
    slot_namespace: Name = Field(
        default="proxmox-gpu-cluster",
        description="The namespace the cluster creates (and owns) for the rollout slots; the nodes' own credentials "
        "may write ConfigMaps there (and nowhere else), so it is the stack's alone: never one every cluster has "
        "(``default``, ``kube-*``) nor one the spec uses for something else (the operator's, KubeVirt's, a quota's). "
        "Two clusters that share a Kubernetes cluster use different ones.",
    )


class KubernetesSpec(SpecModel):
    """The Kubernetes cluster workers join."""

    api_endpoint: ApiEndpoint = Field(description="API server host:port used by kubeadm join.")
    version: str = Field(pattern=r"^1\.[0-9]{2}$", description="Kubernetes minor version, e.g. ``1.34``.")
    join_method: Literal["kubeadm", "none"] = Field(
        default="kubeadm", description="kubeadm joins the VMs; none leaves joining to you."
    )
    drain: DrainSpec = Field(
        default_factory=DrainSpec,
        description="How a worker's node is drained before its VM is replaced or removed, and how many nodes a "
        "rolling change disrupts at once.",
    )

    @model_validator(mode="after")
    def _supported_minor(self) -> KubernetesSpec:
        if self.minor < MIN_KUBERNETES_MINOR:
            raise ValueError(f"version {self.version} is not supported; use 1.{MIN_KUBERNETES_MINOR} or later")
        return self

    @property
    def minor(self) -> int:
        """The minor version number (34 for ``1.34``)."""
        return int(self.version.split(".")[1])


class GuestSpec(SpecModel):
    """Settings shared by every worker VM's guest OS."""

    ssh_public_keys: tuple[Annotated[str, AfterValidator(check_public_key)], ...] = Field(
        min_length=1,
        max_length=64,
        description="Public keys cloud-init installs for each worker's user; the matching private key is the "
        "``sshPrivateKey`` secret the guest bootstrap connects with (or a key in the ssh-agent, ``proxmox.sshAgent``).",
    )
    driver_flavor: Literal["server", "desktop"] = Field(
        default="server",
        description="Ubuntu driver package line in host driver mode: ``server`` (nvidia-headless-<branch>-server, "
        "the data-center builds) or ``desktop`` (nvidia-headless-<branch>).",
    )
    toolkit_version: ToolkitVersion = Field(
        default=DEFAULT_TOOLKIT_VERSION,
        description="NVIDIA Container Toolkit package version (apt version, e.g. ``1.18.2-1``), installed and held "
        "on the workers when the driver is host-installed.",
    )

    default_runtime: bool = Field(
        default=True,
        description="Make nvidia containerd's default runtime (``nvidia-ctk runtime configure --set-as-default``); "
        "otherwise pods need ``runtimeClassName: nvidia``.",
    )


FEATURE_GATE = r"^[A-Z][A-Za-z0-9]*$"


class KubeVirtNode(SpecModel):
    """An existing (e.g. bare-metal) Kubernetes node that runs KubeVirt GPU VMs; not provisioned here.

    NVIDIA documents VM-workload nodes as bare metal; this is how to point the KubeVirt components at them.
    """

    name: Name = Field(description="Kubernetes node name.")
    workload: Literal["vm-passthrough", "vm-vgpu"] = Field(description="Whole GPUs or vGPUs for VMs.")
    gpus: dict[GpuModelKey, Annotated[Int, Field(ge=1, le=64)]] = Field(
        min_length=1, description="GPU model -> how many the node has, e.g. ``{A10: 2}``."
    )
    vgpu_type: VgpuType | None = Field(default=None, description="vGPU type for vm-vgpu, e.g. ``A10-24Q``.")
    taint: bool = Field(default=False, description="Taint the node nvidia.com/gpu=true:NoSchedule.")

    @property
    def model_keys(self) -> list[str]:
        """One catalog key per GPU (``{A10: 2}`` -> ``[A10, A10]``)."""
        return [key for key, count in self.gpus.items() for _ in range(count)]


class KubeVirtSpec(SpecModel):
    """KubeVirt integration for VM workloads (KubeVirt itself is installed separately)."""

    model_config = ConfigDict(alias_generator=camel_alias(patch_kubevirt="patchKubeVirt"))
    enabled: bool = Field(default=False, description="Configure KubeVirt to use the GPUs.")
    name: Name = Field(default="kubevirt", description="Name of the KubeVirt custom resource.")
    namespace: Name = Field(default="kubevirt", description="Namespace of the KubeVirt custom resource.")
    patch_kubevirt: bool = Field(
        default=True,
        description="Patch the KubeVirt CR's permittedHostDevices and feature gates. Turn off where the "
        "HyperConverged Cluster Operator owns the CR (it reverts the patch); put the stack output "
        "``hyperConvergedPermittedHostDevices`` into the HyperConverged CR instead.",
    )
    feature_gates: tuple[Annotated[str, Field(pattern=FEATURE_GATE, max_length=128)], ...] = Field(
        default=(),
        max_length=128,
        description="Feature gates the KubeVirt CR must keep besides ``HostDevices``. The patch owns the whole "
        "list (a list is replaced, not merged), so list every gate the cluster relies on here.",
    )
    vgpu_manager: VgpuManagerSpec | None = Field(
        default=None, description="The private vGPU Manager image; required when a node runs vm-vgpu."
    )
    nodes: tuple[KubeVirtNode, ...] = Field(
        default=(), description="Existing nodes (bare metal) that run KubeVirt GPU VMs besides the workers."
    )


class ClusterSpec(SpecModel):
    """Everything one stack provisions."""

    proxmox: ProxmoxSpec = Field(description="Proxmox VE API and nodes.")
    workers: tuple[Worker, ...] = Field(min_length=1, max_length=10_000, description="GPU worker VMs.")
    kubernetes: KubernetesSpec = Field(description="Target Kubernetes cluster.")
    guest: GuestSpec = Field(description="Guest OS settings of the worker VMs.")
    gpu_operator: GpuOperatorSpec = Field(default_factory=GpuOperatorSpec, description="GPU Operator settings.")
    kubevirt: KubeVirtSpec = Field(default_factory=KubeVirtSpec, description="KubeVirt settings.")
    quotas: tuple[Quota, ...] = Field(default=(), max_length=1000, description="GPU quotas per namespace.")
    priority_classes: tuple[PriorityClassSpec, ...] = Field(
        default=(), max_length=100, description="PriorityClasses for GPU workloads (important work preempts the rest)."
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> ClusterSpec:
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
    too_big = budget_problem(data)  # before pydantic walks it: nested junk or an alias bomb
    if too_big is not None:
        raise SpecError([Problem("", too_big)], root)
    try:
        # Stack files are camelCase only: a snake_case key there is an unknown key, not a synonym.
        return validate_stack_data(ClusterSpec, data)
    except ValidationError as err:
        raise SpecError(spec_problems(err, ClusterSpec), root) from None
