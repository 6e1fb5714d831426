"""GPU catalog: pure data about the NVIDIA data-center GPUs this project can pass through.

Sources (checked by tests, not copied):
- PCI ids and device names: the pci.ids database (Debian package ``pci.ids``); ``tests/components/test_catalog.py``
  compares every id and name with it for the models the installed file knows.
- MIG profiles, instance limits and placements: NVIDIA's MIG User Guide, "Supported MIG Profiles".
  Placements are expressed in memory slices, the unit the guide's "Placements {0,2,4}:2" notation uses.
- Named MIG configurations: the GPU Operator's ``default-mig-parted-config``; a test resolves every name the
  catalog claims against ``../shared/reference/gpu-operator/<tag>/default-mig-parted-config.yaml``.
- Product strings: the ``nvidia.com/gpu.product`` label GPU Feature Discovery derives from the NVML device name.
- Minimum driver branches: the first NVIDIA Data Center GPU Driver branch whose release notes (or, for H100, the
  NVIDIA AI Enterprise 2.3 notes: "Support for the NVIDIA H100 GPU" with driver 520.61.05) list the model: R410 for
  Turing (T4), R450 for A100 40GB and the SXM4 80GB, R460 for A10 and A30, R470 for the A100 PCIe 80GB (launched
  June 2021; listed with the R470 vGPU 13 stack), R520 for H100, R525 for L4, R535 for L40S, R550 for H200.
- Row remapping: NVIDIA's "GPU Memory Error Management", Supported GPUs (Ampere, Ada and Hopper remap rows; the
  Turing T4 retires pages).

Nothing here imports Pulumi.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

NVIDIA_VENDOR_ID = "10de"


@dataclass(frozen=True)
class MigProfile:
    """One MIG GPU-instance profile of a GPU model."""

    name: str
    """Profile name as NVIDIA spells it, e.g. ``1g.5gb`` or ``1g.5gb+me``."""
    compute_slices: int
    """Compute slices the instance takes (the ``Ng`` part)."""
    memory_slices: int
    """Memory slices the instance spans: its placement size."""
    max_instances: int
    """How many instances of this profile fit on one GPU."""
    starts: tuple[int, ...]
    """Memory-slice positions at which an instance of this profile may start."""

    @property
    def media_extension(self) -> bool:
        """Whether the profile carries the GPU's only set of media engines (``+me``)."""
        return self.name.endswith("+me")

    @property
    def resource_suffix(self) -> str:
        """Profile as it appears in an extended-resource name.

        '+' is not allowed in a Kubernetes qualified name, so ``1g.5gb+me`` is advertised as ``1g.5gb.me``,
        the same spelling the operator's named configs use (``all-1g.5gb.me``).
        """
        return self.suffix_of(self.name)

    @staticmethod
    def suffix_of(name: str) -> str:
        """``resource_suffix`` for a profile name."""
        return name.replace("+", ".")


@dataclass(frozen=True)
class MigGeometry:
    """The slice grid of a MIG-capable GPU and the profiles that can be placed on it."""

    compute_slices: int
    memory_slices: int
    profiles: tuple[MigProfile, ...]
    balanced: Mapping[str, int]
    """The model's entry in the operator's ``all-balanced`` configuration."""

    def profile(self, name: str) -> MigProfile | None:
        """The profile called ``name``, or None."""
        return next((p for p in self.profiles if p.name == name), None)

    @property
    def profile_names(self) -> tuple[str, ...]:
        """All profile names, in catalog order (smallest first)."""
        return tuple(p.name for p in self.profiles)


@dataclass(frozen=True)
class GpuModel:
    """A GPU model as the rest of the project sees it."""

    key: str
    """Catalog key used in stack files, e.g. ``A100-PCIE-40GB``."""
    device_ids: tuple[str, ...]
    """PCI device ids (vendor 10de) of this model, canonical first."""
    pci_name: str
    """The device name pci.ids gives the canonical id; the sandbox device plugin derives its resource name
    from it."""
    product: str
    """``nvidia.com/gpu.product`` as GPU Feature Discovery labels it."""
    memory_mib: int
    """Framebuffer size in MiB (nominal)."""
    large_bar: bool
    """Whether the BAR1 aperture is large enough to need a wider 64-bit MMIO window in OVMF."""
    min_driver_branch: int
    """The oldest NVIDIA driver branch that supports the model (see the module docstring for the sources)."""
    row_remapping: bool
    """Whether the GPU remaps memory rows on ECC errors (NVIDIA "GPU Memory Error Management", Supported GPUs:
    GA100, GA10x, AD10x, GH100 and newer; older GPUs retire pages instead)."""
    mig: MigGeometry | None = None
    """MIG geometry; None for GPUs without MIG."""
    vgpu_board: str | None = None
    """Board prefix of this model's NVIDIA vGPU types (``A10`` in ``A10-24Q``); None if we carry no vGPU data."""
    sxm: bool = False
    """An SXM module (HGX/DGX boards: NVLink through NVSwitches or a direct mesh) rather than a PCIe card."""
    extra_function_ids: tuple[str, ...] = field(default=())
    """Device ids of other PCI functions on the same card that must go to vfio-pci too (e.g. an audio
    function); empty for the compute GPUs here, which expose a single function."""

    @property
    def vendor_device(self) -> str:
        """Canonical ``vendor:device`` id, lower case (``10de:20f1``)."""
        return f"{NVIDIA_VENDOR_ID}:{self.device_ids[0]}"

    @property
    def vendor_devices(self) -> tuple[str, ...]:
        """Every ``vendor:device`` id this model may show up as."""
        return tuple(f"{NVIDIA_VENDOR_ID}:{d}" for d in self.device_ids)

    @property
    def mig_capable(self) -> bool:
        """Whether the GPU supports MIG at all."""
        return self.mig is not None

    @property
    def sandbox_resource_name(self) -> str:
        """Extended resource the sandbox (KubeVirt) device plugin advertises for this model."""
        return f"nvidia.com/{sandbox_resource_suffix(self.pci_name)}"

    @property
    def pci_vendor_selector(self) -> str:
        """KubeVirt ``pciVendorSelector`` for the canonical id (upper case, as KubeVirt documents it)."""
        return self.vendor_device.upper()

    def named_mig_configs(self) -> dict[str, dict[str, int]]:
        """The operator's built-in MIG configurations that apply to this model, by name.

        ``all-disabled`` maps to an empty geometry (MIG off). ``all-<profile>`` fills the GPU with as many
        instances of that profile as fit; ``all-balanced`` is the model's mixed default.
        """
        if self.mig is None:
            return {}
        configs: dict[str, dict[str, int]] = {"all-disabled": {}}
        for p in self.mig.profiles:
            configs[f"all-{p.resource_suffix}"] = {p.name: p.max_instances}
        configs["all-balanced"] = dict(self.mig.balanced)
        return configs


_TO_UNDERSCORE = re.compile(r"[/. ]")
_DROP = re.compile(r"[^A-Z0-9_]")


def sandbox_resource_suffix(pci_name: str) -> str:
    """Derive the sandbox device plugin's resource name from a pci.ids device name.

    The plugin upper-cases the name, turns '/', '.' and spaces into '_' and drops any other punctuation:
    ``GA100 [A100 PCIe 40GB]`` -> ``GA100_A100_PCIE_40GB``.
    """
    return _DROP.sub("", _TO_UNDERSCORE.sub("_", pci_name.upper()))


def _profiles(spec: str) -> tuple[MigProfile, ...]:
    """Parse a compact profile table: ``name compute memory max starts`` per line, starts comma-separated."""
    out: list[MigProfile] = []
    for line in spec.strip().splitlines():
        name, compute, memory, max_instances, starts = line.split()
        out.append(
            MigProfile(
                name=name,
                compute_slices=int(compute),
                memory_slices=int(memory),
                max_instances=int(max_instances),
                starts=tuple(int(s) for s in starts.split(",")),
            )
        )
    return tuple(out)


def _seven_slice(mem: tuple[str, str, str, str, str, str], balanced: tuple[str, str, str]) -> MigGeometry:
    """The 7-compute / 8-memory-slice grid shared by A100, H100 and H200.

    ``mem`` names the memory part of the 1g, 1g (double), 2g, 3g, 4g and 7g profiles; ``balanced`` the
    profiles of the operator's all-balanced entry (2 x 1g, 1 x 2g, 1 x 3g).
    """
    one, one_double, two, three, four, seven = mem
    table = f"""
        1g.{one} 1 1 7 0,1,2,3,4,5,6
        1g.{one}+me 1 1 1 0,1,2,3,4,5,6
        1g.{one_double} 1 2 4 0,2,4,6
        2g.{two} 2 2 3 0,2,4
        3g.{three} 3 4 2 0,4
        4g.{four} 4 4 1 0
        7g.{seven} 7 8 1 0
    """
    b1, b2, b3 = balanced
    return MigGeometry(
        compute_slices=7,
        memory_slices=8,
        profiles=_profiles(table),
        balanced=MappingProxyType({b1: 2, b2: 1, b3: 1}),
    )


_A100_40 = _seven_slice(("5gb", "10gb", "10gb", "20gb", "20gb", "40gb"), ("1g.5gb", "2g.10gb", "3g.20gb"))
_GH100_80 = _seven_slice(("10gb", "20gb", "20gb", "40gb", "40gb", "80gb"), ("1g.10gb", "2g.20gb", "3g.40gb"))
_H200_141 = _seven_slice(("18gb", "35gb", "35gb", "71gb", "71gb", "141gb"), ("1g.18gb", "2g.35gb", "3g.71gb"))
_A30 = MigGeometry(
    compute_slices=4,
    memory_slices=4,
    profiles=_profiles(
        """
        1g.6gb 1 1 4 0,1,2,3
        1g.6gb+me 1 1 1 0,1,2,3
        2g.12gb 2 2 2 0,2
        2g.12gb+me 2 2 1 0,2
        4g.24gb 4 4 1 0
        """
    ),
    balanced=MappingProxyType({"1g.6gb": 2, "2g.12gb": 1}),
)

_MODELS: tuple[GpuModel, ...] = (
    GpuModel(
        key="A100-PCIE-40GB",
        device_ids=("20f1", "20b1"),
        pci_name="GA100 [A100 PCIe 40GB]",
        product="NVIDIA-A100-PCIE-40GB",
        memory_mib=40960,
        large_bar=True,
        row_remapping=True,
        min_driver_branch=450,
        mig=_A100_40,
        vgpu_board="A100",
    ),
    GpuModel(
        key="A100-PCIE-80GB",
        device_ids=("20b5",),
        pci_name="GA100 [A100 PCIe 80GB]",
        product="NVIDIA-A100-80GB-PCIe",
        memory_mib=81920,
        large_bar=True,
        row_remapping=True,
        min_driver_branch=470,
        mig=_GH100_80,
        vgpu_board="A100D",
    ),
    GpuModel(
        key="A100-SXM4-40GB",
        device_ids=("20b0",),
        pci_name="GA100 [A100 SXM4 40GB]",
        product="NVIDIA-A100-SXM4-40GB",
        memory_mib=40960,
        sxm=True,
        large_bar=True,
        row_remapping=True,
        min_driver_branch=450,
        mig=_A100_40,
        vgpu_board="A100X",
    ),
    GpuModel(
        key="A100-SXM4-80GB",
        device_ids=("20b2",),
        pci_name="GA100 [A100 SXM4 80GB]",
        product="NVIDIA-A100-SXM4-80GB",
        memory_mib=81920,
        sxm=True,
        large_bar=True,
        row_remapping=True,
        min_driver_branch=450,
        mig=_GH100_80,
        vgpu_board="A100DX",
    ),
    GpuModel(
        key="A30",
        device_ids=("20b7",),
        pci_name="GA100GL [A30 PCIe]",
        product="NVIDIA-A30",
        memory_mib=24576,
        large_bar=True,
        row_remapping=True,
        min_driver_branch=460,
        mig=_A30,
        vgpu_board="A30",
    ),
    GpuModel(
        key="A10",
        device_ids=("2236",),
        pci_name="GA102GL [A10]",
        product="NVIDIA-A10",
        memory_mib=24576,
        large_bar=False,
        row_remapping=True,
        min_driver_branch=460,
        vgpu_board="A10",
    ),
    GpuModel(
        key="H100-PCIE",
        device_ids=("2331",),
        pci_name="GH100 [H100 PCIe]",
        product="NVIDIA-H100-PCIe",
        memory_mib=81920,
        large_bar=True,
        row_remapping=True,
        min_driver_branch=520,
        mig=_GH100_80,
        vgpu_board="H100",
    ),
    GpuModel(
        key="H100-SXM5-80GB",
        device_ids=("2330",),
        pci_name="GH100[H100 SXM5 80GB]",
        product="NVIDIA-H100-80GB-HBM3",
        memory_mib=81920,
        sxm=True,
        large_bar=True,
        row_remapping=True,
        min_driver_branch=520,
        mig=_GH100_80,
        vgpu_board="H100XM",
    ),
    GpuModel(
        key="H200",
        device_ids=("2335",),
        pci_name="GH100 [H200 SXM 141GB]",
        product="NVIDIA-H200",
        memory_mib=144384,
        sxm=True,
        large_bar=True,
        row_remapping=True,
        min_driver_branch=550,
        mig=_H200_141,
        vgpu_board="H200X",
    ),
    GpuModel(
        key="L4",
        device_ids=("27b8",),
        pci_name="AD104GL [L4]",
        product="NVIDIA-L4",
        memory_mib=24576,
        large_bar=False,
        row_remapping=True,
        min_driver_branch=525,
        vgpu_board="L4",
    ),
    GpuModel(
        key="L40S",
        device_ids=("26b9",),
        pci_name="AD102GL [L40S]",
        product="NVIDIA-L40S",
        memory_mib=49152,
        large_bar=True,
        row_remapping=True,
        min_driver_branch=535,
        vgpu_board="L40S",
    ),
    GpuModel(
        key="T4",
        device_ids=("1eb8",),
        pci_name="TU104GL [Tesla T4]",
        product="Tesla-T4",
        memory_mib=16384,
        large_bar=False,
        row_remapping=False,
        min_driver_branch=410,
        vgpu_board="T4",
    ),
)

CATALOG: Mapping[str, GpuModel] = MappingProxyType({m.key: m for m in _MODELS})
"""Every known model by catalog key."""


def model(key: str) -> GpuModel:
    """The catalog entry for ``key``; KeyError names the known keys."""
    try:
        return CATALOG[key]
    except KeyError:
        raise KeyError(f"unknown GPU model {key!r}; known: {', '.join(CATALOG)}") from None


def model_for_device(vendor_device: str) -> GpuModel | None:
    """The model a ``vendor:device`` id belongs to, or None."""
    wanted = vendor_device.lower()
    return next((m for m in _MODELS if wanted in m.vendor_devices), None)
