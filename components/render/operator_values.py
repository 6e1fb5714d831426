"""Helm values of the GPU Operator chart as a pure, typed function of the spec. Pure.

Every path emitted here exists in the pinned chart's values.yaml or, for options the chart leaves commented
out, in the ClusterPolicy CRD's spec schema; ``tests/components/test_operator_values.py`` walks every variant
against ``../shared/reference/gpu-operator/<tag>/`` because Helm silently ignores a mistyped key. Keys the chart
no longer renders are never emitted: ``operator.defaultRuntime`` (gone from the template since early 2025) and
``driver.useOpenKernelModules`` (superseded by ``driver.kernelModuleType``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from proxmox_gpu_cluster.core.drivers import operator_driver_version
from proxmox_gpu_cluster.core.nodes import GpuNode
from proxmox_gpu_cluster.core.operator_spec import DriverUpgradeSpec, GpuOperatorSpec
from proxmox_gpu_cluster.core.spec import VgpuManagerSpec

DRA_NODE_LABEL = "nvidia.com/dra-kubelet-plugin"
"""Node label the DRA kubelet plugin selects, and the driver manager's pod-eviction label."""


def uses_mig(nodes: Sequence[GpuNode]) -> bool:
    """Whether any container node shares its GPUs with MIG."""
    return any(n.sharing == "mig" and n.workload == "container" for n in nodes)


def uses_dra(nodes: Sequence[GpuNode]) -> bool:
    """Whether any container node hands its GPUs to the DRA driver."""
    return any(n.dra and n.workload == "container" for n in nodes)


def sandbox_workloads(nodes: Sequence[GpuNode]) -> set[str]:
    """The KubeVirt workload types (``vm-passthrough``, ``vm-vgpu``) some node runs."""
    return {n.workload for n in nodes if n.workload != "container"}


def default_vgpu_config(nodes: Sequence[GpuNode]) -> str:
    """The vGPU device config for vm-vgpu nodes without ``nvidia.com/vgpu.config``: the commonest type in use.

    The operator's built-in vGPU device config names one config per vGPU type (``A10-24Q``), so a type is a
    config name; every node the stack labels gets its own type anyway."""
    types = Counter(n.vgpu_type for n in nodes if n.workload == "vm-vgpu" and n.vgpu_type)
    return min(types, key=lambda t: (-types[t], t)) if types else "default"


def upgrade_policy(upgrade: DriverUpgradeSpec) -> dict[str, Any]:
    """``driver.upgradePolicy``: the operator's upgrade controller rolls a new driver over the nodes, draining each."""
    return {
        "autoUpgrade": upgrade.auto_upgrade,
        "maxParallelUpgrades": upgrade.max_parallel_upgrades,
        "maxUnavailable": upgrade.max_unavailable,
        "waitForCompletion": {
            "timeoutSeconds": upgrade.wait_for_completion_seconds,
            "podSelector": upgrade.wait_for_completion_pod_selector,
        },
        "gpuPodDeletion": {
            "force": upgrade.gpu_pod_deletion.force,
            "timeoutSeconds": upgrade.gpu_pod_deletion.timeout_seconds,
            "deleteEmptyDir": upgrade.gpu_pod_deletion.delete_empty_dir,
        },
        "drain": {
            "enable": upgrade.drain.enable,
            "force": upgrade.drain.force,
            "timeoutSeconds": upgrade.drain.timeout_seconds,
            "deleteEmptyDir": upgrade.drain.delete_empty_dir,
        },
    }


def operator_values(
    op: GpuOperatorSpec,
    nodes: Sequence[GpuNode],
    *,
    vgpu_manager: VgpuManagerSpec | None = None,
    device_plugin_config: str | None = None,
    device_plugin_default: str | None = None,
    mig_config: str | None = None,
    dcgm_metrics_config: str | None = None,
) -> dict[str, Any]:
    """Values for ``gpu-operator`` at ``op.chart_version`` for the GPU ``nodes`` of the cluster.

    The ConfigMap names come from the sharing and monitoring components (content-addressed), so a content
    change changes these values and rolls the affected daemonsets.
    """
    host_driver = op.driver_mode == "host"
    values: dict[str, Any] = {
        "nfd": {"enabled": op.nfd},
        # Always explicit, the chart's own default unless the spec says otherwise (GpuOperatorSpec.cdi_enabled).
        # In host mode the default is off: with cdi.enabled the device plugin hands out devices as CDI names
        # (DEVICE_LIST_STRATEGY cdi-annotations,cdi-cri, gpu-operator controllers/object_controls.go) that
        # containerd itself must resolve, and only the operator's toolkit container, disabled in host mode,
        # turns on containerd's CDI support (enable_cdi, off by default before containerd 2.0).
        "cdi": {"enabled": op.cdi_enabled},
        "mig": {"strategy": op.mig_strategy},
        "driver": {"enabled": not host_driver},
        "toolkit": {"enabled": not host_driver},
        "dcgmExporter": {"enabled": op.dcgm},
        "migManager": {"enabled": uses_mig(nodes)},
    }
    if not host_driver:
        values["driver"]["kernelModuleType"] = op.kernel_module_type
        # Always explicit (validation guarantees one): the chart's default driver changes with the chart.
        version = operator_driver_version(op.driver_branch, op.driver_version)
        if version is not None:
            values["driver"]["version"] = version
        values["driver"]["upgradePolicy"] = upgrade_policy(op.driver_upgrade)
    if device_plugin_config is not None:
        values["devicePlugin"] = {
            "config": {"name": device_plugin_config, "default": device_plugin_default or "", "create": False}
        }
    if mig_config is not None and uses_mig(nodes):
        values["migManager"]["config"] = {"name": mig_config, "create": False, "default": "all-disabled"}
    if op.dcgm:
        # Always explicit: the chart's default flipped from false (v25.10.1) to true (v26.7.0), and with
        # monitoring.prometheus the GpuMonitoring component owns the ServiceMonitor; two would scrape twice.
        values["dcgmExporter"]["serviceMonitor"] = {"enabled": False}
        if dcgm_metrics_config is not None:
            values["dcgmExporter"]["config"] = {"name": dcgm_metrics_config}
    sandbox = sandbox_workloads(nodes)
    if sandbox:
        # Nodes choose their operands by the nvidia.com/gpu.workload.config label (every worker gets one);
        # unlabelled nodes stay container nodes. vfio-manager binds passthrough GPUs to vfio-pci, the sandbox
        # device plugin advertises them (and vGPUs) to KubeVirt, vgpu-device-manager creates the vGPU types.
        values["sandboxWorkloads"] = {"enabled": True, "defaultWorkload": "container"}
        values["vfioManager"] = {"enabled": "vm-passthrough" in sandbox}
        values["sandboxDevicePlugin"] = {"enabled": True}
        values["vgpuDeviceManager"] = {"enabled": "vm-vgpu" in sandbox}
        manager = vgpu_manager
        if manager is not None:  # validation: set exactly when some node runs vm-vgpu
            # The vGPU Manager (host driver) image is private: NVIDIA licenses it and users build and push it.
            values["vgpuManager"] = {
                "enabled": True,
                "repository": manager.repository,
                "image": manager.image,
                "version": manager.version,
                "imagePullSecrets": [manager.pull_secret],
            }
            # name "" keeps the operator's built-in config, which has one entry per vGPU type.
            values["vgpuDeviceManager"]["config"] = {"name": "", "default": default_vgpu_config(nodes)}
    if uses_dra(nodes):
        containers = [n for n in nodes if n.workload == "container"]
        if all(n.dra for n in containers):
            # No node needs the device plugin (NVIDIA's documented DRA install); mixed clusters switch it off
            # per node with the nvidia.com/gpu.deploy.device-plugin=false label instead.
            values["devicePlugin"] = {**values.get("devicePlugin", {}), "enabled": False}
        if not host_driver:
            # Let the driver manager evict DRA-driver pods (not only device-plugin pods) on driver upgrades.
            eviction = {"name": "NODE_LABEL_FOR_GPU_POD_EVICTION", "value": DRA_NODE_LABEL}
            values["driver"]["manager"] = {"env": [eviction]}
    return values


def dra_values(driver_mode: str) -> dict[str, Any]:
    """Values for the ``nvidia-dra-driver-gpu`` chart (tests check every key against the chart's values.yaml);
    ``driver_mode`` is the operator's (``host``: the driver is installed on the node itself)."""
    return {
        # Where the driver's files are: the host's root for a host-installed driver, the driver container's
        # mount otherwise (values.yaml of nvidia-dra-driver-gpu).
        "nvidiaDriverRoot": "/" if driver_mode == "host" else "/run/nvidia/driver",
        # GPU allocation through DRA is gated behind this override in the 25.x charts.
        "gpuResourcesEnabledOverride": True,
        # ComputeDomains serve multi-node NVLink (GB200 NVL); a Proxmox passthrough worker has none.
        "resources": {"gpus": {"enabled": True}, "computeDomains": {"enabled": False}},
        "kubeletPlugin": {
            "nodeSelector": {DRA_NODE_LABEL: "true"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
