"""Operator Helm values: every emitted path exists in the pinned chart (values.yaml or ClusterPolicy CRD)."""

from __future__ import annotations

import functools
import itertools
from typing import Any

import pytest
import yaml

from proxmox_gpu_cluster.cluster.adapters import gpu_stack
from proxmox_gpu_cluster.core.drivers import OPERATOR_DRIVER_VERSIONS
from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.spec import ClusterSpec, load_spec
from proxmox_gpu_cluster.render.operator_values import dra_values
from proxmox_gpu_cluster.render.operator_values import operator_values as render_values
from tests.support import CHART_VERSIONS, base_spec, make_vm_worker, reference_file, shared_reference


def operator_values(spec: ClusterSpec, **names: str | None) -> dict[str, Any]:
    """The values for the spec's operator settings and nodes, through the cluster's adapter."""
    stack = gpu_stack(spec)
    return render_values(stack.operator, stack.nodes, vgpu_manager=stack.vgpu_manager, **names)  # type: ignore[arg-type]


FORBIDDEN = {"operator.defaultRuntime", "driver.useOpenKernelModules"}


def leaf_paths(values: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            out += leaf_paths(value, path)
        else:
            out.append(path)
    return out


@functools.cache
def _load(tag: str, name: str) -> Any:
    return yaml.safe_load(shared_reference(tag, name).read_text())


def chart_has(tag: str, path: str) -> bool:
    values = _load(tag, "values.yaml")
    node: Any = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            break
        node = node[part]
    else:
        return True
    crd = _load(tag, "crds/nvidia.com_clusterpolicies.yaml")
    schema: Any = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for part in path.split("."):
        schema = (schema.get("properties") or {}).get(part)
        if schema is None:
            return False
    return True


def with_dra(spec: dict[str, Any], which: str) -> None:
    """Put the first worker (``some``) or every container worker (``all``) on DRA."""
    if which == "none":
        return
    workers = spec["workers"] if which == "all" else spec["workers"][:1]
    for w in workers:
        w["dra"] = True
        if w.get("sharing") == "time-slicing":
            w.update(sharing="none", timeSlicing=None)
    if which == "all":
        spec["quotas"] = []


def variants() -> list[tuple[str, dict[str, Any], dict[str, str | None]]]:
    out = []
    for tag, mode, cdi, dcgm, nfd, strategy, names, dra in itertools.product(
        CHART_VERSIONS, ["host", "operator"], [False, True], [False, True], [False, True], ["single", "mixed"],
        [False, True], ["none", "some", "all"],
    ):  # fmt: skip
        spec = base_spec()
        spec["gpuOperator"] = {
            "chartVersion": tag, "driverMode": mode, "cdi": cdi, "dcgm": dcgm, "nfd": nfd, "migStrategy": strategy,
            "driverVersion": "580.95.05", "kernelModuleType": "open",
        }  # fmt: skip
        if strategy == "single":
            spec["workers"][1]["gpus"] = [{"ref": "a100-1", "mig": "all-3g.20gb"}]
            spec["workers"][1]["mig"] = None
            spec["quotas"] = []
        with_dra(spec, dra)
        cm = {"device_plugin_config": "dp-1", "device_plugin_default": "default", "mig_config": "mig-1",
              "dcgm_metrics_config": "metrics-1"} if names else {}  # fmt: skip
        out.append((tag, spec, cm))
    return out


def kubevirt_variants() -> list[tuple[str, dict[str, Any], dict[str, str | None]]]:
    """ts-1 (two A10s) as a vm-passthrough or vm-vgpu node, with either chart."""
    out: list[tuple[str, dict[str, Any], dict[str, str | None]]] = []
    for tag, workload in itertools.product(CHART_VERSIONS, ["vm-passthrough", "vm-vgpu"]):
        spec = base_spec()
        spec["gpuOperator"]["chartVersion"] = tag
        make_vm_worker(spec, 2, workload)
        out.append((tag, spec, {}))
    return out


VARIANTS = variants() + kubevirt_variants()


@pytest.mark.parametrize(("tag", "raw", "names"), VARIANTS)
def test_every_values_path_exists_in_the_chart(tag: str, raw: dict[str, Any], names: dict[str, str]) -> None:
    values = operator_values(load_spec(raw), **names)  # type: ignore[arg-type]
    paths = leaf_paths(values)
    assert not FORBIDDEN & set(paths)
    missing = [p for p in paths if not chart_has(tag, p)]
    assert missing == [], f"chart {tag} has no {missing}"


def test_variants_cover_the_optional_paths() -> None:
    seen = {p for _, raw, names in VARIANTS for p in leaf_paths(operator_values(load_spec(raw), **names))}  # type: ignore[arg-type]
    assert {"devicePlugin.config.name", "migManager.config.name", "dcgmExporter.config.name", "driver.version",
            "driver.kernelModuleType", "dcgmExporter.serviceMonitor.enabled", "devicePlugin.enabled",
            "driver.manager.env", "sandboxWorkloads.enabled", "sandboxWorkloads.defaultWorkload",
            "vfioManager.enabled", "sandboxDevicePlugin.enabled", "vgpuDeviceManager.enabled",
            "vgpuManager.repository", "vgpuManager.image", "vgpuManager.version", "vgpuManager.imagePullSecrets",
            "vgpuDeviceManager.config.name", "vgpuDeviceManager.config.default",
            "driver.upgradePolicy.drain.enable", "driver.upgradePolicy.maxUnavailable",
            "driver.upgradePolicy.gpuPodDeletion.timeoutSeconds"} <= seen  # fmt: skip


def test_a_mistyped_path_would_be_caught() -> None:
    assert not chart_has("v26.7.0", "devicePlugin.configs.name")
    assert not chart_has("v26.7.0", "dcgmExporter.config.nmae")
    assert chart_has("v26.7.0", "dcgmExporter.config.name")  # only in the CRD


def test_host_driver_mode() -> None:
    values = operator_values(load_spec(base_spec()), device_plugin_config="dp", device_plugin_default="default")
    assert values["driver"] == {"enabled": False}
    assert values["toolkit"] == {"enabled": False}
    assert values["cdi"] == {"enabled": False}
    assert values["mig"] == {"strategy": "mixed"}
    assert values["migManager"] == {"enabled": True}
    assert values["devicePlugin"]["config"] == {"name": "dp", "default": "default", "create": False}


def test_operator_driver_mode_pins_version() -> None:
    raw = base_spec()
    raw["gpuOperator"].update(driverMode="operator", driverVersion="580.95.05", kernelModuleType="open")
    values = operator_values(load_spec(raw))
    policy = values["driver"].pop("upgradePolicy")
    assert values["driver"] == {"enabled": True, "kernelModuleType": "open", "version": "580.95.05"}
    assert values["toolkit"] == {"enabled": True}
    # One node at a time, drained first, whatever the chart's defaults (25%, no drain)
    assert policy["maxParallelUpgrades"] == 1 and policy["maxUnavailable"] == 1 and policy["drain"]["enable"]


@pytest.mark.parametrize("branch", sorted(OPERATOR_DRIVER_VERSIONS))
def test_a_branch_resolves_to_the_same_tested_version_with_either_chart(branch: str) -> None:
    versions = set()
    for tag in CHART_VERSIONS:
        raw = base_spec()
        raw["gpuOperator"].update(driverMode="operator", driverBranch=branch, kernelModuleType="open", chartVersion=tag)
        versions.add(operator_values(load_spec(raw))["driver"]["version"])
    assert versions == {OPERATOR_DRIVER_VERSIONS[branch]}  # a chart bump never changes the driver by itself


def test_the_version_table_comes_from_the_charts_the_project_supports() -> None:
    pinned = {_load(tag, "values.yaml")["driver"]["version"] for tag in CHART_VERSIONS}
    assert set(OPERATOR_DRIVER_VERSIONS.values()) == pinned
    assert all(version.startswith(f"{branch}.") for branch, version in OPERATOR_DRIVER_VERSIONS.items())


def test_an_unknown_branch_without_a_pinned_version_is_refused() -> None:
    raw = base_spec()
    raw["gpuOperator"].update(driverMode="operator", driverBranch="570", kernelModuleType="open")
    with pytest.raises(SpecError) as err:
        load_spec(raw)
    assert any(
        line.startswith("cluster.gpuOperator.driverVersion: branch 570 has no tested driver version")
        for line in err.value.lines
    )


def test_upgrade_policy_from_the_spec() -> None:
    raw = base_spec()
    raw["gpuOperator"].update(driverMode="operator", kernelModuleType="open", driverUpgrade={
        "maxParallelUpgrades": 2, "maxUnavailable": "50%", "drain": {"timeoutSeconds": 900, "deleteEmptyDir": True},
        "gpuPodDeletion": {"force": True}, "waitForCompletionSeconds": 600,
        "waitForCompletionPodSelector": "app=training"})  # fmt: skip
    policy = operator_values(load_spec(raw))["driver"]["upgradePolicy"]
    assert policy["maxParallelUpgrades"] == 2 and policy["maxUnavailable"] == "50%"
    assert policy["drain"] == {"enable": True, "force": False, "timeoutSeconds": 900, "deleteEmptyDir": True}
    assert policy["gpuPodDeletion"]["force"] is True
    assert policy["waitForCompletion"] == {"timeoutSeconds": 600, "podSelector": "app=training"}
    assert unknown_in(policy, _load("v26.7.0", "values.yaml")["driver"]["upgradePolicy"]) == []


def test_values_are_deterministic() -> None:
    spec = load_spec(base_spec())
    assert operator_values(spec, mig_config="m") == operator_values(spec, mig_config="m")
    assert yaml.safe_dump(operator_values(spec)) == yaml.safe_dump(operator_values(load_spec(base_spec())))


def unknown_in(values: dict[str, Any], chart: Any, prefix: str = "") -> list[str]:
    """Keys of ``values`` the chart's values.yaml does not have, or whose value has another type there. An empty
    map in the chart (nodeSelector: {}) takes any keys."""
    out: list[str] = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if chart == {}:
            continue
        if not isinstance(chart, dict) or key not in chart:
            out.append(path)
        elif isinstance(value, dict) and isinstance(chart[key], dict):
            out += unknown_in(value, chart[key], path + ".")
        elif chart[key] is not None and type(value) is not type(chart[key]):
            out.append(f"{path} ({type(value).__name__}, the chart has {type(chart[key]).__name__})")
    return out


def dra_chart() -> Any:
    return yaml.safe_load(reference_file("nvidia-dra-driver-gpu", "v25.12.0", "values.yaml").read_text())


def test_dra_chart_reference_matches_the_pinned_version() -> None:
    chart = yaml.safe_load(reference_file("nvidia-dra-driver-gpu", "v25.12.0", "Chart.yaml").read_text())
    assert chart["name"] == "nvidia-dra-driver-gpu"
    assert load_spec(base_spec()).gpu_operator.dra.chart_version == "25.12.0"


def test_a_dra_typo_would_be_caught() -> None:
    chart = dra_chart()
    assert unknown_in({"kubeletPlugin": {"nodeSelectr": {"a": "b"}}}, chart) == ["kubeletPlugin.nodeSelectr"]
    assert unknown_in({"resources": {"gpus": {"enabled": "yes"}}}, chart) == [
        "resources.gpus.enabled (str, the chart has bool)"
    ]
    assert unknown_in({"kubeletPlugin": {"nodeSelector": {"any/label": "x"}}}, chart) == []


@pytest.mark.parametrize("mode", ["host", "operator"])
def test_dra_values(mode: str) -> None:
    raw = base_spec()
    raw["gpuOperator"]["driverMode"] = mode
    with_dra(raw, "some")
    values = dra_values(load_spec(raw).gpu_operator.driver_mode)
    assert unknown_in(values, dra_chart()) == []
    assert values["nvidiaDriverRoot"] == ("/" if mode == "host" else "/run/nvidia/driver")
    assert values["kubeletPlugin"]["nodeSelector"] == {"nvidia.com/dra-kubelet-plugin": "true"}
    assert values["resources"]["gpus"] == {"enabled": True}


def test_device_plugin_is_off_cluster_wide_only_when_every_node_uses_dra() -> None:
    names = {"device_plugin_config": "dp", "device_plugin_default": "default"}
    for which, enabled in (("none", None), ("some", None), ("all", False)):
        raw = base_spec()
        with_dra(raw, which)
        assert operator_values(load_spec(raw), **names)["devicePlugin"].get("enabled") == enabled, which


def test_driver_manager_evicts_dra_pods_in_operator_mode_only() -> None:
    raw = base_spec()
    with_dra(raw, "some")
    assert "manager" not in operator_values(load_spec(raw))["driver"]
    raw["gpuOperator"]["driverMode"] = "operator"
    env = operator_values(load_spec(raw))["driver"]["manager"]["env"]
    assert env == [{"name": "NODE_LABEL_FOR_GPU_POD_EVICTION", "value": "nvidia.com/dra-kubelet-plugin"}]


def test_service_monitor_of_the_chart_is_always_off_with_dcgm() -> None:
    # v26.7.0's chart default is true; ours is created by GpuMonitoring when monitoring.prometheus is set.
    assert _load("v26.7.0", "values.yaml")["dcgmExporter"]["serviceMonitor"]["enabled"] is True
    values = operator_values(load_spec(base_spec()))
    assert values["dcgmExporter"] == {"enabled": True, "serviceMonitor": {"enabled": False}}


@pytest.mark.parametrize(("workload", "vfio", "vgpu"), [("vm-passthrough", True, False), ("vm-vgpu", False, True)])
def test_sandbox_workloads_turn_on_the_kubevirt_operands(workload: str, vfio: bool, vgpu: bool) -> None:
    _, raw, _ = next(v for v in kubevirt_variants() if v[1]["workers"][2]["workload"] == workload)
    values = operator_values(load_spec(raw))
    assert values["sandboxWorkloads"] == {"enabled": True, "defaultWorkload": "container"}
    assert values["vfioManager"] == {"enabled": vfio}
    assert values["vgpuDeviceManager"]["enabled"] is vgpu
    assert values["sandboxDevicePlugin"] == {"enabled": True}
    assert ("vgpuManager" in values) is vgpu


def test_vgpu_manager_image_and_pull_secret() -> None:
    raw = make_vm_worker(base_spec(), 2, "vm-vgpu", "A10-12Q")
    raw["kubevirt"]["vgpuManager"].update(image="vgpu-host", pullSecret="ngc-vgpu")
    raw["kubevirt"]["nodes"] = [
        {"name": f"bm-{i}", "workload": "vm-vgpu", "gpus": {"A10": 1}, "vgpuType": "A10-4Q"} for i in range(2)
    ]
    values = operator_values(load_spec(raw))
    assert values["vgpuManager"] == {
        "enabled": True,
        "repository": "registry.example.test/nvidia",
        "image": "vgpu-host",
        "version": "580.95.02",
        "imagePullSecrets": ["ngc-vgpu"],
    }
    # Two bare-metal nodes use A10-4Q, one worker A10-12Q: unlabelled vGPU nodes get the commonest type.
    assert values["vgpuDeviceManager"] == {"enabled": True, "config": {"name": "", "default": "A10-4Q"}}


def test_bare_metal_kubevirt_nodes_alone_turn_on_the_sandbox_operands() -> None:
    raw = base_spec()
    raw["kubevirt"] = {"enabled": True, "nodes": [{"name": "bm-1", "workload": "vm-passthrough", "gpus": {"A10": 2}}]}
    values = operator_values(load_spec(raw))
    assert values["vfioManager"] == {"enabled": True}
    assert values["sandboxWorkloads"]["enabled"] is True


def test_container_only_clusters_leave_sandbox_workloads_alone() -> None:
    values = operator_values(load_spec(base_spec()))
    assert not {"sandboxWorkloads", "vfioManager", "sandboxDevicePlugin", "vgpuDeviceManager"} & set(values)
