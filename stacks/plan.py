"""Offline plan: run a Pulumi program under Pulumi's mock engine and print what it would create.

Like ``helm template`` or ``cdk synth``: no Pulumi CLI, no credentials, no network. Secrets get placeholder
values and are shown as ``[secret]``. Any program works, ours or one that imports these components: the program is
``__main__.py`` in the current directory (or ``--main``), the project name comes from the ``Pulumi.yaml`` beside
it, and the stack file is ``Pulumi.<stack>.yaml`` there (or ``--config``). When the stack's config holds a cluster
spec (``<namespace>:cluster``) it is validated first and the capacity table and disruption come from it.

    python -m proxmox_gpu_cluster.plan dev                 # resource tree + capacity table
    python -m proxmox_gpu_cluster.plan dev --json          # machine-readable plan
    python -m proxmox_gpu_cluster.plan dev --out plan-out  # one YAML file of inputs per resource
    python -m proxmox_gpu_cluster.plan --config my.yaml x  # any stack file
    python -m proxmox_gpu_cluster.plan kubevirt --kubevirt-vms  # example VirtualMachines for the stack's GPU resources
    python -m proxmox_gpu_cluster.plan dev --pci pve1=pve1-pci.json  # preflight against a real host's PCI device list
    python -m proxmox_gpu_cluster.plan dev --main ../my-program     # another program (a directory or its file)
    python -m proxmox_gpu_cluster.plan prod --diff-base origin/main # what the stack file's edits would do
    python -m proxmox_gpu_cluster.plan prod --diff-config new.yaml --markdown  # ... as a pull-request comment

Exit codes: 0 planned, 2 invalid spec or config (one line per problem on stderr), 1 anything else.
"""

from __future__ import annotations

import gc
import json
import os
import re
import runpy
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from types import EllipsisType
from typing import Any, NoReturn

import yaml

from proxmox_gpu_cluster.core.capacity import WorkerCapacity, capacity_from_output, capacity_table
from proxmox_gpu_cluster.core.cluster_nodes import gpu_nodes
from proxmox_gpu_cluster.core.spec import ClusterSpec
from proxmox_gpu_cluster.proxmox.pci_mapping import IommuPreflightError
from proxmox_gpu_cluster.recording import critical_path
from proxmox_gpu_cluster.render.agent_bundle import agent_lines, agent_summary
from proxmox_gpu_cluster.render.disruption import disruption, disruption_lines
from proxmox_gpu_cluster.render.kubevirt import example_virtual_machines
from proxmox_gpu_cluster.stacks.cli_checks import OneLineParser, check_plan_arguments, printable
from proxmox_gpu_cluster.stacks.config import (
    ALL_SECRETS,
    PROJECT,
    InvalidStackConfig,
    parse_spec,
    raw_spec_from_stack_file,
)
from proxmox_gpu_cluster.stacks.plan_diff import cluster_prefix, diff, diff_document, render_diff
from proxmox_gpu_cluster.stacks.plan_inputs import InputError, find_program, read_inputs, stack_file_at
from proxmox_gpu_cluster.testing import RecordedResource, Recording, RecordingMocks, redact, run
from proxmox_gpu_cluster.testing_pci import pci_invokes


def stack_config(document: Mapping[str, Any], project: str = PROJECT) -> tuple[dict[str, Any], list[str]]:
    """Config map and secret keys for the mock engine from a parsed stack file.

    Encrypted values (``secure:``) cannot be decrypted offline; they and every secret key the stack file does
    not set get a placeholder, so the program runs its real secret handling.
    """
    config: dict[str, Any] = {}
    secret_keys: list[str] = []
    for key, value in (document.get("config") or {}).items():
        full = key if ":" in key else f"{project}:{key}"
        if isinstance(value, Mapping) and set(value) == {"secure"}:
            config[full] = f"plan-placeholder-{full.split(':', 1)[1]}"
            secret_keys.append(full)
        else:
            config[full] = value
    for secret in ALL_SECRETS:
        full = f"{project}:{secret.key}"
        if full not in config:
            config[full] = f"plan-placeholder-{secret.key}"
            secret_keys.append(full)
    return config, secret_keys


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


def resource_entry(r: RecordedResource) -> dict[str, Any]:
    """A resource as it appears in ``--json``: secrets redacted."""
    entry: dict[str, Any] = {
        "type": r.type,
        "name": r.name,
        "urn": r.urn,
        "parent": r.parent or None,
        "provider": r.provider or None,
        "dependencies": sorted(r.dependencies),
        "inputs": redact(r.inputs),
    }
    options = {
        "protect": r.protect,
        "ignoreChanges": r.ignore_changes,
        "replaceOnChanges": r.replace_on_changes,
        "additionalSecretOutputs": r.additional_secret_outputs,
        "deleteBeforeReplace": r.delete_before_replace,
        "retainOnDelete": r.retain_on_delete,
        "replaceWith": sorted(r.replace_with),
    }
    entry["options"] = {k: v for k, v in options.items() if v}
    return entry


def plan_document(
    stack: str,
    recording: Recording,
    capacity: Sequence[WorkerCapacity],
    spec: ClusterSpec | None = None,
    project: str = PROJECT,
) -> dict[str, Any]:
    """The whole plan as plain data (what ``--json`` prints); with ``spec``, also what it may disrupt."""
    document: dict[str, Any] = {
        "project": project,
        "stack": stack,
        "resources": [resource_entry(r) for _, r in tree_order(recording)],
        "outputs": redact(recording.outputs),
        "capacity": [asdict(row) for row in capacity],
        "warnings": [message for level, message in recording.logs if level == "warning"],
        "criticalPath": [r.name for r in critical_path(recording)],
        "rebootPoints": reboot_points(recording),
        "agent": agent_summary(),
    }
    if spec is not None:
        document["disruption"] = disruption(spec)
    return document


REBOOTS = {
    "-host-prep-prep": "the Proxmox node, when its running kernel lacks a wanted argument (intel_iommu=on with the "
    "IOMMU off, iommu=pt, ACS override; rebootPolicy)",
    "-bootstrap-driver": "the guest, when a driver, kernel argument or vfio change needs it (rolled when joined)",
    "-large-bar": "starts the new VM with its MMIO window; restarts one only if the window was lost",
    "-mig-restart": "the worker's VM (qm shutdown, qm start), only when its guest reports a GPU's MIG mode pending a "
    "reset (inside the node's rollout slot, after the label change)",
}


def reboot_points(recording: Recording) -> dict[str, str]:
    """Step -> what it may reboot, for every step of the plan that can, by name (registration order varies)."""
    return dict(sorted((r.name, w) for r in recording.resources for s, w in REBOOTS.items() if r.name.endswith(s)))


def render_text(
    stack: str, recording: Recording, capacity: Sequence[WorkerCapacity], spec: ClusterSpec | None = None
) -> str:
    """Human-readable plan: resource tree, capacity table, IOMMU checks, disruption (with ``spec``), warnings."""
    ordered = tree_order(recording)
    lines = [f"Offline plan of stack '{stack}' (Pulumi mock engine; nothing was contacted)", ""]
    lines.append(f"Resources ({len(ordered)}):")
    width = max((len(prefix) + len(r.type) for prefix, r in ordered), default=0) + 2
    for prefix, r in ordered:
        flags = " [protect]" if r.protect else ""
        lines.append(f"  {(prefix + r.type).ljust(width)}{r.name}{flags}")
    lines += ["", "Capacity (what each node will advertise):"]
    rows = [("WORKER", "PROXMOX NODE", "GPUS", "WORKLOAD", "SHARING", "ADVERTISES")]
    for row in capacity:
        gpus = ", ".join(f"{n} x {m}" for m, n in row.gpus.items())
        advertises = ", ".join(
            [f"{k}: {v}" for k, v in row.resources.items()] + [f"{k}: {v} (DRA)" for k, v in row.devices.items()]
        )
        rows.append((row.worker, row.node or "(bare metal)", gpus, row.workload, row.sharing, advertises))
    widths = [max(len(cells[i]) for cells in rows) for i in range(len(rows[0]) - 1)]
    for cells in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)) + "  " + cells[-1])
    checks = recording.outputs.get("iommuChecks") or {}
    if checks:
        lines += ["", "IOMMU isolation check (per Proxmox node):"]
        for node, check in sorted(checks.items()):
            how = (
                "preflight now, from the node's PCI device list"
                if check == "plan"
                else "deferred to host verify: the groups change when host prep reboots the node (IOMMU off, or "
                "the ACS override requested); its verify step checks them"
            )
            lines.append(f"  {node}: {how}")
    if spec is not None:
        lines += ["", "Disruption (what this stack may reboot, drain or replace; each step checks again):"]
        lines += [f"  {line}" for line in disruption_lines(spec)]
    chain = critical_path(recording)
    lines += ["", f"Critical path of a first pulumi up ({len(chain)} steps, one after the other):"]
    lines += [f"  {' -> '.join(r.name for r in chain)}"] if chain else []
    lines += ["", "Node agent (copied once per machine; a step runs again when its fingerprint changes):"]
    lines += [f"  {line}" for line in agent_lines()]
    points = reboot_points(recording)
    if points:
        lines += ["", "Reboot points (the only steps that may restart a machine; each decides again when it runs):"]
        lines += [f"  {name}: {what}" for name, what in points.items()]
    warnings = [m for level, m in recording.logs if level == "warning"]
    if warnings:
        lines += ["", "Warnings:", *(f"  {w}" for w in warnings)]
    return "\n".join(lines) + "\n"


def write_inputs(out_dir: Path, recording: Recording) -> int:
    """Write each resource's (redacted) inputs to ``out_dir/<type>/<name>.yaml``; returns the file count."""
    count = 0
    for _, r in tree_order(recording):
        folder = out_dir / re.sub(r"[^A-Za-z0-9_.-]", "_", r.type)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{r.name}.yaml").write_text(yaml.safe_dump(redact(r.inputs), sort_keys=True))
        count += 1
    return count


def example_manifests(spec: ClusterSpec) -> str:
    """The example VirtualMachines of ``spec`` as a multi-document YAML stream (empty without KubeVirt)."""
    if not spec.kubevirt.enabled:
        return ""
    return yaml.dump_all(
        example_virtual_machines(gpu_nodes(spec), spec.guest.ssh_public_keys),
        Dumper=_BlockDumper,
        sort_keys=False,
        explicit_start=True,
    )


class _BlockDumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings (cloud-init user data) as literal blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_BlockDumper.add_representer(str, _represent_str)


def cluster_spec(document: Mapping[str, Any], namespace: str) -> ClusterSpec | None:
    """The validated cluster spec of a stack file, or None for a program whose config holds none."""
    raw = raw_spec_from_stack_file(document, namespace)
    return None if raw is None else parse_spec(raw, namespace)


def plan(
    stack: str,
    document: Mapping[str, Any],
    main: Path,
    pci: Mapping[str, list[dict[str, Any]]] | None = None,
    *,
    project: str = PROJECT,
    namespace: str | None = None,
    spec: ClusterSpec | EllipsisType | None = ...,
) -> tuple[Recording, list[WorkerCapacity]]:
    """Validate the spec under ``namespace`` (default: the project) unless given as ``spec``; run ``main`` under
    mocks, ``get_pci`` answers from ``pci`` or like the spec's hosts; InvalidStackConfig, IommuPreflightError raise."""
    spec = cluster_spec(document, namespace or project) if spec is ... else spec
    config, secret_keys = stack_config(document, namespace or project)
    # The program's own directory comes first on sys.path, as under `pulumi up`.
    sys.path.insert(0, str(main.parent))
    try:
        recording = run(
            lambda: runpy.run_path(str(main), run_name="__main__"),
            project=project,
            stack=stack,
            config=config,
            secret_keys=secret_keys,
            mocks=RecordingMocks(invokes=pci_invokes(spec, pci)),
        )
    finally:
        sys.path.remove(str(main.parent))
    if spec is not None:
        return recording, capacity_table(spec)
    # A program without a cluster spec: the table it exports (``capacity_output``), if any.
    return recording, capacity_from_output(recording.outputs.get("capacity"))


def exit_without_teardown(code: int) -> NoReturn:
    """Flush and exit the process at once: tearing down a large plan's heap object by object takes longer than
    printing it (about 10 s for 1000 workers); nothing is left to release that the OS does not reclaim."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit code."""
    # A one-shot process: everything the program registered stays alive until the plan is printed, so the cyclic
    # collector would only rescan it, generation after generation, once ``run`` (which pauses it during the program)
    # hands back (8 s of a 50 s plan of 1000 workers, benchmarks/plan_scale.py).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _main(argv)
    finally:
        if collecting:
            gc.enable()


def _main(argv: Sequence[str] | None) -> int:
    parser = OneLineParser(prog="python -m proxmox_gpu_cluster.plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("stack", help="stack name; reads Pulumi.<stack>.yaml unless --config is given")
    parser.add_argument("--config", type=Path, help="stack config file to plan instead of Pulumi.<stack>.yaml")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--out", type=Path, help="also write each resource's inputs as YAML under this folder")
    parser.add_argument(
        "--pci",
        action="append",
        default=[],
        metavar="NODE=FILE",
        help="answer the IOMMU preflight for NODE from FILE, the output of `pvesh get /nodes/NODE/hardware/pci "
        "--pci-class-blacklist '' --output-format json` (default: a host shaped like the spec)",
    )
    parser.add_argument(
        "--kubevirt-vms",
        action="store_true",
        help="print example KubeVirt VirtualMachines requesting each GPU resource the stack permits, and exit",
    )
    parser.add_argument(
        "--main",
        type=Path,
        help="the program: a directory with __main__.py and Pulumi.yaml, or the file itself "
        "(default: the current directory)",
    )
    parser.add_argument("--namespace", help="config namespace of the cluster spec (default: the project name)")
    compare = parser.add_mutually_exclusive_group()
    compare.add_argument(
        "--diff-config",
        type=Path,
        metavar="OTHER",
        help="print what changing the stack file to "
        "OTHER would do: resources added, removed, updated, replaced, and what that disrupts",
    )
    compare.add_argument(
        "--diff-base",
        metavar="GIT_REF",
        help="print what the stack file's changes since GIT_REF "
        "would do (it plans the file as it is at that revision, then as it is now)",
    )
    parser.add_argument("--markdown", action="store_true", help="print a diff as a pull-request comment")
    args = parser.parse_args(argv)

    try:
        check_plan_arguments(args.out, args.pci, args.diff_base)
        program = find_program(args.main)
        namespace = args.namespace or program.project
        path: Path = args.config or program.directory / f"Pulumi.{args.stack}.yaml"
        document, pci = read_inputs(path, args.pci)
        spec = cluster_spec(document, namespace)
        unknown = sorted(set(pci) - {n.name for n in (spec.proxmox.nodes if spec else ())})
        if unknown:
            raise InputError(f"--pci: no Proxmox node {', '.join(unknown)} in the spec")
        if args.kubevirt_vms:
            print(example_manifests(spec) if spec else "", end="")
            return 0
        given = {"project": program.project, "namespace": namespace}
        recording, capacity = plan(args.stack, document, program.main, pci, **given, spec=spec)
        if args.diff_config or args.diff_base:
            other = read_inputs(args.diff_config, [])[0] if args.diff_config else stack_file_at(args.diff_base, path)
            other_spec = cluster_spec(other, namespace)
            other_plan = plan(args.stack, other, program.main, pci, **given, spec=other_spec)
    except (InputError, InvalidStackConfig, IommuPreflightError) as err:
        print(printable(err.lines), file=sys.stderr)
        return 2
    if args.diff_config or args.diff_base:
        docs = [plan_document(args.stack, *plan_, s, program.project) for plan_, s in
                (((recording, capacity), spec), (other_plan, other_spec))]  # fmt: skip
        before, after = docs if args.diff_config else docs[::-1]
        after_spec = other_spec if args.diff_config else spec
        slots = after_spec.kubernetes.drain.max_unavailable if after_spec else 1
        changes, prefix = diff(before, after), cluster_prefix(after)
        if args.json:
            print(json.dumps(diff_document(changes, slots, prefix), indent=2, sort_keys=True))
        else:
            print(render_diff(changes, slots, prefix, markdown=args.markdown), end="")
        return 0
    if args.json:
        # Input key order comes from the mock engine's async serialization and differs between runs; sorting
        # makes the plan byte-identical across processes, so CI can diff it.
        document = plan_document(args.stack, recording, capacity, spec, program.project)
        print(json.dumps(document, indent=2, sort_keys=True, default=str))
    else:
        print(render_text(args.stack, recording, capacity, spec), end="")
    if args.out:
        count = write_inputs(args.out, recording)
        print(f"wrote {count} input files under {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())
