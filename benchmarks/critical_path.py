"""First-`pulumi up` critical path of one new worker, modelled: from its VM's creation to its GPUs allocatable
(the capacity check passing), on the dependency graph of the real program's offline plan, with the step durations
below (assumptions, stated with their reasons; change them with --set ROLE=SECONDS).

The graph is the engine's: each resource waits for its dependencies and its ancestors' (recording.critical_path),
so a change to the program's ordering shows here. What the Proxmox node needs first (host prep, PCI mappings) is
taken as done: a new worker on a prepared node. Printed per way of getting the NVIDIA kernel module (the driver
step takes Ubuntu's precompiled one when the archive has it, DKMS otherwise: guest_driver_apt.sh), plus one
what-if: the GPU Operator's release installed before the nodes join rather than after (not what the program does).

    python benchmarks/critical_path.py                     # the dev stack
    python benchmarks/critical_path.py --stack prod --set dkms-build=420
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

SECONDS = {
    "vm": 90,  # clone of the cloud image, create, first start: OVMF and the kernel up to SSH
    "large-bar": 30,  # the start with the MMIO window (large-BAR GPUs only)
    "bootstrap-agent": 5,  # the agent bundle copied over SSH
    "bootstrap-vm-restart": 3,  # `qm pending` on the Proxmox node: nothing pending on a first up
    "bootstrap-cloud-init": 120,  # cloud-init's package update and the guest agent
    "driver-packages": 90,  # apt downloading and unpacking the driver family (~350 MB) from the mirror
    "dkms-build": 240,  # DKMS building the open modules on a 4-vCPU VM (none with precompiled ones)
    "precompiled-modules": 10,  # the signed module package for the running kernel
    "bootstrap-driver-wait": 5,  # no reboot on a first install: cloud-init blacklisted nouveau, modprobe loads it
    "bootstrap-runtime": 60,  # containerd and the NVIDIA Container Toolkit installed and configured
    "bootstrap-join-token": 2,  # one POST to the API server where pulumi up runs
    "bootstrap-join": 90,  # kubeadm, kubelet and kubectl installed; kubeadm join; the kubelet registers
    "bootstrap-verify": 20,  # nvidia-smi, the runtime and the Node checked
    "mig-begin": 10,  # the MIG rollout's slot (a new node: nothing to drain)
    "gpu-operator-release": 180,  # Helm install; the operator and its DaemonSets' images pulled and ready
    "capacity-check": 60,  # the device plugin registers the GPUs with the kubelet
}
"""Seconds per step; a resource whose name ends in none of these takes 2 s (a Kubernetes object applied)."""
DONE_BEFORE = ("host-prep", "-pci-", "pulumi:providers:")
"""Resources taken as done before the worker (its Proxmox node prepared and mapped): 0 s."""


def duration(name: str, type_: str, seconds: dict[str, float], modules: str) -> float:
    if any(part in name or type_.startswith(part) for part in DONE_BEFORE):
        return 0.0
    if name.endswith("-bootstrap-driver"):
        module = seconds["dkms-build"] if modules == "dkms" else seconds["precompiled-modules"]
        return seconds["driver-packages"] + module
    role = next((r for r in sorted(seconds, key=len, reverse=True) if name.endswith("-" + r)), None)
    return float(seconds[role]) if role else 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", default="dev")
    parser.add_argument("--set", action="append", default=[], metavar="ROLE=SECONDS")
    args = parser.parse_args()
    seconds: dict[str, float] = dict(SECONDS)
    for item in args.set:
        role, _, value = item.partition("=")
        if role not in seconds:
            parser.error(f"--set {item}: unknown role {role!r}; roles: {', '.join(seconds)}")
        seconds[role] = float(value)

    sys.path.insert(0, str(ROOT))
    import proxmox_gpu_cluster.stacks.plan.run as cli  # noqa: PLC0415
    from proxmox_gpu_cluster.recording import critical_path  # noqa: PLC0415

    document = yaml.safe_load((ROOT / f"Pulumi.{args.stack}.yaml").read_text())
    recording, _ = cli.plan(args.stack, document, ROOT / "__main__.py", placeholder_secrets=True)
    release = next(r for r in recording.resources if r.name.endswith("-gpu-operator-release"))

    def path(modules: str, release_early: bool) -> tuple[float, list[tuple[str, float]]]:
        def weight(r: object) -> float:
            if release_early and r is release:
                return 0.0  # installed while the VM boots: off this path (its DaemonSets still start on the node)
            return duration(r.name, r.type, seconds, modules)  # type: ignore[attr-defined]

        chain = critical_path(recording, weight)
        steps = [(r.name, weight(r)) for r in chain if weight(r)]
        return sum(s for _, s in steps), steps

    print(f"stack {args.stack}: a new worker's first up, its VM created to its GPUs allocatable (modelled)")
    rows = [("dkms", False), ("precompiled", False), ("precompiled", True)]
    for modules, early in rows:
        total, steps = path(modules, early)
        label = f"{modules}{' + operator release before the join (what-if)' if early else ''}"
        print(f"\n{label}: {total:.0f} s = {total / 60:.1f} min over {len(steps)} steps")
        for name, s in steps:
            print(f"  {s:6.0f} s  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
