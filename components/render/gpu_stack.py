"""The GPU software stack of a set of nodes, computed once: sharing ConfigMaps, node labels, operator values and
capacity. Pure.

``GpuNodeLabels`` and ``GpuOperator`` both take the same ``GpuStack``, so the device-plugin and MIG configuration
(and the labels that name them) are computed once and can never disagree.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from proxmox_gpu_cluster.core.capacity import WorkerCapacity, node_capacity
from proxmox_gpu_cluster.core.errors import Problem
from proxmox_gpu_cluster.core.nodes import GpuNode
from proxmox_gpu_cluster.core.operator_spec import GpuOperatorSpec
from proxmox_gpu_cluster.core.spec import VgpuManagerSpec
from proxmox_gpu_cluster.render.operator_values import operator_values, uses_dra
from proxmox_gpu_cluster.render.sharing import (
    DevicePluginConfig,
    MigConfig,
    device_plugin_config,
    mig_config,
    node_labels,
)


@dataclass(frozen=True)
class GpuStack:
    """The operator settings and the GPU nodes they serve."""

    operator: GpuOperatorSpec
    """The GPU Operator section (chart, driver mode, MIG strategy, DCGM, ...)."""
    nodes: tuple[GpuNode, ...]
    """Every GPU node the stack labels and configures."""
    vgpu_manager: VgpuManagerSpec | None = None
    """The private vGPU Manager image, when a node runs vm-vgpu."""

    def problems(self) -> list[Problem]:
        """What makes this stack unusable (for callers that build it by hand; the cluster spec checks more)."""
        out: list[Problem] = []
        names = Counter(n.name for n in self.nodes)
        out += [Problem("nodes", f"node {name} is listed {count} times") for name, count in names.items() if count > 1]
        if not self.operator.enabled:
            shared = [n.name for n in self.nodes if n.sharing != "none"]
            if shared:
                out.append(Problem("nodes", f"sharing needs the GPU Operator (enabled: false): {', '.join(shared)}"))
        if any(n.workload == "vm-vgpu" for n in self.nodes) and self.vgpu_manager is None:
            out.append(Problem("vgpuManager", "a vm-vgpu node needs the vGPU Manager image"))
        return out

    @cached_property
    def device_plugin(self) -> DevicePluginConfig:
        """The device-plugin ConfigMap (time-slicing profiles) and each container node's config name."""
        return device_plugin_config(self.nodes, self.operator.mig_strategy)

    @cached_property
    def mig(self) -> MigConfig:
        """The mig-parted configuration and each MIG-capable node's config name."""
        return mig_config(self.nodes)

    @cached_property
    def labels(self) -> dict[str, dict[str, str]]:
        """Node name -> the labels it gets before the operator is installed."""
        return {n.name: node_labels(n, self.device_plugin, self.mig, self.operator.enabled) for n in self.nodes}

    @property
    def uses_dra(self) -> bool:
        """Whether any container node allocates its GPUs with the DRA driver."""
        return uses_dra(self.nodes)

    def capacity(self) -> list[WorkerCapacity]:
        """What each node will advertise, in node order."""
        return [node_capacity(n, self.operator.mig_strategy) for n in self.nodes]

    def values(
        self,
        *,
        device_plugin_config: str | None = None,
        mig_config: str | None = None,
        dcgm_metrics_config: str | None = None,
    ) -> dict[str, Any]:
        """The operator's Helm values, given the names of the ConfigMaps it reads."""
        return operator_values(
            self.operator,
            self.nodes,
            vgpu_manager=self.vgpu_manager,
            device_plugin_config=device_plugin_config,
            device_plugin_default=self.device_plugin.default if device_plugin_config is not None else None,
            mig_config=mig_config,
            dcgm_metrics_config=dcgm_metrics_config,
        )
