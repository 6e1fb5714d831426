"""The offline plan's own inputs: a stack file or --pci file it cannot use ends with one clear line and exit 2,
never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxmox_gpu_cluster.stacks.plan import main
from tests.support import ROOT

DEV = (ROOT / "Pulumi.dev.yaml").read_text()


def _with_binary_key() -> dict[str, object]:
    document = yaml.safe_load(DEV)
    document["config"]["proxmox-gpu-cluster:cluster"]["guest"]["sshPublicKeys"].append(b"hello")
    return dict(document)


def run_plan(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    stack = tmp_path / "Pulumi.x.yaml"
    stack.write_text(text)
    code = main(["--placeholder-secrets", "x", "--config", str(stack), *extra])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("config: [a, b]\n", "config: expected a mapping of config keys, got a list"),
        ("config: hello\n", "config: expected a mapping of config keys, got a str"),
        ("- just\n- a list\n", "expected a YAML mapping with a 'config' key"),
        (DEV + "  proxmox-gpu-cluster:released: 2026-11-22\n",
         "config.proxmox-gpu-cluster:released: a YAML date (2026-11-22); quote it if you mean the text"),
        (DEV + "  proxmox-gpu-cluster:blob: !!binary aGVsbG8=\n",
         "config.proxmox-gpu-cluster:blob: YAML binary data"),
        (DEV + "  proxmox-gpu-cluster:nested: {when: 2026-11-22T10:00:00}\n",
         "config.proxmox-gpu-cluster:nested.when: a YAML date"),
        (DEV + "  proxmox-gpu-cluster:odd: {1: x}\n", "config.proxmox-gpu-cluster:odd: key 1 is a int"),
        (yaml.safe_dump(_with_binary_key()), "config.proxmox-gpu-cluster:cluster.guest.sshPublicKeys[1]: YAML binary"),
        ("config: {proxmox-gpu-cluster:cluster: [1, 2]}\n", "proxmox-gpu-cluster:cluster: expected a mapping, got list"),
        ("config: {a: [\n", "while parsing a flow node"),
    ],
)  # fmt: skip
def test_unusable_stack_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    code, err = run_plan(tmp_path, text, capsys)
    assert code == 2, err
    assert message in err and "Traceback" not in err


def pvesh(**fields: object) -> dict[str, object]:
    device = {"id": "0000:41:00.0", "vendor": "0x10de", "device": "0x2236", "class": "0x030200", "iommugroup": 41}
    device.update(fields)
    return {k: v for k, v in device.items() if v is not None}


@pytest.mark.parametrize(
    ("device", "message"),
    [
        (pvesh(iommugroup=None), "device '0000:41:00.0': iommugroup is missing, expected an integer"),
        (pvesh(iommugroup="41"), "iommugroup is a str ('41'), expected an integer"),
        (pvesh(iommugroup=True), "iommugroup is a bool (True), expected an integer"),
        (pvesh(iommugroup=4.5), "iommugroup is a float (4.5), expected an integer"),
        (pvesh(vendor=None), "vendor is missing, expected a hex string"),
        (pvesh(device=4660), "device is a int (4660), expected a hex string"),
    ],
)
def test_unusable_pci_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], device: dict[str, object], message: str
) -> None:
    pci = tmp_path / "pve1.json"
    pci.write_text(json.dumps([device]))
    code, err = run_plan(tmp_path, DEV, capsys, "--pci", f"pve1={pci}")
    assert code == 2 and err.startswith(f"--pci pve1={pci}: ") and message in err, err


def test_a_good_pci_file_still_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pci = tmp_path / "pve1.json"
    devices = [pvesh(), pvesh(id="0000:81:00.0", device="0x20f1", iommugroup=77)]
    pci.write_text(json.dumps(devices))
    code, err = run_plan(tmp_path, DEV, capsys, "--pci", f"pve1={pci}")
    assert code == 0, err


YAML_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.text(max_size=10), st.dates(), st.binary(max_size=4),
    st.floats(allow_nan=False), st.lists(st.integers(), max_size=2),
)  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(["workers", "proxmox", "kubernetes", "guest", "gpuOperator", "quotas"]), value=YAML_LEAVES)
def test_any_yaml_in_the_spec_ends_in_exit_0_or_2(
    tmp_path_factory: pytest.TempPathFactory, key: str, value: object
) -> None:
    document = yaml.safe_load(DEV)
    document["config"]["proxmox-gpu-cluster:cluster"][key] = value
    stack = tmp_path_factory.mktemp("plan") / "Pulumi.x.yaml"
    stack.write_text(yaml.safe_dump(document))
    assert main(["--placeholder-secrets", "x", "--config", str(stack)]) in (0, 2)
