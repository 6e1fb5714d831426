"""Specs that would work against the user: addresses nothing can reach or that belong to something else,
credentials in URLs (Pulumi state keeps inputs in plain text), multi-line selectors, installer ISOs as boot disks.
Each is one line with the config path: from the plan CLI (exit 2) and as a ``pulumi.RunError`` under ``pulumi up``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from proxmox_gpu_cluster.core.input_safety import MAX_DEPTH
from proxmox_gpu_cluster.stacks.config import InvalidStackConfig, load
from proxmox_gpu_cluster.stacks.plan import main
from proxmox_gpu_cluster.testing import RecordingMocks, run
from tests.support import base_spec, stack_config

KEY = "proxmox-gpu-cluster:cluster"
UNICAST = "use a unicast address other machines reach this one at"


def cli_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: dict[str, Any]) -> list[str]:
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(yaml.safe_dump({"config": {KEY: spec}}))
    assert main(["t", "--config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    return captured.err.splitlines()


def up_lines(spec: Any) -> list[str]:
    """What ``pulumi up`` reports: the program's RunError, before any resource registers."""

    class Counting(RecordingMocks):
        created = 0

        def new_resource(self, args: Any) -> Any:
            Counting.created += 1
            return super().new_resource(args)

    config, keys = stack_config(spec)
    with pytest.raises(InvalidStackConfig) as info:
        run(load, config=config, secret_keys=keys, mocks=Counting())
    assert isinstance(info.value, pulumi.RunError)
    assert Counting.created == 0
    return info.value.lines


def both(tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: dict[str, Any]) -> list[str]:
    lines = cli_lines(tmp_path, capsys, spec)
    assert up_lines(spec) == lines
    return lines


@pytest.mark.parametrize(
    ("address", "kind"),
    [("127.0.0.5", "loopback"), ("224.0.0.5", "multicast"), ("169.254.10.5", "link-local"),
     ("0.0.0.0", "unspecified"), ("240.0.0.5", "reserved")],
)  # fmt: skip
def test_worker_dns_and_gateway_addresses_must_be_unicast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], address: str, kind: str
) -> None:
    spec = base_spec()
    spec["workers"][2]["network"] = {"ipv4": "192.0.2.60/24", "gateway": address, "dns": [address, "::1"]}
    lines = both(tmp_path, capsys, spec)
    at = f"{KEY}.workers[2].network"
    assert f"{at}.dns[0]: {address} is a {kind} address; {UNICAST}" in lines
    assert f"{at}.dns[1]: ::1 is a loopback address; {UNICAST}" in lines
    assert any(line.startswith(f"{at}.gateway: {address} ") for line in lines), lines


@pytest.mark.parametrize(("ipv4", "kind"), [("127.1.2.3/8", "loopback"), ("169.254.7.7/16", "link-local")])
def test_static_worker_address_must_be_unicast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ipv4: str, kind: str
) -> None:
    spec = base_spec()
    spec["workers"][2]["network"] = {"ipv4": ipv4}
    address = ipv4.split("/", maxsplit=1)[0]
    assert both(tmp_path, capsys, spec) == [f"{KEY}.workers[2].network.ipv4: {address} is a {kind} address; {UNICAST}"]


def test_two_proxmox_nodes_with_one_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = base_spec()
    spec["proxmox"]["nodes"][0]["sshAddress"] = "PVE.example.test"
    spec["proxmox"]["nodes"][1]["sshAddress"] = "pve.EXAMPLE.test"
    assert both(tmp_path, capsys, spec) == [
        f"{KEY}.proxmox.nodes[1].sshAddress: pve.EXAMPLE.test is already used by proxmox.nodes[0] (pve1)"
    ]
    spec["proxmox"]["nodes"][0]["sshAddress"] = spec["proxmox"]["nodes"][1]["sshAddress"] = "192.0.2.12"
    assert both(tmp_path, capsys, spec)[0].endswith("sshAddress: 192.0.2.12 is already used by proxmox.nodes[0] (pve1)")


def test_worker_address_equal_to_the_proxmox_api_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = base_spec()
    spec["proxmox"]["endpoint"] = "https://192.0.2.60:8006/"
    assert both(tmp_path, capsys, spec) == [
        f"{KEY}.workers[2].network.ipv4: 192.0.2.60 is already used by the Proxmox API endpoint (proxmox.endpoint)"
    ]


@pytest.mark.parametrize(
    ("field", "url"),
    [
        ("cloudImageUrl", "https://ops:hunter2@images.example.test/noble.img"),
        ("cloudImageUrl", "https://token@images.example.test/noble.img"),
        ("endpoint", "https://root%40pam:hunter2@pve1.example.test:8006/"),
    ],
)
def test_credentials_inside_a_url_are_refused_and_never_echoed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, url: str
) -> None:
    spec = base_spec()
    if field == "endpoint":
        spec["proxmox"]["endpoint"] = url
        at = "proxmox.endpoint"
    else:
        spec["workers"][0]["image"] = {"cloudImageUrl": url}
        at = "workers[0].image.cloudImageUrl"
    lines = both(tmp_path, capsys, spec)
    assert lines == [
        f"{KEY}.{at}: credentials in a URL (user:password@host) would be stored in plain text in the Pulumi state; "
        "use a URL without them"
    ]
    assert "hunter2" not in "".join(lines) and "token@" not in "".join(lines)


@pytest.mark.parametrize("selector", ["app=train\nrole=evil", "app=train\rrole=x", "app=train\u2028x", "a=b\x00"])
def test_newlines_inside_label_selectors(tmp_path: Path, capsys: pytest.CaptureFixture[str], selector: str) -> None:
    spec = base_spec()
    spec["gpuOperator"]["driverUpgrade"] = {"waitForCompletionPodSelector": selector}
    lines = both(tmp_path, capsys, spec)
    assert len(lines) == 1
    assert lines[0].startswith(f"{KEY}.gpuOperator.driverUpgrade.waitForCompletionPodSelector: String should match")


@pytest.mark.parametrize(
    "url",
    ["https://releases.ubuntu.com/24.04/ubuntu-24.04.1-live-server-amd64.iso", "http://mirror.example.test/x.ISO?d=1",
     "https://mirror.example.test/debian-12-netinst.iso.xz"],
)  # fmt: skip
def test_installer_isos_as_cloud_images(tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str) -> None:
    spec = base_spec()
    spec["workers"][1]["image"] = {"cloudImageUrl": url}
    assert both(tmp_path, capsys, spec) == [
        f"{KEY}.workers[1].image.cloudImageUrl: an installer ISO, not a cloud image (the VM would boot the "
        "installer); use a cloud image such as https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"
    ]


def test_upgrade_settings_beyond_every_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = base_spec()
    spec["gpuOperator"]["driverUpgrade"] = {
        "maxParallelUpgrades": 10**30, "maxUnavailable": -3, "waitForCompletionSeconds": -1,
        "gpuPodDeletion": {"timeoutSeconds": 10**12}, "drain": {"timeoutSeconds": -(10**25)},
    }  # fmt: skip
    at = f"{KEY}.gpuOperator.driverUpgrade"
    assert both(tmp_path, capsys, spec) == [
        f"{at}.drain.timeoutSeconds: Input should be greater than or equal to 0",
        f"{at}.gpuPodDeletion.timeoutSeconds: Input should be less than or equal to 86400",
        f"{at}.maxParallelUpgrades: Input should be less than or equal to 10000",
        f"{at}.maxUnavailable: expected a count from 1 to 10000 or a percentage from 1% to 100%, got -3",
        f"{at}.waitForCompletionSeconds: Input should be greater than or equal to 0",
    ]


@pytest.mark.parametrize("value", ["0%", "101%", "-5%", "5 %", True, 0, 10_001])
def test_max_unavailable_count_or_percent(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: object) -> None:
    spec = base_spec()
    spec["gpuOperator"]["driverUpgrade"] = {"maxUnavailable": value}
    lines = both(tmp_path, capsys, spec)
    assert len(lines) == 1 and "expected a count from 1 to 10000 or a percentage from 1% to 100%" in lines[0]


def test_deep_junk_under_pulumi_up_is_one_run_error_line() -> None:
    junk: Any = 1
    for _ in range(MAX_DEPTH * 2):
        junk = [junk]
    spec = base_spec()
    spec["workers"][0]["tags"] = junk
    assert up_lines(spec) == [f"{KEY}: nested more than {MAX_DEPTH} levels deep; refusing to read further"]


def test_control_characters_under_pulumi_up_are_escaped() -> None:
    spec = base_spec()
    spec["guest\x1b[31m"] = {}
    spec["workers"][0]["node"] = "pve\u202e9"
    lines = up_lines(spec)
    assert f"{KEY}.guest\\x1b[31m: unknown key (keys are camelCase; check the spelling)" in lines
    assert all(line.isprintable() for line in lines), lines
