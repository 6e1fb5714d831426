"""Host script command lines and output parsing (pure)."""

from __future__ import annotations

import shlex

import pytest

from proxmox_gpu_cluster.core.names import StackScope
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.render.agent_bundle import LAUNCHER, step_command
from proxmox_gpu_cluster.render.host_scripts import (
    kernel_args,
    parse_groups,
    prep_args,
    release_args,
    retire_args,
    verify_args,
)
from tests.support import base_spec


def test_step_commands_quote_and_use_sudo_for_non_root() -> None:
    args = ["--gpu", "0000:41:00=10de:2236", "it's"]
    assert step_command("root", "host-prep", args).endswith("/step.sh --gpu 0000:41:00=10de:2236 'it'\"'\"'s'")
    assert step_command("admin", "host-prep", args).startswith("sudo -n bash -c ")
    words = shlex.split(step_command("root", "host-prep", args))
    assert words[:3] == ["bash", "-c", LAUNCHER] and words[3].startswith(".proxmox-gpu-cluster/agent/host-prep-")
    assert words[4:] == args


def test_args_follow_the_node_only() -> None:
    raw = base_spec()
    raw["proxmox"]["nodes"][0].update(acsOverride=True, hostPrep=True, rebootPolicy="never")
    node = load_spec(raw).node("pve1")
    # No IOMMU words: amd_iommu=on is no value, and whether an Intel node needs intel_iommu=on is the running
    # kernel's to say (host_prep.sh decides on the node).
    assert kernel_args(node) == ["pcie_acs_override=downstream,multifunction"]
    # Every declared GPU but the console T4, claimed or not (a10-0 on pve1 has no worker).
    gpus = ["--gpu", "0000:41:00=10de:20f1", "--gpu", "0000:42:00=10de:20f1", "--gpu", "0000:81:00=10de:2236"]
    assert prep_args(node, owner="prod-1a2b3c4d") == [
        "--owner", "prod-1a2b3c4d", "--cpu-vendor", "amd", "--boot-loader", "auto", "--acs-override", "1", "--reboot-policy", "never", *gpus,
    ]  # fmt: skip
    assert verify_args(node) == [
        "--kernel-arg", "pcie_acs_override=downstream,multifunction",
        "--gpu", "0000:41:00", "--gpu", "0000:42:00", "--gpu", "0000:81:00",
    ]  # fmt: skip
    assert "--nested" not in verify_args(node)
    raw["proxmox"]["nodes"][0]["nestedVirtualization"] = True
    assert verify_args(load_spec(raw).node("pve1"))[-2:] == ["--nested", "1"]


def test_iommu_passthrough_is_a_spec_choice() -> None:
    raw = base_spec()
    raw["proxmox"]["nodes"][0].update(hostPrep=True, iommuPassthrough=True)
    node = load_spec(raw).node("pve1")
    assert kernel_args(node) == ["iommu=pt"]
    assert prep_args(node, owner="dev-1a2b3c4d")[8:12] == ["--reboot-policy", "when-idle", "--iommu-pt", "1"]
    assert verify_args(node)[:2] == ["--kernel-arg", "iommu=pt"]
    raw["proxmox"]["nodes"][0]["iommuPassthrough"] = False
    assert "--iommu-pt" not in prep_args(load_spec(raw).node("pve1"), owner="dev-1a2b3c4d")


def test_host_prep_owner_is_a_scope_token() -> None:
    node = load_spec(base_spec()).node("pve1")
    for scope in (StackScope("proj", "prod"), StackScope("proj", "prod", "team-a"), StackScope("p", "Ünïcode!")):
        assert prep_args(node, owner=scope.token)[:2] == ["--owner", scope.token]
        assert release_args(scope.token) == ["--owner", scope.token, "--release"]
    for bad in ("", "Prod", "-x", "a b", "x" * 64, "$(id)"):
        with pytest.raises(ValueError, match="host prep owner: expected a scope token"):
            prep_args(node, owner=bad)
        with pytest.raises(ValueError, match="host prep owner"):
            release_args(bad)


def test_retire_args() -> None:
    step = "/home/ubuntu/.proxmox-gpu-cluster/agent/drain-0123456789ab/step.sh"
    assert retire_args(3101, "gpu-a", 600, step, ["--node-name", "gpu-a"], check=True) == [
        "--vmid", "3101", "--node-name", "gpu-a", "--timeout", "600", "--guest-step", step, "--check", "1", "--",
        "--node-name", "gpu-a",
    ]  # fmt: skip
    assert retire_args(3101, "gpu-a", 600, step, [], check=False)[-3:] == ["--check", "0", "--"]


def test_parse_groups() -> None:
    out = "group 0000:41:00 42\nsomething else\ngroup 0000:81:00 7\n"
    assert parse_groups(out) == {"0000:41:00": 42, "0000:81:00": 7}
