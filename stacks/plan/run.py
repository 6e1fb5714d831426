"""Offline plan: run a Pulumi program under Pulumi's mock engine and print what it would create.

Like ``helm template`` or ``cdk synth``: no Pulumi CLI, no credentials, no network. Secrets get placeholder
values and are shown as ``[secret]``. Any program works, ours or one that imports these components: the program is
``__main__.py`` in the current directory (or ``--main``), the project name comes from the ``Pulumi.yaml`` beside
it, and the stack file is ``Pulumi.<stack>.yaml`` there (or ``--config``). Every cluster spec of the stack's config
(``<namespace>:cluster``, one per cluster of the program) is validated first and the capacity table and
disruption come from them. Secrets as ``pulumi preview`` has them (``stacks/plan/specs.py``).

    python -m proxmox_gpu_cluster.plan dev --placeholder-secrets  # a stack file without secrets: placeholders
    python -m proxmox_gpu_cluster.plan dev                 # resource tree + capacity table
    python -m proxmox_gpu_cluster.plan dev --json          # machine-readable plan
    python -m proxmox_gpu_cluster.plan dev --out plan-out  # one YAML file of inputs per resource
    python -m proxmox_gpu_cluster.plan --config my.yaml x  # any stack file
    python -m proxmox_gpu_cluster.plan kubevirt --kubevirt-vms  # example VirtualMachines for the stack's GPU resources
    python -m proxmox_gpu_cluster.plan dev --pci pve1=pve1-pci.json  # preflight against a real host's PCI device list
    python -m proxmox_gpu_cluster.plan dev --main ../my-program     # another program (a directory or its file)
    python -m proxmox_gpu_cluster.plan prod --diff-base origin/main # what the edits since then would do (code too)
    python -m proxmox_gpu_cluster.plan prod --diff-config new.yaml --markdown  # ... as a pull-request comment

Secrets in ``--json``: ``[secret]``; with the environment variable ``PGC_SECRET_DIGEST_KEY`` set (hex, at least 16
bytes, e.g. ``openssl rand -hex 32``), ``[secret:<hex>]``, a truncated HMAC-SHA256 of the value under that key, so two
plans made with the same key (a diff's base revision planned in another process) show whether a secret changed, and
nothing else. Use a fresh random key per diff and never store it; a diff made in one process uses its own.

Exit codes: 0 planned, 2 invalid spec, config or program input (one line per problem on stderr: a missing secret,
a component's bad args), 1 anything else.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import runpy
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from types import EllipsisType
from typing import Any, NoReturn

import pulumi

from proxmox_gpu_cluster.core.capacity import WorkerCapacity
from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.proxmox.pci_mapping import IommuPreflightError
from proxmox_gpu_cluster.recording import critical_path
from proxmox_gpu_cluster.render.agent_bundle import agent_lines, agent_summary
from proxmox_gpu_cluster.render.disruption import disruption, disruption_lines
from proxmox_gpu_cluster.stacks.cli_checks import OneLineParser, check_plan_arguments, printable
from proxmox_gpu_cluster.stacks.config import PROJECT, InvalidStackConfig
from proxmox_gpu_cluster.stacks.plan.compare import diff_sides
from proxmox_gpu_cluster.stacks.plan.context import spec_view
from proxmox_gpu_cluster.stacks.plan.diff import cluster_prefix, diff
from proxmox_gpu_cluster.stacks.plan.files import copies_agent, example_manifests, tree_order, write_inputs
from proxmox_gpu_cluster.stacks.plan.inputs import InputError, Program, check_pci_used, find_program, read_inputs
from proxmox_gpu_cluster.stacks.plan.report import diff_document, render_diff
from proxmox_gpu_cluster.stacks.plan.specs import (
    PlannedCluster,
    Specs,
    built_capacity,
    cluster_specs,
    clusters_of,
    spec_namespaces,
    stack_config,
)
from proxmox_gpu_cluster.stacks.plan.values import digest_key_from_env, new_digest_key
from proxmox_gpu_cluster.testing import RecordedResource, Recording, RecordingMocks, redact, run
from proxmox_gpu_cluster.testing_pci import pci_invokes


def resource_entry(r: RecordedResource, secret_key: bytes | None = None) -> dict[str, Any]:
    """A resource as it appears in ``--json``: secrets redacted (with ``secret_key``: as keyed fingerprints, so a
    diff can tell which changed; ``recording.redact``)."""
    entry: dict[str, Any] = {
        "type": r.type,
        "name": r.name,
        "urn": r.urn,
        "parent": r.parent or None,
        "provider": r.provider or None,
        "dependencies": sorted(r.dependencies),
        "inputs": redact(r.inputs, secret_key),
    }
    # Which resources each input comes from: the engine replaces a dependent of a delete-first replacement when
    # such an input would force its replacement (plan.engine.dependent_replacements).
    links = {k: sorted(v) for k, v in sorted(r.property_dependencies.items()) if v}
    if links:
        entry["propertyDependencies"] = links
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
    spec: Specs = None,
    project: str = PROJECT,
    *,
    secret_key: bytes | None = None,
) -> dict[str, Any]:
    """The whole plan as plain data (what ``--json`` prints); with ``spec``, also what it may disrupt (per
    namespace when the program has several clusters). With ``secret_key`` (one random key shared by the two plans
    of a diff, never stored or printed) each secret input is ``[secret:<hex>]``, a keyed fingerprint, instead of
    ``[secret]``; outputs stay ``[secret]``."""
    document: dict[str, Any] = {
        "project": project,
        "stack": stack,
        "resources": [resource_entry(r, secret_key) for _, r in tree_order(recording)],
        "outputs": redact(recording.outputs),
        "capacity": [asdict(row) for row in capacity],
        "warnings": [message for level, message in recording.logs if level == "warning"],
        "criticalPath": [r.name for r in critical_path(recording)],
        "rebootPoints": reboot_points(recording),
        "agent": agent_summary(),
    }
    clusters = clusters_of(spec)
    if clusters:  # the spec as validated, so a diff can say which fields changed (plan/context.py); no secrets
        document["specs"] = spec_view([(c.namespace, c.spec) for c in clusters])
    if len(clusters) == 1:
        document["disruption"] = disruption(clusters[0].spec)
    elif clusters:
        document["disruption"] = {c.namespace: disruption(c.spec) for c in clusters}
    return document


REBOOTS = {
    "-host-prep-prep": "the Proxmox node, when its running kernel lacks a wanted argument (intel_iommu=on with the "
    "IOMMU off, iommu=pt, ACS override; rebootPolicy)",
    "-bootstrap-driver": "the guest, when a driver, kernel argument or vfio change needs it (rolled when joined)",
    "-large-bar": "starts the new VM with its MMIO window; restarts one only if the window was lost",
    "-mig-restart": "the worker's VM (qm shutdown, qm start), only when its guest reports a GPU's MIG mode pending a "
    "reset (after the label change and once the node holds a rollout slot, cordoned and drained, first "
    "provisioning in operator driver mode included, where it waits for the driver container and mig-manager)",
}


def reboot_points(recording: Recording) -> dict[str, str]:
    """Step -> what it may reboot, for every step of the plan that can, by name (registration order varies)."""
    return dict(sorted((r.name, w) for r in recording.resources for s, w in REBOOTS.items() if r.name.endswith(s)))


def render_text(stack: str, recording: Recording, capacity: Sequence[WorkerCapacity], spec: Specs = None) -> str:
    """Human-readable plan: resource tree, capacity table, IOMMU checks, disruption (with ``spec``), warnings."""
    ordered = tree_order(recording)
    lines = [f"Offline plan of stack '{stack}' (Pulumi mock engine; nothing was contacted)", ""]
    lines.append(f"Resources ({len(ordered)}):")
    width = max((len(prefix) + len(r.type) for prefix, r in ordered), default=0) + 2
    for prefix, r in ordered:
        flags = " [protect]" if r.protect else ""
        lines.append(f"  {(prefix + r.type).ljust(width)}{r.name}{flags}")
    # Only what the program builds: no capacity table without a GPU node, no agent without a machine it goes to.
    rows = [("WORKER", "PROXMOX NODE", "GPUS", "WORKLOAD", "SHARING", "ADVERTISES")] if capacity else []
    lines += ["", "Capacity (what each node will advertise):"] if capacity else []
    for row in capacity:
        gpus = ", ".join(f"{n} x {m}" for m, n in row.gpus.items())
        advertises = ", ".join(
            [f"{k}: {v}" for k, v in row.resources.items()] + [f"{k}: {v} (DRA)" for k, v in row.devices.items()]
        )
        rows.append((row.worker, row.node or "(bare metal)", gpus, row.workload, row.sharing, advertises))
    widths = [max(len(cells[i]) for cells in rows) for i in range(len(rows[0]) - 1)] if rows else []
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
    for c in clusters_of(spec):
        of = f" of the cluster in {c.namespace}:cluster" if len(clusters_of(spec)) > 1 else ""
        lines += ["", f"Disruption{of} (what this stack may reboot, drain or replace; each step checks again):"]
        lines += [f"  {line}" for line in disruption_lines(c.spec)]
    chain = critical_path(recording)
    lines += ["", f"Critical path of a first pulumi up ({len(chain)} steps, one after the other):"]
    lines += [f"  {' -> '.join(r.name for r in chain)}"] if chain else []
    if copies_agent(recording):
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


def plan(
    stack: str,
    document: Mapping[str, Any],
    main: Path,
    pci: Mapping[str, list[dict[str, Any]]] | None = None,
    *,
    project: str = PROJECT,
    namespace: str | Sequence[str] | None = None,
    spec: Specs | EllipsisType = ...,
    placeholder_secrets: bool = False,
) -> tuple[Recording, list[WorkerCapacity]]:
    """Validate the cluster spec of each of ``namespace`` (default: every ``<namespace>:cluster`` of the stack file)
    unless given as ``spec``; run ``main`` under mocks, ``get_pci`` answers from ``pci`` or like the specs' hosts.
    InvalidStackConfig and IommuPreflightError raise, and whatever the program raises (a ``pulumi.RunError`` for
    a bad spec, args or a missing secret: ``placeholder_secrets`` fills the missing ones, see plan/specs.py)."""
    if isinstance(namespace, str):
        namespace = [namespace]
    if spec is ...:
        spec = cluster_specs(document, namespace or spec_namespaces(document, project))
    clusters = clusters_of(spec)
    config, secret_keys, _ = stack_config(document, project, clusters, placeholder_secrets=placeholder_secrets)
    # The program's own directory comes first on sys.path, as under `pulumi up`.
    sys.path.insert(0, str(main.parent))
    try:
        recording = run(
            lambda: runpy.run_path(str(main), run_name="__main__"),
            project=project,
            stack=stack,
            config=config,
            secret_keys=secret_keys,
            mocks=RecordingMocks(invokes=pci_invokes([c.spec for c in clusters], pci)),
        )
    finally:
        sys.path.remove(str(main.parent))
    return recording, built_capacity(clusters, recording)


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


def _env_key() -> bytes | None:
    """The secret-fingerprint key ``--json`` was given in ``PGC_SECRET_DIGEST_KEY`` (a diff's base revision is
    planned that way, plan/compare.py), or None; InputError when it is no key."""
    try:
        return digest_key_from_env()
    except ValueError as err:
        raise InputError(str(err)) from None


def _planned(args: Any, program: Program, pci: Mapping[str, list[dict[str, Any]]], key: bytes,
             document: Mapping[str, Any]) -> tuple[dict[str, Any], list[PlannedCluster]]:  # fmt: skip
    """The other side of a diff planned here, with the diff's secret key: its plan document and specs."""
    specs = cluster_specs(document, args.namespace or spec_namespaces(document, program.project))
    given = {"project": program.project, "placeholder_secrets": args.placeholder_secrets}
    recording, capacity = plan(args.stack, document, program.main, pci, **given, spec=specs)
    return plan_document(args.stack, recording, capacity, specs, program.project, secret_key=key), specs


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
    parser.add_argument(
        "--namespace",
        action="append",
        help="config namespace of a cluster spec, once per cluster (default: every <namespace>:cluster key)",
    )
    parser.add_argument(
        "--placeholder-secrets",
        action="store_true",
        help="plan secrets the stack file does not set with placeholders (for templates without secrets); "
        "without it a missing secret fails the plan as it would fail pulumi preview",
    )
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
        help="print what the changes since GIT_REF would do: that revision's code and stack file "
        "(planned in a temporary git worktree), then the checkout's",
    )
    parser.add_argument("--markdown", action="store_true", help="print a diff as a pull-request comment")
    args = parser.parse_args(argv)

    try:
        check_plan_arguments(args.out, args.pci, args.diff_base)
        program = find_program(args.main)
        path: Path = args.config or program.directory / f"Pulumi.{args.stack}.yaml"
        document, pci = read_inputs(path, args.pci)
        namespaces = args.namespace or spec_namespaces(document, program.project)
        specs = cluster_specs(document, namespaces)
        if args.kubevirt_vms:
            print(example_manifests(specs), end="")
            return 0
        given = {"project": program.project, "placeholder_secrets": args.placeholder_secrets}
        recording, capacity = plan(args.stack, document, program.main, pci, **given, spec=specs)
        check_pci_used(pci, recording)
        if args.diff_config or args.diff_base:
            key = new_digest_key()  # one per diff, for both sides' secrets; forgotten after
            now = plan_document(args.stack, recording, capacity, specs, program.project, secret_key=key)
            other = functools.partial(_planned, args, program, pci, key)
            before, after, after_specs = diff_sides(args, program, path, now, specs, planned=other, key=key)
        env_key = _env_key() if args.json else None
    except (InputError, InvalidStackConfig, IommuPreflightError) as err:
        print(printable(err.lines), file=sys.stderr)
        return 2
    except (pulumi.RunError, SpecError) as err:  # the program's own refusal: a bad spec, bad args, a missing secret
        lines = getattr(err, "lines", None) or str(err).splitlines()
        print(printable(list(lines)), file=sys.stderr)
        return 2
    assumed = stack_config(document, program.project, specs, placeholder_secrets=args.placeholder_secrets)[2]
    if assumed:
        print(f"placeholders for secrets the stack file does not set: {', '.join(assumed)}", file=sys.stderr)
    if args.diff_config or args.diff_base:
        slots = min((c.spec.kubernetes.drain.max_unavailable for c in after_specs), default=1)
        changes, prefix = diff(before, after), cluster_prefix(after)
        if args.json:
            report = diff_document(changes, slots, prefix, before=before, after=after)
            print(json.dumps(report, indent=2, sort_keys=True))
        else:
            print(render_diff(changes, slots, prefix, markdown=args.markdown, before=before, after=after), end="")
        return 0
    if args.json:
        # Input key order comes from the mock engine's async serialization and differs between runs; sorting
        # makes the plan byte-identical across processes, so CI can diff it.
        document = plan_document(args.stack, recording, capacity, specs, program.project, secret_key=env_key)
        print(json.dumps(document, indent=2, sort_keys=True, default=str))
    else:
        print(render_text(args.stack, recording, capacity, specs), end="")
    if args.out:
        count = write_inputs(args.out, recording)
        print(f"wrote {count} input files under {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())
