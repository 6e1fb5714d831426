"""Arguments and output parsing for the Proxmox host scripts in ``components/scripts``. Pure.

The scripts run as the node agent's bundles (``render/agent_bundle.py``); every argument is shell-quoted there, and
every spec value that reaches one is already constrained by the spec's patterns, so a spec string is only ever data
to the script. ``script`` reads a shipped file as it travels (the reboot wait, which runs where ``pulumi up`` runs).
"""

from __future__ import annotations

import functools
import re
from importlib import resources

from proxmox_gpu_cluster.core.spec import ProxmoxNode
from proxmox_gpu_cluster.render.shipping import strip_comments, strip_python

VERIFY_LINE = re.compile(r"^group (\S+) (\d+)$")
REBOOT_SCHEDULED = "reboot: scheduled"
"""What host_prep.sh and guest_driver.sh print when they scheduled a reboot (wait_for_reboot.py looks for it)."""
REBOOT_REQUIRED = "reboot: required"
"""What host_prep.sh prints when the node needs a reboot that its ``rebootPolicy: never`` leaves to the operator."""


@functools.cache
def script(name: str) -> str:
    """The text of a shipped script as it travels (without its comments, see ``render/shipping.py``); read once per
    process, as every worker's steps send the same text."""
    text = resources.files("proxmox_gpu_cluster").joinpath("scripts", name).read_text()
    return strip_comments(text) if name.endswith(".sh") else strip_python(text)


def kernel_args(node: ProxmoxNode) -> list[str]:
    """The kernel arguments the spec asks for on ``node`` (host prep adds them; host verify checks them). The IOMMU
    itself is not among them: AMD's is on by default and Intel's from kernel 6.8 (Proxmox VE 8.2+ and 9; pve-docs
    qm-pci-passthrough, "IOMMU"), so host prep adds ``intel_iommu=on`` only where the RUNNING kernel needs it, which
    only the node knows; ``amd_iommu=on`` is no value the kernel accepts (kernel-parameters.txt) and is never set."""
    args = ["iommu=pt"] if node.iommu_passthrough else []
    if node.acs_override:
        args.append("pcie_acs_override=downstream,multifunction")
    return args


OWNER = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
"""What host_prep.sh takes as ``--owner`` (a scope token, ``core/names.py`` ``StackScope.token``)."""


def prep_args(node: ProxmoxNode, *, owner: str) -> list[str]:
    """Arguments of host_prep.sh: from the node's own description only (its declared GPUs, kernel options, reboot
    policy), never from which workers claim its GPUs, so adding or removing a worker never changes host prep.
    ``--iommu-pt 1`` only when asked, so a node without it keeps the command line it had before the option.
    ``owner``: whose claim this is (the stack's or cluster's scope token): host prep records it in the owner's own
    drop-in on the node and binds the union of every owner's GPUs, so clusters sharing the node never unbind each
    other's (scripts/host_compose.sh)."""
    args = ["--owner", _owner(owner), "--cpu-vendor", node.cpu_vendor, "--boot-loader", node.boot_loader]
    args += ["--acs-override", "1" if node.acs_override else "0", "--reboot-policy", node.reboot_policy]
    if node.iommu_passthrough:
        args += ["--iommu-pt", "1"]
    for _, gpu in node.passthrough_gpus:
        args += ["--gpu", f"{gpu.pci_path}={gpu.vendor_device}"]
    return args


def release_args(owner: str) -> list[str]:
    """Arguments of host_prep.sh that release ``owner``'s claim (the prep step's delete): its drop-in only; the next
    host prep of another owner writes the node's files without its GPUs."""
    return ["--owner", _owner(owner), "--release"]


def _owner(owner: str) -> str:
    if not OWNER.match(owner):
        raise ValueError(f"host prep owner: expected a scope token like {OWNER.pattern}, got {owner!r}")
    return owner


def verify_args(node: ProxmoxNode) -> list[str]:
    """Arguments of host_verify.sh, from the node's own description only (see ``prep_args``)."""
    args: list[str] = []
    for arg in kernel_args(node):
        args += ["--kernel-arg", arg]
    for _, gpu in node.passthrough_gpus:
        args += ["--gpu", gpu.pci_path]
    if node.nested_virtualization:
        args += ["--nested", "1"]  # KubeVirt worker VMs on this node run VMs themselves
    return args


def _vm_step_args(vmid: int, node_name: str, timeout: int) -> list[str]:
    """The arguments the three VM steps share (host_qm.sh ``qm_step_arg``), before each one's own."""
    return ["--vmid", str(vmid), "--node-name", node_name, "--timeout", str(timeout)]


def retire_args(
    vmid: int, node_name: str, timeout: int, guest_step: str, guest_args: list[str], *, check: bool
) -> list[str]:
    """Arguments of retire_vm.sh: which VM, the node it joined as, the drain timeout, the guest's installed drain
    step (``agent_bundle.installed_step``), then that step's arguments. ``check``: only prove that the guest agent
    answers and the drain step is installed (the create step)."""
    args = [*_vm_step_args(vmid, node_name, timeout), "--guest-step", guest_step]
    return [*args, "--check", "1" if check else "0", "--", *guest_args]


def mig_restart_args(vmid: int, node_name: str, timeout: int, guest_step: str, guest_args: list[str]) -> list[str]:
    """Arguments of mig_restart.sh: which VM, its node name, how long the guest agent may take to answer after the
    restart, the guest's installed MIG step, then that step's arguments (``--phase restart``)."""
    return [*_vm_step_args(vmid, node_name, timeout), "--guest-step", guest_step, "--", *guest_args]


def vm_restart_args(
    vmid: int, node_name: str, timeout: int, *, hardware: str, guest_step: str, guest_args: list[str]
) -> list[str]:
    """Arguments of vm_restart.sh: which VM, its node name, how long the guest agent may take to answer after the
    restart, the hardware key, the guest's installed hold step, then that step's arguments."""
    args = [*_vm_step_args(vmid, node_name, timeout), "--hardware", hardware]
    return [*args, "--guest-step", guest_step, "--", *guest_args]


def parse_groups(stdout: str) -> dict[str, int]:
    """PCI path -> IOMMU group from host_verify.sh's output."""
    return {m[1]: int(m[2]) for line in stdout.splitlines() if (m := VERIFY_LINE.match(line.strip()))}
