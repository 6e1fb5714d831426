"""What the offline plan writes besides the plan itself: each resource's inputs as files, and example KubeVirt
VirtualMachines for the GPU resources the clusters permit."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from proxmox_gpu_cluster.core.cluster_nodes import gpu_nodes
from proxmox_gpu_cluster.render.agent_bundle import REMOTE_DIR as AGENT_DIR
from proxmox_gpu_cluster.render.kubevirt import example_virtual_machines
from proxmox_gpu_cluster.stacks.plan.specs import Specs, clusters_of
from proxmox_gpu_cluster.testing import RecordedResource, Recording, redact


def tree_order(recording: Recording) -> list[tuple[str, RecordedResource]]:
    """Resources depth-first from the stack, siblings sorted by type and name, with their tree prefix."""
    children: dict[str, list[RecordedResource]] = {}
    for r in recording.resources:
        children.setdefault(r.parent, []).append(r)
    out: list[tuple[str, RecordedResource]] = []

    def walk(parent: str, indent: str, top: bool) -> None:
        siblings = sorted(children.get(parent, []), key=lambda r: (r.type, r.name))
        for i, r in enumerate(siblings):
            last = i == len(siblings) - 1
            out.append(("" if top else indent + ("└─ " if last else "├─ "), r))
            walk(r.urn, "" if top else indent + ("   " if last else "│  "), False)

    walk("", "", True)
    return out


def write_inputs(out_dir: Path, recording: Recording) -> int:
    """Write each resource's (redacted) inputs to ``out_dir/<type>/<name>.yaml``; returns the file count."""
    count = 0
    for _, r in tree_order(recording):
        folder = out_dir / re.sub(r"[^A-Za-z0-9_.-]", "_", r.type)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{r.name}.yaml").write_text(yaml.safe_dump(redact(r.inputs), sort_keys=True))
        count += 1
    return count


def example_manifests(spec: Specs) -> str:
    """The example VirtualMachines of the specs as a multi-document YAML stream (empty without KubeVirt)."""
    vms = [vm for c in clusters_of(spec) if c.spec.kubevirt.enabled
           for vm in example_virtual_machines(gpu_nodes(c.spec), c.spec.guest.ssh_public_keys)]  # fmt: skip
    if not vms:
        return ""
    return yaml.dump_all(
        vms,
        Dumper=_BlockDumper,
        sort_keys=False,
        explicit_start=True,
    )


class _BlockDumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings (cloud-init user data) as literal blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_BlockDumper.add_representer(str, _represent_str)


def copies_agent(recording: Recording) -> bool:
    """Whether the program copies the node agent to any machine (``node_agent.install_agent``)."""
    return any(
        r.type == "command:remote:CopyToRemote" and r.inputs.get("remotePath") == AGENT_DIR for r in recording.resources
    )
