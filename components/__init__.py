"""proxmox_gpu_cluster: NVIDIA GPU Kubernetes workers on Proxmox VE, and the GPU stack on top, as Pulumi components.

Layout (pure packages import nothing from Pulumi; imports point down this list):

- ``core``: the spec models, GPU catalog, validation, capacity, names (pure).
- ``render``: what goes into YAML, shell, Helm values and alerts, as data (pure).
- ``proxmox``, ``guest``, ``gpu``: the components of each layer, each on its own arguments.
- ``cluster``: ``GpuCluster``, the whole cluster of a ``ClusterSpec`` as one component.
- ``stacks``: reading a stack's config (``load``) and the offline plan (``python -m proxmox_gpu_cluster.plan``).
- ``testing``: the recording mock for unit tests of programs that use these components.

The names below are imported on first use, so importing the pure core never imports Pulumi.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxmox_gpu_cluster.cluster.gpu_cluster import GpuCluster, GpuClusterArgs, export
    from proxmox_gpu_cluster.cluster.providers import Providers, Secrets
    from proxmox_gpu_cluster.core.catalog import CATALOG, GpuModel, MigProfile
    from proxmox_gpu_cluster.core.errors import Problem, SpecError
    from proxmox_gpu_cluster.core.python_door import collect_problems
    from proxmox_gpu_cluster.core.spec import ClusterSpec, load_spec
    from proxmox_gpu_cluster.stacks.config import InvalidStackConfig, load

_WHERE = {
    "GpuCluster": "cluster.gpu_cluster", "GpuClusterArgs": "cluster.gpu_cluster", "export": "cluster.gpu_cluster",
    "Providers": "cluster.providers", "Secrets": "cluster.providers", "CATALOG": "core.catalog",
    "GpuModel": "core.catalog", "MigProfile": "core.catalog", "Problem": "core.errors", "SpecError": "core.errors",
    "ClusterSpec": "core.spec", "load_spec": "core.spec", "InvalidStackConfig": "stacks.config",
    "load": "stacks.config", "collect_problems": "core.python_door",
}  # fmt: skip
__all__ = [
    "CATALOG", "ClusterSpec", "GpuCluster", "GpuClusterArgs", "GpuModel", "InvalidStackConfig", "MigProfile",
    "Problem", "Providers", "Secrets", "SpecError", "collect_problems", "export", "load", "load_spec",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
