"""Host script command lines and output parsing (pure)."""

from __future__ import annotations

import shlex

from components.host_scripts import kernel_args, parse_groups, prep_args, remote_command, verify_args
from components.spec import load_spec
from tests.support import base_spec, make_vm_worker


def test_remote_command_quotes_and_uses_sudo_for_non_root() -> None:
    args = ["--gpu", "0000:41:00=10de:2236", "it's"]
    assert remote_command("root", args) == "bash -s -- --gpu 0000:41:00=10de:2236 'it'\"'\"'s'"
    assert remote_command("admin", args).startswith("sudo -n bash -s -- ")
    assert shlex.split(remote_command("root", args))[3:] == args


def test_args_follow_the_spec() -> None:
    raw = base_spec()
    raw["proxmox"]["nodes"][0].update(acsOverride=True, hostPrep=True)
    spec = load_spec(raw)
    node = spec.node("pve1")
    assert kernel_args(node) == ["amd_iommu=on", "iommu=pt", "pcie_acs_override=downstream,multifunction"]
    # only claimed GPUs: a10-0 on pve1 is unclaimed, the console T4 is never passed through
    assert prep_args(spec, node)[-4:] == ["--gpu", "0000:41:00=10de:20f1", "--gpu", "0000:42:00=10de:20f1"]
    assert verify_args(spec, node)[-4:] == ["--gpu", "0000:41:00", "--gpu", "0000:42:00"]
    # Only a node hosting a KubeVirt worker VM is asked for nested virtualization.
    kubevirt = load_spec(make_vm_worker(base_spec(), 2, "vm-passthrough"))
    assert verify_args(kubevirt, kubevirt.node("pve2"))[-2:] == ["--nested", "1"]
    assert "--nested" not in verify_args(kubevirt, kubevirt.node("pve1"))


def test_parse_groups() -> None:
    out = "group 0000:41:00 42\nsomething else\ngroup 0000:81:00 7\n"
    assert parse_groups(out) == {"0000:41:00": 42, "0000:81:00": 7}
