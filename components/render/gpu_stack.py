"""The GPU software stack of a set of nodes, computed once: sharing ConfigMaps, node labels, operator values and
capacity. Pure.

``GpuNodeLabels`` and ``GpuOperator`` both take the same ``GpuStack``, so the device-plugin and MIG configuration
(and the labels that name them) are computed once and can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any

from pydantic import BeforeValidator, SkipValidation

from proxmox_gpu_cluster.core.capacity import WorkerCapacity, node_capacity
from proxmox_gpu_cluster.core.errors import Problem, invalid_spec_model
from proxmox_gpu_cluster.core.nodes import ExistingGpuNode, GpuNode, gpu_node_problems
from proxmox_gpu_cluster.core.operator_spec import GpuOperatorSpec
from proxmox_gpu_cluster.core.spec import VgpuManagerSpec
from proxmox_gpu_cluster.core.validation_operator import driver_branch_problems
from proxmox_gpu_cluster.core.validation_scheduling import dupes
from proxmox_gpu_cluster.render.operator_values import operator_values, uses_dra
from proxmox_gpu_cluster.render.sharing import (
    DevicePluginConfig,
    MigConfig,
    device_plugin_config,
    mig_config,
    node_labels,
)


def _as_tuple(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


GpuNodes = Annotated[tuple[GpuNode, ...], SkipValidation, BeforeValidator(_as_tuple)]
"""GPU nodes in a component's args: checked by ``nodes_problems`` (every rule, each problem naming its node), not
by pydantic, which would only check the outer type of each."""


@dataclass(frozen=True)
class GpuStack:
    """The operator settings and the GPU nodes they serve."""

    operator: GpuOperatorSpec
    """The GPU Operator section (chart, driver mode, MIG strategy, DCGM, ...)."""
    nodes: tuple[GpuNode, ...]
    """Every GPU node the stack labels and configures."""
    vgpu_manager: VgpuManagerSpec | None = None
    """The private vGPU Manager image, when a node runs vm-vgpu."""

    def __post_init__(self) -> None:
        # Refused where it is built: a bad node must never surface later as a KeyError or TypeError from the
        # labels, values or capacity (a forgotten .resolve(), a model key instead of a catalog entry).
        problems = self.problems()
        if problems:
            raise invalid_spec_model("GpuStack", problems)

    def problems(self) -> list[Problem]:
        """What makes this stack unusable, for callers that build it by hand (the cluster spec checks more): paths
        below the stack in field names (``nodes[1].gpus[0].mig_config``), each message naming its node. A
        ``GpuNode`` built by hand is checked as strictly as an ``ExistingGpuNode``; nothing else of the stack is
        read (labels, capacity) unless this is empty."""
        out: list[Problem] = []
        if not isinstance(self.operator, GpuOperatorSpec):
            out.append(Problem("operator", f"expected a GpuOperatorSpec, got {type(self.operator).__name__}"))
        if self.vgpu_manager is not None and not isinstance(self.vgpu_manager, VgpuManagerSpec):
            out.append(Problem("vgpu_manager", f"expected a VgpuManagerSpec, got {type(self.vgpu_manager).__name__}"))
        out += nodes_problems(self.nodes)
        if out:
            return out
        op = self.operator
        if not op.enabled:
            out += [
                Problem(
                    f"nodes[{i}].sharing",
                    f"{n.name}: sharing {n.sharing} needs the GPU Operator (operator.enabled is false)",
                )
                for i, n in enumerate(self.nodes)
                if n.sharing != "none"
            ]
        vgpu = [n.name for n in self.nodes if n.workload == "vm-vgpu"]
        if vgpu and self.vgpu_manager is None:
            out.append(Problem("vgpu_manager", f"vm-vgpu nodes ({', '.join(vgpu)}) need the vGPU Manager image"))
        out += driver_branch_problems(
            op.driver_branch,
            op.kernel_module_type,
            [(f"nodes[{i}] {n.name}", n.models) for i, n in enumerate(self.nodes) if n.workload == "container"],
            branch_at="operator.driver_branch",
            modules_at="operator.kernel_module_type",
        )
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


def nodes_problems(nodes: object, base: str = "nodes") -> list[Problem]:
    """What makes a list of GPU nodes unusable, each problem at ``<base>[i]...`` and naming its node: not a
    ``GpuNode`` (an ``ExistingGpuNode`` not resolved), the rules every node keeps (``gpu_node_problems``), a
    name listed twice."""
    if not isinstance(nodes, tuple | list):
        return [Problem(base, f"expected a tuple of GpuNode, got {type(nodes).__name__}")]
    out: list[Problem] = []
    for i, node in enumerate(nodes):
        if isinstance(node, ExistingGpuNode):
            resolve = "pass ExistingGpuNode(...).resolve(), the node as the stack sees it"
            out.append(Problem(f"{base}[{i}]", f"{node.name}: an ExistingGpuNode; {resolve}"))
        elif not isinstance(node, GpuNode):
            out.append(Problem(f"{base}[{i}]", f"expected a GpuNode, got {type(node).__name__}"))
        else:
            out += [
                Problem(_below(f"{base}[{i}]", p.path), f"{node.name}: {p.message}") for p in gpu_node_problems(node)
            ]
    if not out:
        out += dupes((n.name for n in nodes), base + "[{i}].name", "node name")
    return out


def _below(prefix: str, path: str) -> str:
    return f"{prefix}.{path}" if path and not path.startswith("[") else f"{prefix}{path}"
