"""Rules that relate several parts of the spec. Each returns problems; ``cross_check`` runs them all. Pure.

Field-level rules (types, patterns, ranges, unknown keys) are checked by pydantic first and reported together;
these run once every field is well-formed, and all of their problems are reported together too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxmox_gpu_cluster.core.capacity import cluster_capacity, smoke_test_resource
from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.drivers import OPERATOR_DRIVER_VERSIONS, operator_driver_version
from proxmox_gpu_cluster.core.errors import Problem
from proxmox_gpu_cluster.core.inventory import effective_mig, find_host_gpu, worker_gpus
from proxmox_gpu_cluster.core.mig import mig_config_problems
from proxmox_gpu_cluster.core.validation_hosts import host_problems
from proxmox_gpu_cluster.core.validation_kubevirt import kubevirt_problems, vm_worker_problems
from proxmox_gpu_cluster.core.validation_operator import driver_branch_problems, operator_problems
from proxmox_gpu_cluster.core.validation_scheduling import (
    dupes as _dupes,
)
from proxmox_gpu_cluster.core.validation_scheduling import (
    priority_class_problems,
    quota_capacity_problems,
    quota_problems,
)

if TYPE_CHECKING:
    # Types only: the spec module runs the cross-field validation, which imports this module.
    from proxmox_gpu_cluster.core.spec import ClusterSpec, Worker

MAX_HOSTPCI = 16
"""Proxmox VE offers hostpci0..hostpci15 per VM (qm.conf(5))."""
DRA_MIN_KUBERNETES_MINOR = 34
"""resource.k8s.io/v1 (DRA GA) is served from Kubernetes 1.34; the NVIDIA DRA driver requires it."""
DRA_MIN_DRIVER_BRANCH = 580
"""The NVIDIA DRA driver for GPUs requires driver 580 or later (NVIDIA GPU Operator DRA docs)."""

SXM_REASON = (
    "passed through to a VM without its board's NVSwitches and Fabric Manager, its NVLink fabric stays 'In "
    "Progress' and CUDA refuses to start (NVIDIA Fabric Manager User Guide; GPU Operator: fabric manager runs "
    "with the driver on the host); run the board as a bare-metal node (ExistingGpuNode) instead"
)
"""Why an SXM GPU cannot be a worker's passthrough GPU."""


def cross_check(spec: ClusterSpec) -> list[Problem]:
    """Every cross-field problem of a structurally valid spec."""
    problems = [*_duplicates(spec), *_gpu_claims(spec), *host_problems(spec)]
    for i, worker in enumerate(spec.workers):
        problems.extend(_worker(spec, i, worker))
    problems.extend(_driver_branch(spec))
    problems.extend(_operator_driver_version(spec))
    problems.extend(_operator_off(spec))
    problems.extend(operator_problems(spec))
    problems.extend(_mig_strategy(spec))
    problems.extend(_dra(spec))
    problems.extend(kubevirt_problems(spec))
    problems.extend(_drain(spec))
    if not problems:
        # Quotas and the smoke test are judged against the capacity table, which is only meaningful for an
        # otherwise valid spec.
        problems.extend(_quotas(spec))
        problems.extend(_smoke_test(spec))
    return problems


def _duplicates(spec: ClusterSpec) -> list[Problem]:
    nodes = spec.proxmox.nodes
    out = _dupes((n.name for n in nodes), "proxmox.nodes[{i}].name", "node name")
    for n_i, node in enumerate(nodes):
        base = f"proxmox.nodes[{n_i}].gpus[{{i}}]"
        out += _dupes((g.name for g in node.gpus), base + ".name", "GPU name")
        out += _dupes((g.pci_path.lower() for g in node.gpus), base + ".pciPath", "PCI path")
        if sum(g.console for g in node.gpus) > 1:
            out.append(Problem(f"proxmox.nodes[{n_i}].gpus", "at most one GPU can be the console GPU"))
    out += _dupes((w.name for w in spec.workers), "workers[{i}].name", "VM name")
    out += _dupes((w.vmid for w in spec.workers), "workers[{i}].vmid", "vmid")
    out += quota_problems(spec.quotas)
    out += priority_class_problems(spec.priority_classes)
    return out


def _gpu_claims(spec: ClusterSpec) -> list[Problem]:
    """Claims must name an existing, non-console GPU on the worker's node, each GPU claimed once."""
    out: list[Problem] = []
    known_nodes = [n.name for n in spec.proxmox.nodes]
    owner: dict[tuple[str, str], str] = {}
    for i, w in enumerate(spec.workers):
        if w.node not in known_nodes:
            out.append(
                Problem(
                    f"workers[{i}].node",
                    f"Proxmox node {w.node!r} is not defined (known: {', '.join(known_nodes)})",
                )
            )
            continue
        if len(w.gpus) > MAX_HOSTPCI:
            out.append(
                Problem(
                    f"workers[{i}].gpus",
                    f"{len(w.gpus)} GPUs, but a Proxmox VM has at most {MAX_HOSTPCI} hostpci devices",
                )
            )
        for j, claim in enumerate(w.gpus):
            path = f"workers[{i}].gpus[{j}].ref"
            host = find_host_gpu(spec, w.node, claim.ref)
            if host is None:
                names = ", ".join(g.name for g in spec.node(w.node).gpus) or "none"
                out.append(Problem(path, f"no GPU {claim.ref!r} on Proxmox node {w.node!r} (known: {names})"))
                continue
            if CATALOG[host.model].sxm:
                out.append(Problem(path, f"GPU {w.node}/{claim.ref} is an {host.model}, an SXM module: {SXM_REASON}"))
            if host.console:
                out.append(
                    Problem(
                        path,
                        f"GPU {w.node}/{claim.ref} is the host console GPU and cannot be passed "
                        "through; drop console: true only if the host has another display",
                    )
                )
            key = (w.node, claim.ref)
            if key in owner:
                out.append(Problem(path, f"GPU {w.node}/{claim.ref} is assigned twice (also {owner[key]})"))
            else:
                owner[key] = f"workers[{i}].gpus[{j}]"
    return out


def _worker(spec: ClusterSpec, i: int, w: Worker) -> list[Problem]:
    at = f"workers[{i}]"
    out: list[Problem] = []
    if w.workload != "container":
        return vm_worker_problems(spec, i, w)
    if w.vgpu_type is not None:
        out.append(Problem(f"{at}.vgpuType", "only applies to vm-vgpu workers"))
    if w.sharing == "time-slicing" and w.time_slicing is None:
        out.append(Problem(f"{at}.timeSlicing", "required when sharing is time-slicing"))
    if w.time_slicing is not None and w.sharing == "none":
        out.append(Problem(f"{at}.timeSlicing", "only applies when sharing is time-slicing or mig"))
    if w.sharing != "mig" and w.mig is not None:
        out.append(Problem(f"{at}.mig", f"only applies when sharing is mig (sharing is {w.sharing})"))
    if w.sharing == "mig" and spec.gpu_operator.mig_strategy == "none":
        out.append(Problem(f"{at}.sharing", "MIG sharing needs gpuOperator.migStrategy single or mixed (is none)"))
    if w.node in {n.name for n in spec.proxmox.nodes}:
        out.extend(_gpu_mig(spec, i, w))
    return out


def _gpu_mig(spec: ClusterSpec, i: int, w: Worker) -> list[Problem]:
    out: list[Problem] = []
    for j, claim in enumerate(w.gpus):
        host = find_host_gpu(spec, w.node, claim.ref)
        if host is None:
            continue
        path = f"workers[{i}].gpus[{j}].mig"
        model = CATALOG[host.model]
        config = effective_mig(w, claim)
        inherited = " (from the worker's mig)" if claim.mig is None else ""
        if config is not None and not model.mig_capable:
            out.append(Problem(path, f"{model.key} does not support MIG{inherited}"))
        elif claim.mig is not None and w.sharing != "mig":
            out.append(Problem(path, f"only applies when sharing is mig (sharing is {w.sharing})"))
        elif w.sharing == "mig" and config is None:
            out.append(
                Problem(path, "sharing is mig but this GPU has no MIG config; set it here or in the worker's mig")
            )
        elif w.sharing == "mig" and config is not None:
            out.extend(Problem(path, m + inherited) for m in mig_config_problems(model, config))
    return out


def _drain(spec: ClusterSpec) -> list[Problem]:
    """A slot must outlive the drain it is taken for: once expired, another node's run may take it over while this
    node is still draining (its cordon protects it only once it is marked), and two nodes would be out at once."""
    drain = spec.kubernetes.drain
    if drain.slot_lease_seconds > drain.timeout_seconds:
        return []
    return [Problem("kubernetes.drain.slotLeaseSeconds",
                    f"must exceed timeoutSeconds ({drain.timeout_seconds}): a slot that expires mid-drain can be "
                    f"taken by another node, got {drain.slot_lease_seconds}")]  # fmt: skip


def _operator_driver_version(spec: ClusterSpec) -> list[Problem]:
    """In operator mode the driver version is always explicit: pinned, or the branch's tested version."""
    op = spec.gpu_operator
    if op.driver_mode != "operator" or operator_driver_version(op.driver_branch, op.driver_version) is not None:
        return []
    known = ", ".join(f"{b} ({v})" for b, v in OPERATOR_DRIVER_VERSIONS.items())
    return [
        Problem(
            "gpuOperator.driverVersion",
            f"branch {op.driver_branch} has no tested driver version here (known: {known}); pin one, e.g. "
            f"{op.driver_branch}.xx.yy, so a chart bump never changes the driver",
        )
    ]


def _driver_branch(spec: ClusterSpec) -> list[Problem]:
    """The driver branch must know every GPU model a container worker runs (KubeVirt workers hand GPUs to VMs)."""
    nodes = [
        (f"workers[{i}]", [g.model for g in worker_gpus(spec, worker)])
        for i, worker in enumerate(spec.workers)
        if worker.workload == "container" and worker.node in {n.name for n in spec.proxmox.nodes}
    ]
    op = spec.gpu_operator
    return driver_branch_problems(
        op.driver_branch,
        op.kernel_module_type,
        nodes,
        branch_at="gpuOperator.driverBranch",
        modules_at="gpuOperator.kernelModuleType",
    )


def _operator_off(spec: ClusterSpec) -> list[Problem]:
    """Time-slicing and MIG are configured through the operator's device plugin and MIG manager, which the stack
    installs only with the operator; refuse them rather than count resources nothing will create. A taint needs no
    operator and is still applied."""
    if spec.gpu_operator.enabled:
        return []
    return [
        Problem(
            f"workers[{i}].sharing",
            f"{w.sharing} is applied by the GPU Operator, which gpuOperator.enabled: false does not install",
        )
        for i, w in enumerate(spec.workers)
        if w.sharing != "none"
    ]


def _mig_strategy(spec: ClusterSpec) -> list[Problem]:
    """Under the single strategy every GPU of a node must be split into one profile only."""
    if spec.gpu_operator.mig_strategy != "single":
        return []
    out: list[Problem] = []
    for i, w in enumerate(spec.workers):
        if w.sharing != "mig" or w.node not in {n.name for n in spec.proxmox.nodes}:
            continue
        profiles: set[str] = set()
        for g in worker_gpus(spec, w):
            geometry = g.mig_geometry
            profiles.update(geometry if geometry else ["MIG disabled"])
        if len(profiles) > 1:
            out.append(
                Problem(
                    f"workers[{i}].mig",
                    "migStrategy single needs one MIG profile across the node's "
                    f"GPUs, got {', '.join(sorted(profiles))}; use mixed",
                )
            )
    return out


def _quotas(spec: ClusterSpec) -> list[Problem]:
    declared = {c.name for c in spec.priority_classes}
    return quota_capacity_problems(spec.quotas, cluster_capacity(spec), declared)


def _dra(spec: ClusterSpec) -> list[Problem]:
    """DRA needs Kubernetes 1.34 (resource.k8s.io/v1) and driver branch 580; it replaces the device plugin."""
    dra = [i for i, w in enumerate(spec.workers) if w.dra]
    if not dra:
        return []
    first = f"workers[{dra[0]}].dra"
    out: list[Problem] = []
    if spec.kubernetes.minor < DRA_MIN_KUBERNETES_MINOR:
        out.append(
            Problem(
                "kubernetes.version", f"DRA ({first}) needs Kubernetes 1.34 or later (is {spec.kubernetes.version})"
            )
        )
    branch = spec.gpu_operator.driver_branch
    if int(branch) < DRA_MIN_DRIVER_BRANCH:
        out.append(Problem("gpuOperator.driverBranch", f"DRA ({first}) needs driver branch 580 or later (is {branch})"))
    for i in dra:
        w = spec.workers[i]
        if w.workload != "container":
            out.append(
                Problem(f"workers[{i}].dra", f"DRA serves containers; {w.workload} nodes use the sandbox plugins")
            )
        elif w.sharing == "time-slicing":
            out.append(
                Problem(
                    f"workers[{i}].sharing",
                    "time-slicing configures the device plugin, which DRA nodes do not run; use MIG or DRA claims",
                )
            )
    return out


def _smoke_test(spec: ClusterSpec) -> list[Problem]:
    if spec.gpu_operator.smoke_test.enabled and smoke_test_resource(spec) is None:
        return [
            Problem(
                "gpuOperator.smokeTest.enabled",
                "no worker advertises a container GPU resource the smoke-test Job could request",
            )
        ]
    return []
