"""The GPU catalog against its sources: pci.ids, NVIDIA's MIG tables, the operator's named MIG configs."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from proxmox_gpu_cluster.core.catalog import CATALOG, model, model_for_device, sandbox_resource_suffix
from tests.support import CHART_VERSIONS, pci_ids, shared_reference


def nvidia_devices() -> dict[str, str]:
    """device id -> name for vendor 10de in the installed pci.ids."""
    devices: dict[str, str] = {}
    in_nvidia = False
    for line in pci_ids().read_text(encoding="utf-8", errors="replace").splitlines():
        if not line or line.startswith("#"):
            continue
        if not line.startswith("\t"):
            in_nvidia = line.startswith("10de ")
        elif in_nvidia and not line.startswith("\t\t"):
            device, name = line.strip().split(None, 1)
            devices[device.lower()] = name.strip()
    return devices


REQUIRED_MODELS = {
    "A100-PCIE-40GB", "A100-PCIE-80GB", "A100-SXM4-40GB", "A100-SXM4-80GB", "A30", "A10",
    "H100-PCIE", "H100-SXM5-80GB", "H200", "L4", "L40S", "T4",
}  # fmt: skip


def test_catalog_has_every_required_model() -> None:
    assert set(CATALOG) >= REQUIRED_MODELS


@pytest.mark.parametrize("key", sorted(CATALOG))
def test_ids_and_names_match_pci_ids(key: str) -> None:
    devices = nvidia_devices()
    m = CATALOG[key]
    known = [d for d in m.device_ids if d in devices]
    if not known:
        pytest.skip(f"{key} ({', '.join(m.vendor_devices)}) is newer than the installed pci.ids")
    # Every id pci.ids knows must be named like the catalog says (the variants share the name).
    for device in known:
        assert devices[device] == m.pci_name, f"{key}: pci.ids names 10de:{device} {devices[device]!r}"


def test_sxm_modules_are_the_models_whose_device_name_says_sxm() -> None:
    # pci.ids names the form factor ("GA100 [A100 SXM4 40GB]", "GH100 [H200 SXM 141GB]"); the flag that refuses
    # them as passthrough GPUs follows it (the installed name where pci.ids knows the id, else the catalog's).
    devices = nvidia_devices()
    for key, m in CATALOG.items():
        name = devices.get(m.device_ids[0], m.pci_name)
        assert m.sxm == ("SXM" in name), f"{key}: {name!r}"
    assert {k for k, m in CATALOG.items() if m.sxm} >= {"A100-SXM4-80GB", "H100-SXM5-80GB"}


def test_pci_ids_covers_most_of_the_catalog() -> None:
    # Guards the skip above: the 2023 pci.ids already knows everything but the newest boards.
    devices = nvidia_devices()
    covered = [k for k, m in CATALOG.items() if m.device_ids[0] in devices]
    assert len(covered) >= len(CATALOG) - 2, covered


def test_seed_vfio_id_is_not_an_a100_pcie_40gb() -> None:
    # The seed guide's `options vfio-pci ids=10de:20f2` is an A100-PG506-217, not an A100 PCIe 40GB.
    assert model_for_device("10de:20f2") is None
    assert nvidia_devices()["20f2"] != CATALOG["A100-PCIE-40GB"].pci_name
    assert model_for_device("10DE:20F1") is CATALOG["A100-PCIE-40GB"]


@pytest.mark.parametrize(
    ("key", "resource"),
    [
        ("A100-PCIE-40GB", "nvidia.com/GA100_A100_PCIE_40GB"),
        ("A10", "nvidia.com/GA102GL_A10"),
        ("T4", "nvidia.com/TU104GL_TESLA_T4"),
        ("A30", "nvidia.com/GA100GL_A30_PCIE"),
    ],
)
def test_sandbox_resource_names(key: str, resource: str) -> None:
    assert CATALOG[key].sandbox_resource_name == resource


@pytest.mark.parametrize("key", sorted(CATALOG))
def test_sandbox_resource_name_is_a_valid_extended_resource(key: str) -> None:
    suffix = CATALOG[key].sandbox_resource_name.split("/", 1)[1]
    assert suffix == sandbox_resource_suffix(CATALOG[key].pci_name)
    assert re.fullmatch(r"[A-Z0-9][A-Z0-9_]*[A-Z0-9]", suffix), suffix


def test_resource_name_rule_drops_punctuation_and_maps_separators() -> None:
    assert sandbox_resource_suffix("GH100 [H100 SXM5/80GB] (rev. a1)") == "GH100_H100_SXM5_80GB_REV__A1"


def test_a100_40gb_profiles_match_the_mig_user_guide() -> None:
    mig = CATALOG["A100-PCIE-40GB"].mig
    assert mig is not None
    table = {p.name: (p.compute_slices, p.memory_slices, p.max_instances, p.starts) for p in mig.profiles}
    assert table["1g.5gb"] == (1, 1, 7, (0, 1, 2, 3, 4, 5, 6))
    assert table["1g.10gb"] == (1, 2, 4, (0, 2, 4, 6))
    assert table["2g.10gb"] == (2, 2, 3, (0, 2, 4))
    assert table["3g.20gb"] == (3, 4, 2, (0, 4))
    assert table["4g.20gb"] == (4, 4, 1, (0,))
    assert table["7g.40gb"] == (7, 8, 1, (0,))
    assert (mig.compute_slices, mig.memory_slices) == (7, 8)


@pytest.mark.parametrize("key", sorted(k for k, m in CATALOG.items() if m.mig))
def test_profile_tables_are_self_consistent(key: str) -> None:
    mig = CATALOG[key].mig
    assert mig is not None
    for p in mig.profiles:
        assert p.name.startswith(f"{p.compute_slices}g.")
        assert all(s + p.memory_slices <= mig.memory_slices for s in p.starts), p
        assert p.max_instances <= len(p.starts)
        # The memory in the name grows with the memory slices it spans.
        assert p.compute_slices <= mig.compute_slices


@pytest.mark.parametrize("key", ["A10", "L4", "L40S", "T4"])
def test_non_mig_models(key: str) -> None:
    assert not CATALOG[key].mig_capable
    assert CATALOG[key].named_mig_configs() == {}


def test_unknown_model_error_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="A100-PCIE-40GB"):
        model("A200")


def _resolve(configs: dict[str, Any], name: str, device_ids: tuple[str, ...]) -> dict[str, int] | None:
    """What mig-parted applies for ``name`` on a GPU with one of ``device_ids`` (None if no entry matches)."""
    wanted = {f"0x{d.upper()}10DE" for d in device_ids}
    for entry in configs[name]:
        filters = entry.get("device-filter")
        if filters is not None:
            filters = {filters} if isinstance(filters, str) else set(filters)
            if not filters & wanted:
                continue
        if not entry["mig-enabled"]:
            return {}
        return dict(entry["mig-devices"])
    return None


@pytest.mark.parametrize("tag", CHART_VERSIONS)
@pytest.mark.parametrize("key", sorted(k for k, m in CATALOG.items() if m.mig))
def test_named_mig_configs_match_the_operator_defaults(tag: str, key: str) -> None:
    document = yaml.safe_load(shared_reference(tag, "default-mig-parted-config.yaml").read_text())
    configs = yaml.safe_load(document["data"]["config.yaml"])["mig-configs"]
    m = CATALOG[key]
    claimed = m.named_mig_configs()
    assert "all-balanced" in claimed and "all-disabled" in claimed
    for name, geometry in claimed.items():
        assert name in configs, f"{key}: {name} is not a built-in config of chart {tag}"
        assert _resolve(configs, name, m.device_ids) == geometry, f"{key}: {name}"
