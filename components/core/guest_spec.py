"""What the guest bootstrap does on one host, as a typed model. Pure.

``GuestBootstrapSpec`` is the whole input of ``components.guest_bootstrap.GuestBootstrap``. The stack derives one
per worker VM from the cluster spec (``bootstrap_spec``); a program that bootstraps any other SSH-reachable
Ubuntu 22.04/24.04 GPU host builds one directly.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import Field, model_validator

from proxmox_gpu_cluster.core.cluster_nodes import worker_node
from proxmox_gpu_cluster.core.inventory import worker_gpus
from proxmox_gpu_cluster.core.mig import mig_modes
from proxmox_gpu_cluster.core.spec import MIN_KUBERNETES_MINOR, ClusterSpec, Worker
from proxmox_gpu_cluster.core.spec_base import (
    DEFAULT_TOOLKIT_VERSION,
    VENDOR_DEVICE,
    ApiEndpoint,
    DriverBranch,
    DriverVersion,
    Name,
    SpecModel,
    ToolkitVersion,
    on_branch,
)
from proxmox_gpu_cluster.core.vgpu import MDEV_KERNEL_BELOW

VIOMMU_KERNEL_ARGS = ("intel_iommu=on", "iommu=pt")
"""What turns on the Intel vIOMMU a KubeVirt worker VM gets (``components.worker_vm.machine_type``); pt keeps
the guest's own devices off the IOMMU's translation path."""
OPEN_MODULES_DEFAULT_BRANCH = 560
"""From R560 the NVIDIA driver installs the open kernel modules by default on the GPUs that support them (Turing
and newer, i.e. every model in the catalog); older branches default to the proprietary ones. NVIDIA, "NVIDIA
Transitions Fully Towards Open-Source GPU Kernel Modules" (2024)."""


class ExpectedGpu(SpecModel):
    """A GPU the host must show: on the PCI bus, and (with a host driver) in ``nvidia-smi -L``."""

    vendor_device: str = Field(
        pattern=VENDOR_DEVICE,
        description="PCI vendor:device id, e.g. ``10de:2236`` (an A10): a catalog model's is "
        "``CATALOG[<model>].vendor_device`` (``proxmox_gpu_cluster.core.catalog``), any card's is the ``[10de:xxxx]`` "
        "that ``lspci -nn`` prints for it on the host.",
    )
    product: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="NVML device name with spaces as dashes (the ``nvidia.com/gpu.product`` spelling), e.g. "
        "``NVIDIA-A10``.",
    )


class RolloutSpec(SpecModel):
    """How a joined node is taken out of service for a disruptive change (guest_rollout.sh)."""

    max_unavailable: int = Field(default=1, ge=1, le=1000, description="Nodes disrupted at once, cluster-wide.")
    lease_seconds: int = Field(default=3600, ge=60, le=86400, description="A dead run's slot expires after this.")
    wait_seconds: int = Field(default=21600, ge=0, le=604800, description="Longest wait for a free slot.")
    drain_timeout_seconds: int = Field(default=600, ge=30, le=86400, description="Longest drain.")
    delete_emptydir_data: bool = Field(default=True, description="Evict pods with emptyDir volumes too.")
    force: bool = Field(default=False, description="Also delete pods no controller manages.")
    namespace: Name = Field(default="proxmox-gpu-cluster", description="Namespace of the slots (ConfigMaps).")


KERNEL_PARAMETER = r"^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)*(=[A-Za-z0-9_.,:-]+)?$"
"""One kernel parameter, ``name`` or ``name=value``, a module's as ``module.name`` (Linux
Documentation/admin-guide/kernel-parameters.rst, "The kernel parses parameters from the kernel command line up to
``--``"; an unknown one without a dot is handed to init). A name starts with a letter or digit (``8250.nr_uarts``):
``--`` would end the kernel's parameters and ``--help`` or ``-s`` would reach init as its own options."""


class GuestBootstrapSpec(SpecModel):
    """Everything the bootstrap scripts need for one host."""

    node_name: Name = Field(description="Kubernetes node name the host joins as.")
    gpus: tuple[ExpectedGpu, ...] = Field(min_length=1, description="GPUs the host must have, in any order.")
    driver_mode: Literal["host", "operator", "vfio"] = Field(
        description="host: install the NVIDIA driver from Ubuntu's archive; operator: something else owns the GPU "
        "(the GPU Operator's driver container, or its vGPU Manager on a vm-vgpu node), so only make sure nouveau "
        "is blacklisted; vfio: bind the GPUs to vfio-pci at boot for KubeVirt passthrough (vm-passthrough), no "
        "NVIDIA driver."
    )
    kernel_args: tuple[Annotated[str, Field(pattern=KERNEL_PARAMETER, max_length=256)], ...] = Field(
        default=(),
        description="Kernel arguments the host must boot with, e.g. ``intel_iommu=on iommu=pt`` for the IOMMU a "
        "KubeVirt node hands GPUs through (written to a GRUB drop-in; a reboot when the running kernel lacks one).",
    )
    kvm: bool = Field(
        default=False,
        description="The host must offer /dev/kvm: a KubeVirt node runs VMs (a VM worker needs nested virtualization).",
    )
    kernel_below: Annotated[str, Field(pattern=r"^[0-9]+\.[0-9]+$")] | None = Field(
        default=None,
        description="The running kernel must be older than this (``6.0`` on a vm-vgpu node: NVIDIA supports the GPU "
        "Operator's mdev-based KubeVirt vGPU path below kernel 6.0 only; the verify step checks ``uname -r``).",
    )
    driver_branch: DriverBranch = Field(description="Driver branch, e.g. ``580``.")
    driver_version: DriverVersion | None = Field(default=None, description="Exact driver version, e.g. ``580.95.05``.")
    driver_flavor: Literal["server", "desktop"] = Field(default="server", description="Ubuntu driver package line.")
    kernel_modules: Literal["open", "proprietary"] = Field(description="Which NVIDIA kernel modules to install.")
    purge_driver_on_destroy: bool = Field(
        default=False,
        description="Purge the driver packages when the bootstrap is destroyed (for hosts that outlive it; a worker "
        "VM's driver goes with the VM).",
    )
    toolkit: bool = Field(description="Install and configure the NVIDIA Container Toolkit on the host.")
    toolkit_version: ToolkitVersion = Field(default=DEFAULT_TOOLKIT_VERSION, description="Toolkit apt package version.")
    default_runtime: bool = Field(default=True, description="Make nvidia containerd's default runtime.")
    cdi: bool = Field(default=False, description="Generate a CDI spec for the host's GPUs (host toolkit only).")
    join_method: Literal["kubeadm", "none"] = Field(default="kubeadm", description="How the host joins Kubernetes.")
    api_endpoint: ApiEndpoint = Field(description="API server host:port.")
    rollout: RolloutSpec | None = Field(
        default=None,
        description="Roll disruptive changes of a joined node through slots (as the node itself, with the "
        "cluster's node-steps RBAC); None: change it in place.",
    )
    kubernetes_minor: int = Field(ge=MIN_KUBERNETES_MINOR, le=99, description="Kubernetes minor version (34).")
    cpus: int | None = Field(
        default=None, ge=1, le=512, description="vCPUs the verify step expects (a worker VM's cores); None: unchecked."
    )
    memory_mib: int | None = Field(
        default=None, ge=1, description="RAM the verify step expects, in MiB (a worker VM's); None: unchecked."
    )
    mig_modes: tuple[Annotated[str, Field(pattern=r"^[0-9]{1,2}=[01]$")], ...] = Field(
        default=(),
        description="MIG mode per MIG-capable GPU, ``INDEX=1|0``: the driver step sets it before the node joins (host "
        "driver mode), and the MIG rollout inside its slot (restarting the VM from Proxmox when it stays pending).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> GuestBootstrapSpec:
        if not on_branch(self.driver_version, self.driver_branch):
            raise ValueError(f"driverVersion {self.driver_version} is not on branch {self.driver_branch}")
        if self.toolkit and self.driver_mode != "host":
            raise ValueError("the host toolkit needs the host driver (driverMode host)")
        if self.cdi and not self.toolkit:
            raise ValueError("cdi generation needs the host toolkit")
        if self.mig_modes and self.driver_mode == "vfio":
            raise ValueError("migModes need an NVIDIA driver in the guest (driverMode host or operator)")
        return self


def kernel_modules(kind: Literal["auto", "open", "proprietary"], branch: str) -> Literal["open", "proprietary"]:
    """Resolve ``kernelModuleType`` like the driver installer does: ``auto`` is open from R560 on."""
    if kind != "auto":
        return kind
    return "open" if int(branch) >= OPEN_MODULES_DEFAULT_BRANCH else "proprietary"


def bootstrap_spec(spec: ClusterSpec, worker: Worker) -> GuestBootstrapSpec:
    """The bootstrap of ``worker`` (whose Kubernetes node name is its VM name).

    The driver and toolkit are host-installed only for container workers in host driver mode. KubeVirt workers
    hand their GPUs to VMs: vm-passthrough workers bind them to vfio-pci, vm-vgpu workers leave them to the
    operator's vGPU Manager; both boot with the vIOMMU on and need /dev/kvm.
    """
    op = spec.gpu_operator
    guest = spec.guest
    drain = spec.kubernetes.drain
    host_driver = op.driver_mode == "host" and worker.workload == "container"
    kubevirt = worker.workload != "container"
    mode: Literal["host", "operator", "vfio"] = "host" if host_driver else "operator"
    if worker.workload == "vm-passthrough":
        mode = "vfio"
    return GuestBootstrapSpec(
        node_name=worker.name,
        gpus=tuple(
            ExpectedGpu(vendor_device=g.host.vendor_device, product=g.model.product) for g in worker_gpus(spec, worker)
        ),
        driver_mode=mode,
        kernel_args=VIOMMU_KERNEL_ARGS if kubevirt else (),
        kvm=kubevirt,
        kernel_below=MDEV_KERNEL_BELOW if worker.workload == "vm-vgpu" else None,
        driver_branch=op.driver_branch,
        driver_version=op.driver_version,
        driver_flavor=guest.driver_flavor,
        kernel_modules=kernel_modules(op.kernel_module_type, op.driver_branch),
        toolkit=host_driver,
        toolkit_version=guest.toolkit_version,
        default_runtime=guest.default_runtime,
        cdi=host_driver and op.cdi_enabled,
        join_method=spec.kubernetes.join_method,
        api_endpoint=spec.kubernetes.api_endpoint,
        kubernetes_minor=spec.kubernetes.minor,
        rollout=RolloutSpec(
            max_unavailable=drain.max_unavailable,
            lease_seconds=drain.slot_lease_seconds,
            wait_seconds=drain.slot_wait_seconds,
            drain_timeout_seconds=drain.timeout_seconds,
            delete_emptydir_data=drain.delete_emptydir_data,
            force=drain.force,
            namespace=drain.slot_namespace,
        )
        if spec.kubernetes.join_method == "kubeadm"
        else None,
        # Where mig-manager runs (the operator labels every MIG-capable node), the mode it will want.
        mig_modes=mig_modes(worker_node(spec, worker)) if op.enabled else (),
        cpus=worker.cores,
        memory_mib=worker.memory_mib,
    )


def hardware_key(worker: Worker) -> str:
    """A key of what the worker's VM runs on that Proxmox applies only at a VM start (cores, memory, GPUs, the
    machine type its workload picks, the network device): the VM-restart step runs again when it changes."""
    wanted = {
        "cores": worker.cores,
        "memoryMiB": worker.memory_mib,
        "gpus": [g.ref for g in worker.gpus],
        "workload": worker.workload,
        "network": [worker.network.bridge, worker.network.vlan],
    }
    return hashlib.sha256(json.dumps(wanted, sort_keys=True, default=str).encode()).hexdigest()[:16]
