"""GPU sharing configuration as data: device-plugin (time-slicing) and mig-parted ConfigMaps. Pure.

Both ConfigMaps are content-addressed: their name carries a hash of their data. The device plugin does not
notice edits to an existing ConfigMap (NVIDIA/gpu-operator#1144), so a change must produce a new ConfigMap
name; the name then flows into the operator's Helm values and rolls the plugin.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import yaml

from proxmox_gpu_cluster.core.capacity import node_capacity
from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.names import short_hash
from proxmox_gpu_cluster.core.nodes import GpuNode
from proxmox_gpu_cluster.render.operator_values import DRA_NODE_LABEL

DEFAULT_DEVICE_PLUGIN_CONFIG = "default"
MIG_DISABLED = "all-disabled"


def content_hash(data: Mapping[str, str], length: int = 10) -> str:
    """A short, stable hash of ConfigMap data."""
    return short_hash(json.dumps(dict(data), sort_keys=True, separators=(",", ":")), length)


def content_name(base: str, data: Mapping[str, str]) -> str:
    """``<base>-<hash>``: a ConfigMap name that changes whenever the data does."""
    return f"{base}-{content_hash(data)}"


_DUMPED: dict[str, str] = {}
"""YAML of the documents dumped so far, by ``repr``: every worker of a profile renders the same document."""


def _dump(document: object) -> str:
    # repr tells apart what YAML would (tuples, ints and floats, True and 1) and follows the keys' order, as the
    # dump does (sort_keys=False); the documents are small, their number is that of distinct profiles.
    key = repr(document)
    text = _DUMPED.get(key)
    if text is None:
        if len(_DUMPED) >= 1024:
            _DUMPED.clear()
        text = _DUMPED[key] = yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
    return text


@dataclass(frozen=True)
class DevicePluginConfig:
    """Data of the device-plugin ConfigMap and which named config each worker uses."""

    data: dict[str, str]
    """Config name -> device-plugin config file (``version: v1``)."""
    node_config: dict[str, str]
    """Node name -> config name (the ``nvidia.com/device-plugin.config`` label)."""
    default: str = DEFAULT_DEVICE_PLUGIN_CONFIG
    """Config used by GPU nodes without the label (``devicePlugin.config.default``)."""

    @property
    def name(self) -> str:
        """Content-addressed ConfigMap name."""
        return content_name("device-plugin-config", self.data)


def _time_slicing_entry(node: GpuNode, mig_strategy: str) -> tuple[str, str] | None:
    ts = node.time_slicing
    if ts is None or node.workload != "container":
        return None
    # Which resources to replicate: what the node advertises before time-slicing multiplies it.
    plain = node_capacity(replace(node, time_slicing=None), mig_strategy).resources
    resources = [{"name": name, "replicas": ts.replicas} for name in sorted(plain)]
    document = {
        "version": "v1",
        "flags": {"migStrategy": mig_strategy},
        "sharing": {
            "timeSlicing": {
                "renameByDefault": ts.rename_by_default,
                "failRequestsGreaterThanOne": ts.fail_requests_greater_than_one,
                "resources": resources,
            }
        },
    }
    text = _dump(document)
    # A readable name, plus a content hash so different resource lists never share a name.
    name = f"time-slicing-{ts.replicas}-{short_hash(text, 8)}"
    return name, text


def device_plugin_config(nodes: Sequence[GpuNode], mig_strategy: str) -> DevicePluginConfig:
    """One named config per distinct time-slicing profile, plus the default (no sharing)."""
    data = {DEFAULT_DEVICE_PLUGIN_CONFIG: _dump({"version": "v1", "flags": {"migStrategy": mig_strategy}})}
    node_config: dict[str, str] = {}
    for node in nodes:
        entry = _time_slicing_entry(node, mig_strategy)
        if entry is None:
            if node.workload == "container":
                node_config[node.name] = DEFAULT_DEVICE_PLUGIN_CONFIG
            continue
        name, text = entry
        data[name] = text
        node_config[node.name] = name
    return DevicePluginConfig(data=dict(sorted(data.items())), node_config=node_config)


@dataclass(frozen=True)
class MigConfig:
    """The mig-parted configuration the MIG manager applies, and each worker's ``nvidia.com/mig.config``."""

    node_config: dict[str, str]
    """Node name -> config name, for container nodes with MIG-capable GPUs."""
    configs: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    """Config name -> mig-parted entries; empty when only the operator's built-in configs are used."""

    @property
    def custom(self) -> bool:
        """Whether a custom ConfigMap is needed (a geometry the operator's defaults do not name)."""
        return any(name.startswith("custom-") for name in self.configs)

    @property
    def data(self) -> dict[str, str]:
        """ConfigMap data (key ``config.yaml``), the format of the operator's default-mig-parted-config."""
        return {"config.yaml": _dump({"version": "v1", "mig-configs": self.configs})}

    @property
    def name(self) -> str:
        """Content-addressed ConfigMap name."""
        return content_name("mig-parted-config", self.data)


def _filter(model_keys: set[str]) -> list[str]:
    # mig-parted matches "0x<device><vendor>" in upper case, as the operator's defaults write it.
    return sorted(f"0x{d.upper()}10DE" for k in model_keys for d in CATALOG[k].device_ids)


def mig_config(nodes: Sequence[GpuNode]) -> MigConfig:
    """Named configs are used by name; custom geometries become ``custom-<hash>`` configs.

    A custom ConfigMap replaces the operator's default one, so it also carries ``all-disabled`` (the MIG
    manager's default) and every named config the spec uses, rendered from the catalog for the models in use.
    """
    node_config: dict[str, str] = {}
    custom: dict[str, list[dict[str, object]]] = {}
    named_used: dict[str, set[str]] = {MIG_DISABLED: set()}
    for node in nodes:
        gpus = [g for g in node.gpus if g.model.mig_capable]
        if not gpus or node.workload != "container":
            continue
        claimed = [g.mig_config for g in gpus if g.mig_config is not None]
        named = {c for c in claimed if isinstance(c, str)}
        if node.sharing != "mig" or not claimed:
            node_config[node.name] = MIG_DISABLED
            named_used[MIG_DISABLED].update(g.model.key for g in gpus)
        elif len(named) == 1 and len(claimed) == len(gpus):
            name = named.pop()
            node_config[node.name] = name
            named_used.setdefault(name, set()).update(g.model.key for g in gpus)
        else:
            entries: list[dict[str, object]] = []
            for g in gpus:
                geometry = g.mig_geometry or {}
                # The guest enumerates the passed-through GPUs in hostpci order, which is the spec's order.
                entries.append(
                    {"devices": [g.index], "mig-enabled": bool(geometry), "mig-devices": dict(sorted(geometry.items()))}
                )
            name = f"custom-{content_hash({'e': json.dumps(entries, sort_keys=True)}, 8)}"
            custom[name] = entries
            node_config[node.name] = name
    if not custom:
        return MigConfig(node_config=node_config)
    configs: dict[str, list[dict[str, object]]] = {}
    for name, models in sorted(named_used.items()):
        if name == MIG_DISABLED:
            configs[name] = [{"devices": "all", "mig-enabled": False}]
            continue
        configs[name] = [
            {
                "device-filter": _filter({key}),
                "devices": "all",
                "mig-enabled": True,
                "mig-devices": CATALOG[key].named_mig_configs()[name],
            }
            for key in sorted(models)
        ]
    configs.update(sorted(custom.items()))
    return MigConfig(node_config=node_config, configs=configs)


ACCELERATOR_LABEL = "proxmox-gpu-cluster.io/accelerator"


def node_labels(node: GpuNode, dp: DevicePluginConfig, mig: MigConfig, operator: bool = True) -> dict[str, str]:
    """Labels a GPU node gets before the operator is installed.

    ``dp`` and ``mig`` are ``device_plugin_config`` and ``mig_config`` of all nodes, computed once per cluster.

    ``nvidia.com/mig.config`` is set on every node with a MIG-capable GPU: without it the operator labels the
    node ``all-disabled`` itself, which would fight any later change (hence patchForce on the NodePatch).

    Without the operator (``operator`` false: ``gpuOperator.enabled: false``) only the accelerator label (and
    DRA's) is set on container nodes: the operator's config labels would configure an operator the stack does not
    own. Validation refuses time-slicing and MIG there; a taint is still applied.
    """
    models = [m.key for m in node.models]
    if not operator and node.workload == "container":
        labels = {k: v for k, v in _workload_labels(node.workload, models, None).items() if k == ACCELERATOR_LABEL}
        if node.dra:
            labels[DRA_NODE_LABEL] = "true"
        return dict(sorted(labels.items()))
    labels = _workload_labels(node.workload, models, node.vgpu_type)
    if node.workload == "container" and node.dra:
        # The DRA kubelet plugin runs where this label is; the operator skips its device plugin where the
        # deploy label is false (operands are switched per node by nvidia.com/gpu.deploy.<operand>).
        labels[DRA_NODE_LABEL] = "true"
        labels["nvidia.com/gpu.deploy.device-plugin"] = "false"
    elif node.workload == "container":
        labels["nvidia.com/device-plugin.config"] = dp.node_config[node.name]
    if node.workload == "container":
        mig_label = mig.node_config.get(node.name)
        if mig_label is not None:
            labels["nvidia.com/mig.config"] = mig_label
    return dict(sorted(labels.items()))


def _workload_labels(workload: str, models: list[str], vgpu_type: str | None) -> dict[str, str]:
    """The operand-selecting workload label, the node's commonest GPU model and, for vm-vgpu, its vGPU type."""
    labels = {"nvidia.com/gpu.workload.config": workload}
    if models:
        labels[ACCELERATOR_LABEL] = max(sorted(set(models)), key=models.count)
    if workload == "vm-vgpu" and vgpu_type is not None:
        # vgpu-device-manager creates this vGPU type on every GPU of the node (its configs are named by type).
        labels["nvidia.com/vgpu.config"] = vgpu_type
    return labels
