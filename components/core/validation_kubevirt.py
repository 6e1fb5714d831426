"""Cross-field rules about KubeVirt workloads: VM workers, bare-metal KubeVirt nodes, vGPU types and the vGPU
Manager image. Pure; part of the rules ``components.validation.cross_check`` runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from proxmox_gpu_cluster.core.catalog import CATALOG, GpuModel
from proxmox_gpu_cluster.core.errors import Problem
from proxmox_gpu_cluster.core.inventory import find_host_gpu
from proxmox_gpu_cluster.core.vgpu import cloud_image_release, vgpu_path_problems

if TYPE_CHECKING:
    # Types only: the spec module runs the cross-field validation, which imports this module.
    from proxmox_gpu_cluster.core.spec import ClusterSpec, Worker


def vm_worker_problems(spec: ClusterSpec, i: int, w: Worker) -> list[Problem]:
    """Problems of a vm-passthrough or vm-vgpu worker."""
    return [*_vm_workload(spec, i, w), *_vgpu(spec, i, w)]


def _vm_workload(spec: ClusterSpec, i: int, w: Worker) -> list[Problem]:
    """KubeVirt workers hand whole GPUs (or vGPUs) to VMs: no container-side sharing applies."""
    at = f"workers[{i}]"
    out: list[Problem] = []
    if not spec.kubevirt.enabled:
        out.append(Problem(f"{at}.workload", f"{w.workload} needs kubevirt.enabled: true"))
    uses_mig = w.sharing == "mig" or w.mig is not None or any(c.mig is not None for c in w.gpus)
    if w.workload == "vm-vgpu" and uses_mig:
        out.append(
            Problem(
                f"{at}.sharing",
                "MIG-backed vGPU is not supported; vm-vgpu uses time-sliced vGPU types on whole GPUs",
            )
        )
    elif uses_mig or w.sharing != "none" or w.time_slicing is not None:
        out.append(
            Problem(
                f"{at}.sharing",
                f"{w.workload} hands GPUs to VMs, so MIG and time-slicing do not "
                f"apply; use sharing: none and no mig/timeSlicing",
            )
        )
    return out


def _vgpu(spec: ClusterSpec, i: int, w: Worker) -> list[Problem]:
    at = f"workers[{i}].vgpuType"
    if w.workload != "vm-vgpu":
        return [Problem(at, "only applies to vm-vgpu workers")] if w.vgpu_type else []
    if w.vgpu_type is None:
        return [Problem(at, "required for vm-vgpu workers (e.g. A10-24Q)")]
    models = [CATALOG[h.model] for c in w.gpus if (h := find_host_gpu(spec, w.node, c.ref)) is not None]
    # The guest's release decides mdev vs the vendor-specific VFIO framework (core/vgpu.py); a template or a URL
    # that names no release is left to the verify step, which checks the running kernel.
    release = cloud_image_release(w.image.cloud_image_url)
    return [
        *(Problem(at, m) for m in vgpu_type_problems(w.vgpu_type, models)),
        *(Problem(f"workers[{i}].image.cloudImageUrl", m) for m in vgpu_path_problems(release, models)),
    ]


def vgpu_type_problems(vgpu_type: str, models: Iterable[GpuModel]) -> list[str]:
    """Why ``vgpu_type`` cannot be created on every one of ``models`` (empty when it can)."""
    board, rest = vgpu_type.rsplit("-", 1)
    size_gb = int(rest[:-1])
    out: set[str] = set()
    for model in models:
        fb_gb = model.memory_mib // 1024
        if model.vgpu_board is None:
            out.add(f"no vGPU types are known for {model.key}")
        elif board != model.vgpu_board:
            out.add(f"{vgpu_type} is not a {model.key} vGPU type ({model.vgpu_board}-<GB><series>)")
        elif size_gb < 1 or fb_gb % size_gb:
            out.add(f"{vgpu_type}: {size_gb} GB does not divide the {fb_gb} GB of a {model.key}")
    return sorted(out)


def kubevirt_problems(spec: ClusterSpec) -> list[Problem]:
    """Bare-metal KubeVirt nodes, the vGPU manager image and what KubeVirt needs from the rest of the spec."""
    kv = spec.kubevirt
    out: list[Problem] = []
    workloads = [(f"workers[{i}]", w.workload) for i, w in enumerate(spec.workers) if w.workload != "container"]
    if kv.nodes and not kv.enabled:
        out.append(Problem("kubevirt.nodes", "KubeVirt nodes need kubevirt.enabled: true"))
    owner = {w.name: (f"workers[{i}]", w.workload) for i, w in enumerate(spec.workers)}
    for i, node in enumerate(kv.nodes):
        at = f"kubevirt.nodes[{i}]"
        workloads.append((at, node.workload))
        if node.name in owner:
            first, workload = owner[node.name]
            why = (
                f"node {node.name!r} already runs {workload} ({first}); a node runs one workload type"
                if workload != node.workload
                else f"node {node.name!r} is already {first}"
            )
            out.append(Problem(f"{at}.name", why))
        else:
            owner[node.name] = (at, node.workload)
        if node.workload != "vm-vgpu":
            if node.vgpu_type is not None:
                out.append(Problem(f"{at}.vgpuType", "only applies to vm-vgpu nodes"))
        elif node.vgpu_type is None:
            out.append(Problem(f"{at}.vgpuType", "required for vm-vgpu nodes (e.g. A10-24Q)"))
        else:
            models = [CATALOG[key] for key in node.gpus]
            out.extend(Problem(f"{at}.vgpuType", m) for m in vgpu_type_problems(node.vgpu_type, models))
    vgpu = [at for at, workload in workloads if workload == "vm-vgpu"]
    if vgpu and kv.vgpu_manager is None:
        out.append(Problem("kubevirt.vgpuManager", f"required: {vgpu[0]} runs vm-vgpu (the vGPU Manager image)"))
    if kv.vgpu_manager is not None and not vgpu:
        out.append(Problem("kubevirt.vgpuManager", "only applies when a worker or kubevirt node runs vm-vgpu"))
    if kv.enabled and not workloads:
        out.append(Problem("kubevirt.enabled", "no worker or kubevirt.nodes entry runs vm-passthrough or vm-vgpu"))
    if kv.enabled and workloads and not spec.gpu_operator.enabled:
        out.append(
            Problem(
                "gpuOperator.enabled",
                f"{workloads[0][0]} runs {workloads[0][1]}, which needs the GPU Operator's sandbox device plugin",
            )
        )
    return out
