"""Spec validation: every rule, reported as `cluster.<path>: message`, all problems at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.spec import ClusterSpec, load_spec
from tests.support import VGPU_MANAGER, assert_problem, base_spec, errors_of, make_vm_worker, spec_paths

Spec = dict[str, Any]


def w(i: int) -> Callable[[Spec], dict[str, Any]]:
    return lambda s: s["workers"][i]


def node(i: int) -> Callable[[Spec], dict[str, Any]]:
    return lambda s: s["proxmox"]["nodes"][i]


def setting(where: Callable[[Spec], dict[str, Any]], **values: Any) -> Callable[[Spec], None]:
    return lambda s: where(s).update(values)


def dropping(where: Callable[[Spec], dict[str, Any]], key: str) -> Callable[[Spec], None]:
    return lambda s: where(s).pop(key)


def adding_worker(**values: Any) -> Callable[[Spec], None]:
    def mutate(s: Spec) -> None:
        s["workers"].append({"name": "extra", "vmid": 2999, "node": "pve1", "gpus": ["a10-0"], **values})

    return mutate


def vm_worker(workload: str, **values: Any) -> Callable[[Spec], None]:
    def mutate(s: Spec) -> None:
        make_vm_worker(s, 2, workload)
        s["workers"][2].pop("vgpuType", None)  # each case sets its own (or none)
        s["workers"][2].update(values)

    return mutate


def kubevirt_node(**values: Any) -> Callable[[Spec], None]:
    """Add a bare-metal KubeVirt node (bm-1, one A10, vm-passthrough unless overridden); worker 2 becomes
    vm-passthrough so KubeVirt has a worker too."""

    def mutate(s: Spec) -> None:
        vm_worker("vm-passthrough")(s)
        node = {"name": "bm-1", "workload": "vm-passthrough", "gpus": {"A10": 1}, **values}
        s["kubevirt"].setdefault("nodes", []).append(node)
        if node["workload"] == "vm-vgpu":
            s["kubevirt"]["vgpuManager"] = VGPU_MANAGER

    return mutate


def gpu(i: int, j: int) -> Callable[[Spec], dict[str, Any]]:
    return lambda s: s["proxmox"]["nodes"][i]["gpus"][j]


def many_gpus(s: Spec) -> None:
    s["proxmox"]["nodes"][1]["gpus"] = [
        {"name": f"g{k}", "pciPath": f"0000:{k + 16:02x}:00", "model": "L4"} for k in range(17)
    ]
    s["workers"][2]["gpus"] = [f"g{k}" for k in range(17)]


def non_uniform_single(s: Spec) -> None:
    s["gpuOperator"]["migStrategy"] = "single"
    s["quotas"] = []


C = "cluster"
BAD: list[tuple[str, Callable[[Spec], None], str, str]] = [
    # MIG
    ("mig on A10", lambda s: s["workers"][2].update(sharing="mig", gpus=[{"ref": "a10-0", "mig": "all-1g.5gb"}], timeSlicing=None) or s["workers"][2].pop("timeSlicing"),
     f"{C}.workers[2].gpus[0].mig", "A10 does not support MIG"),
    ("worker mig on A10", lambda s: s["workers"][2].update(sharing="mig", mig="all-1g.5gb") or s["workers"][2].pop("timeSlicing"),
     f"{C}.workers[2].gpus[1].mig", "A10 does not support MIG (from the worker's mig)"),
    ("unknown profile", setting(w(1), gpus=[{"ref": "a100-1", "mig": {"1g.6gb": 1}}]),
     f"{C}.workers[1].gpus[0].mig", "has no MIG profile '1g.6gb'"),
    ("unknown named config", setting(w(0), mig="all-3g.40gb"),
     f"{C}.workers[0].gpus[0].mig", "no MIG config 'all-3g.40gb' for A100-PCIE-40GB"),
    ("4g+4g", setting(w(1), gpus=[{"ref": "a100-1", "mig": {"4g.20gb": 2}}]),
     f"{C}.workers[1].gpus[0].mig", "at most 1 per A100-PCIE-40GB"),
    ("unplaceable", setting(w(1), gpus=[{"ref": "a100-1", "mig": {"3g.20gb": 2, "1g.5gb": 1}}]),
     f"{C}.workers[1].gpus[0].mig", "cannot be placed"),
    ("8 x 1g.5gb", setting(w(1), gpus=[{"ref": "a100-1", "mig": {"1g.5gb": 8}}]),
     f"{C}.workers[1].gpus[0].mig", "at most 7"),
    ("zero instances", setting(w(1), gpus=[{"ref": "a100-1", "mig": {"1g.5gb": 0}}]),
     f"{C}.workers[1].gpus[0].mig", "at least 1"),
    ("empty geometry", setting(w(1), gpus=[{"ref": "a100-1", "mig": {}}]),
     f"{C}.workers[1].gpus[0].mig", "empty MIG geometry"),
    ("mig sharing without config", dropping(w(0), "mig"),
     f"{C}.workers[0].gpus[0].mig", "has no MIG config"),
    ("mig without mig sharing", setting(w(2), mig="all-1g.5gb"),
     f"{C}.workers[2].mig", "only applies when sharing is mig"),
    ("gpu mig without mig sharing", setting(w(2), gpus=["a10-0", {"ref": "a10-1", "mig": "all-1g.5gb"}]),
     f"{C}.workers[2].gpus[1].mig", "A10 does not support MIG"),
    ("mig strategy none", lambda s: s["gpuOperator"].update(migStrategy="none"),
     f"{C}.workers[0].sharing", "needs gpuOperator.migStrategy single or mixed"),
    ("single non-uniform", non_uniform_single,
     f"{C}.workers[1].mig", "migStrategy single needs one MIG profile"),
    ("two +me", setting(w(1), gpus=[{"ref": "a100-1", "mig": {"1g.5gb+me": 2}}]),
     f"{C}.workers[1].gpus[0].mig", "at most 1"),
    # time-slicing
    ("replicas 1", setting(w(2), timeSlicing={"replicas": 1}),
     f"{C}.workers[2].timeSlicing.replicas", "greater than or equal to 2"),
    ("time-slicing without settings", dropping(w(2), "timeSlicing"),
     f"{C}.workers[2].timeSlicing", "required when sharing is time-slicing"),
    ("time-slicing settings without sharing", setting(w(2), sharing="none"),
     f"{C}.workers[2].timeSlicing", "only applies when sharing is time-slicing or mig"),
    # GPU claims
    ("gpu assigned twice", adding_worker(gpus=["a100-0"]),
     f"{C}.workers[3].gpus[0].ref", "assigned twice (also workers[0].gpus[0])"),
    ("gpu twice in one worker", setting(w(2), gpus=["a10-0", "a10-0"]),
     f"{C}.workers[2].gpus[1].ref", "assigned twice"),
    ("unknown gpu", setting(w(2), gpus=["a10-9"]),
     f"{C}.workers[2].gpus[0].ref", "no GPU 'a10-9' on Proxmox node 'pve2' (known: a10-0, a10-1)"),
    ("gpu of another node", setting(w(2), gpus=["a100-0"]),
     f"{C}.workers[2].gpus[0].ref", "no GPU 'a100-0' on Proxmox node 'pve2'"),
    ("console gpu", adding_worker(gpus=["vga"]),
     f"{C}.workers[3].gpus[0].ref", "host console GPU"),
    ("17 hostpci", many_gpus, f"{C}.workers[2].gpus", "at most 16 hostpci"),
    ("no gpus", setting(w(2), gpus=[]), f"{C}.workers[2].gpus", "at least 1 item"),
    # workers
    ("duplicate vmid", setting(w(1), vmid=2001), f"{C}.workers[1].vmid", "vmid 2001 is already used by workers[0]"),
    ("duplicate name", setting(w(1), name="mig-1"), f"{C}.workers[1].name", "'mig-1' is already used by workers[0]"),
    ("undefined node", setting(w(2), node="pve9"), f"{C}.workers[2].node", "Proxmox node 'pve9' is not defined"),
    ("vmid too small", setting(w(0), vmid=99), f"{C}.workers[0].vmid", "greater than or equal to 100"),
    ("bad vm name", setting(w(0), name="Mig_1"), f"{C}.workers[0].name", "should match pattern"),
    ("bad ip", setting(w(2), network={"ipv4": "192.0.2.300/24"}), f"{C}.workers[2].network.ipv4", "expected 'dhcp'"),
    ("ip without prefix", setting(w(2), network={"ipv4": "192.0.2.30"}), f"{C}.workers[2].network.ipv4", "prefix length"),
    ("gateway outside subnet", setting(w(2), network={"ipv4": "192.0.2.30/24", "gateway": "10.0.0.1"}),
     f"{C}.workers[2].network.gateway", "10.0.0.1 is outside 192.0.2.0/24"),
    ("image with two sources", setting(w(0), image={"cloudImageUrl": "https://x.test/a.img", "templateVmid": 9000}),
     f"{C}.workers[0].image", "exactly one of"),
    ("memory too small", setting(w(0), memoryMiB=512), f"{C}.workers[0].memoryMiB", "greater than or equal to 2048"),
    ("bad workload", setting(w(0), workload="batch"), f"{C}.workers[0].workload", "'container', 'vm-passthrough'"),
    # KubeVirt workloads
    ("vm-passthrough with time-slicing", lambda s: (s.update(kubevirt={"enabled": True}), s["workers"][2].update(workload="vm-passthrough")),
     f"{C}.workers[2].sharing", "MIG and time-slicing do not apply"),
    ("vm-passthrough with mig", lambda s: (s.update(kubevirt={"enabled": True}), s["workers"][0].update(workload="vm-passthrough")),
     f"{C}.workers[0].sharing", "MIG and time-slicing do not apply"),
    ("MIG-backed vGPU", lambda s: (s.update(kubevirt={"enabled": True}), s["workers"][0].update(workload="vm-vgpu", vgpuType="A100-4C")),
     f"{C}.workers[0].sharing", "MIG-backed vGPU is not supported"),
    ("vm workload without kubevirt", lambda s: (s["workers"][2].update(workload="vm-passthrough", sharing="none"), s["workers"][2].pop("timeSlicing")),
     f"{C}.workers[2].workload", "needs kubevirt.enabled"),
    ("vgpu without type", vm_worker("vm-vgpu"), f"{C}.workers[2].vgpuType", "required for vm-vgpu"),
    ("vgpu type of another model", vm_worker("vm-vgpu", vgpuType="L4-24Q"), f"{C}.workers[2].vgpuType", "not a A10 vGPU type"),
    ("vgpu size", vm_worker("vm-vgpu", vgpuType="A10-5Q"), f"{C}.workers[2].vgpuType", "does not divide"),
    ("vgpu type on container worker", setting(w(2), vgpuType="A10-24Q"), f"{C}.workers[2].vgpuType", "only applies to vm-vgpu"),
    # Proxmox inventory
    ("malformed pci path", setting(gpu(0, 0), pciPath="41:00.0"), f"{C}.proxmox.nodes[0].gpus[0].pciPath", "like 0000:41:00"),
    ("pci path with function", setting(gpu(0, 0), pciPath="0000:41:00.0"), f"{C}.proxmox.nodes[0].gpus[0].pciPath", "without function"),
    ("malformed device id", setting(gpu(0, 0), deviceId="10de-20f1"), f"{C}.proxmox.nodes[0].gpus[0].deviceId", "vendor:device id"),
    ("device id of another model", setting(gpu(0, 0), deviceId="10de:2236"), f"{C}.proxmox.nodes[0].gpus[0]", "is not a A100-PCIE-40GB"),
    ("unknown model", setting(gpu(0, 0), model="A100"), f"{C}.proxmox.nodes[0].gpus[0].model", "unknown GPU model 'A100'"),
    ("duplicate gpu name", setting(gpu(1, 1), name="a10-0"), f"{C}.proxmox.nodes[1].gpus[1].name", "already used"),
    ("duplicate pci path", setting(gpu(1, 1), pciPath="0000:17:00"), f"{C}.proxmox.nodes[1].gpus[1].pciPath", "already used"),
    ("duplicate node", setting(node(1), name="pve1"), f"{C}.proxmox.nodes[1].name", "already used"),
    ("two console gpus", setting(gpu(0, 3 - 1), console=True), f"{C}.proxmox.nodes[0].gpus", "at most one GPU can be the console"),
    ("bad cpu vendor", setting(node(0), cpuVendor="arm"), f"{C}.proxmox.nodes[0].cpuVendor", "'intel' or 'amd'"),
    ("bad boot loader", setting(node(0), bootLoader="lilo"), f"{C}.proxmox.nodes[0].bootLoader", "'grub', 'systemd-boot' or 'auto'"),
    ("bad endpoint", lambda s: s["proxmox"].update(endpoint="pve1:8006"), f"{C}.proxmox.endpoint", "expected an http:// or https:// URL"),
    ("bad auth mode", lambda s: s["proxmox"].update(authMode="ticket"), f"{C}.proxmox.authMode", "'token' or 'password'"),
    ("no nodes", lambda s: s["proxmox"].update(nodes=[]), f"{C}.proxmox.nodes", "at least 1 item"),
    # Kubernetes and operator
    ("bad k8s version", lambda s: s["kubernetes"].update(version="v1.34"), f"{C}.kubernetes.version", "should match pattern"),
    ("missing api endpoint", lambda s: s["kubernetes"].pop("apiEndpoint"), f"{C}.kubernetes.apiEndpoint", "required key is missing"),
    ("unsupported chart", lambda s: s["gpuOperator"].update(chartVersion="v24.9.0"), f"{C}.gpuOperator.chartVersion", "'v26.7.0' or 'v25.10.1'"),
    ("driver version off branch", lambda s: s["gpuOperator"].update(driverBranch="570", driverVersion="580.95.05"),
     f"{C}.gpuOperator.driverVersion", "not on branch 570"),
    ("bad strategy", lambda s: s["gpuOperator"].update(migStrategy="auto"), f"{C}.gpuOperator.migStrategy", "'none', 'single' or 'mixed'"),
    # quotas
    ("quota on unadvertised resource", lambda s: s["quotas"][0]["resources"].update({"nvidia.com/mig-7g.40gb": 1}),
     f"{C}.quotas[0].resources.nvidia.com/mig-7g.40gb", "no worker advertises"),
    ("quota with requests. prefix", lambda s: s["quotas"][0]["resources"].update({"requests.nvidia.com/gpu": 1}),
     f"{C}.quotas[0].resources.requests.nvidia.com/gpu", "the requests. prefix is added for you"),
    ("duplicate quota namespace", lambda s: s["quotas"].append(dict(s["quotas"][0])), f"{C}.quotas[1].namespace", "already used"),
    ("negative quota", lambda s: s["quotas"][0]["resources"].update({"nvidia.com/gpu": -1}),
     f"{C}.quotas[0].resources.nvidia.com/gpu", "greater than or equal to 0"),
    # guest
    ("DSA public key", lambda s: s["guest"].update(sshPublicKeys=["ssh-dss AAAAB3NzaC1kc3M= old"]),
     f"{C}.guest.sshPublicKeys[0]", "unknown key type 'ssh-dss'"),
    ("no public key", lambda s: s["guest"].update(sshPublicKeys=[]), f"{C}.guest.sshPublicKeys", "at least 1 item"),
    # monitoring, smoke test, DRA
    ("alerts without their metrics", lambda s: s["gpuOperator"].update(monitoring={"prometheus": True, "metrics": ["DCGM_FI_DEV_GPU_UTIL"]}),
     f"{C}.gpuOperator.monitoring.metrics", "the alert rules query DCGM_FI_DEV_GPU_TEMP"),
    ("dashboard without its metrics", lambda s: s["gpuOperator"].update(monitoring={"dashboard": {"enabled": True}, "metrics": ["DCGM_FI_DEV_GPU_UTIL"]}),
     f"{C}.gpuOperator.monitoring.metrics", "the dashboard query DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    ("critical below warning", lambda s: s["gpuOperator"].update(monitoring={"alerts": {"temperatureWarningCelsius": 90, "temperatureCriticalCelsius": 85}}),
     f"{C}.gpuOperator.monitoring.alerts.temperatureCriticalCelsius", "must be above temperatureWarningCelsius (90)"),
    ("critical XID twice", lambda s: s["gpuOperator"].update(monitoring={"alerts": {"criticalXids": [79, 48, 79]}}),
     f"{C}.gpuOperator.monitoring.alerts.criticalXids[2]", "XID 79 is listed twice"),
    ("XID out of range", lambda s: s["gpuOperator"].update(monitoring={"alerts": {"criticalXids": [0]}}),
     f"{C}.gpuOperator.monitoring.alerts.criticalXids[0]", "greater than or equal to 1"),
    ("dashboard label invalid", lambda s: s["gpuOperator"].update(monitoring={"dashboard": {"enabled": True, "label": "bad label"}}),
     f"{C}.gpuOperator.monitoring.dashboard.label", "not a valid Kubernetes label"),
    ("priority class reserved", lambda s: s.update(priorityClasses=[{"name": "system-gpu", "value": 10}]),
     f"{C}.priorityClasses[0].name", "system- prefix is reserved"),
    ("priority class too high", lambda s: s.update(priorityClasses=[{"name": "gpu-high", "value": 2_000_000_000}]),
     f"{C}.priorityClasses[0].value", "less than or equal to 1000000000"),
    ("priority class upper case", lambda s: s.update(priorityClasses=[{"name": "GPU", "value": 1}]),
     f"{C}.priorityClasses[0].name", "should match pattern"),
    ("priority class twice", lambda s: s.update(priorityClasses=[{"name": "gpu", "value": 1}, {"name": "gpu", "value": 2}]),
     f"{C}.priorityClasses[1].name", "PriorityClass name 'gpu' is already used by priorityClasses[0]"),
    ("two default classes", lambda s: s.update(priorityClasses=[{"name": "a", "value": 1, "globalDefault": True}, {"name": "b", "value": 2, "globalDefault": True}]),
     f"{C}.priorityClasses[1].globalDefault", "priorityClasses[0] is already the default"),
    ("bad preemption policy", lambda s: s.update(priorityClasses=[{"name": "a", "value": 1, "preemptionPolicy": "Always"}]),
     f"{C}.priorityClasses[0].preemptionPolicy", "PreemptLowerPriority"),
    ("quota for an undeclared class", lambda s: s["quotas"][0].update(priorityClass="gpu-high"),
     f"{C}.quotas[0].priorityClass", "gpu-high is not one of priorityClasses (none)"),
    ("unknown metric shorthand", lambda s: s["gpuOperator"].update(monitoring={"metrics": ["DCGM_FI_DEV_GPU_UTILS"]}),
     f"{C}.gpuOperator.monitoring.metrics[0]", "not in the built-in field table"),
    ("metric help with a comma", lambda s: s["gpuOperator"].update(monitoring={"metrics": [{"field": "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "type": "counter", "help": "NVLink, total"}]}),
     f"{C}.gpuOperator.monitoring.metrics[0].help", "should match pattern"),
    ("metric listed twice", lambda s: s["gpuOperator"].update(monitoring={"metrics": ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL"]}),
     f"{C}.gpuOperator.monitoring.metrics[1].field", "listed twice"),
    ("bad prometheus label", lambda s: s["gpuOperator"].update(monitoring={"labels": {"release": "kube prometheus"}}),
     f"{C}.gpuOperator.monitoring.labels.release", "not a valid Kubernetes label"),
    ("prometheus without dcgm", lambda s: s["gpuOperator"].update(dcgm=False, monitoring={"prometheus": True}),
     f"{C}.gpuOperator.monitoring.prometheus", "needs the operator's DCGM exporter"),
    ("smoke test without operator", lambda s: s["gpuOperator"].update(enabled=False, smokeTest={"enabled": True}),
     f"{C}.gpuOperator.smokeTest.enabled", "runs after the operator"),
    ("smoke test with nothing to request", lambda s: (s["gpuOperator"].update(smokeTest={"enabled": True}), s["quotas"].clear(),
     [w.update(dra=True) for w in s["workers"][:2]], s["workers"].pop()),
     f"{C}.gpuOperator.smokeTest.enabled", "no worker advertises a container GPU resource"),
    ("DRA on Kubernetes 1.33", lambda s: (s["kubernetes"].update(version="1.33"), s["workers"][0].update(dra=True)),
     f"{C}.kubernetes.version", "DRA (workers[0].dra) needs Kubernetes 1.34 or later (is 1.33)"),
    ("DRA on driver branch 570", lambda s: (s["gpuOperator"].update(driverBranch="570"), s["workers"][1].update(dra=True)),
     f"{C}.gpuOperator.driverBranch", "DRA (workers[1].dra) needs driver branch 580 or later (is 570)"),
    ("DRA with time-slicing", setting(w(2), dra=True), f"{C}.workers[2].sharing", "device plugin, which DRA nodes do not run"),
    ("DRA on a KubeVirt worker", lambda s: (s["kubevirt"].update(enabled=True) if "kubevirt" in s else s.update(kubevirt={"enabled": True}),
     s["workers"][2].update(dra=True, workload="vm-passthrough", sharing="none", timeSlicing=None)),
     f"{C}.workers[2].dra", "DRA serves containers"),
    # KubeVirt nodes, the vGPU Manager image, what KubeVirt needs
    ("bare-metal node that is also a worker with another workload", kubevirt_node(name="ts-1", workload="vm-vgpu", vgpuType="A10-24Q"),
     f"{C}.kubevirt.nodes[0].name", "node 'ts-1' already runs vm-passthrough (workers[2]); a node runs one workload type"),
    ("bare-metal node listed twice", lambda s: (kubevirt_node()(s), kubevirt_node(workload="vm-vgpu", vgpuType="A10-24Q")(s)),
     f"{C}.kubevirt.nodes[1].name", "node 'bm-1' already runs vm-passthrough (kubevirt.nodes[0]); a node runs one workload type"),
    ("bare-metal node that is a worker", kubevirt_node(name="ts-1"), f"{C}.kubevirt.nodes[0].name", "node 'ts-1' is already workers[2]"),
    ("bare-metal vgpu without type", kubevirt_node(workload="vm-vgpu"), f"{C}.kubevirt.nodes[0].vgpuType", "required for vm-vgpu nodes"),
    ("bare-metal vgpu type of another model", kubevirt_node(workload="vm-vgpu", vgpuType="T4-8Q", gpus={"A10": 1, "T4": 1}),
     f"{C}.kubevirt.nodes[0].vgpuType", "T4-8Q is not a A10 vGPU type"),
    ("bare-metal vgpu type on passthrough", kubevirt_node(vgpuType="A10-24Q"), f"{C}.kubevirt.nodes[0].vgpuType", "only applies to vm-vgpu"),
    ("bare-metal unknown model", kubevirt_node(gpus={"A11": 1}), f"{C}.kubevirt.nodes[0].gpus.A11", "unknown GPU model 'A11'"),
    ("bare-metal zero gpus", kubevirt_node(gpus={"A10": 0}), f"{C}.kubevirt.nodes[0].gpus.A10", "greater than or equal to 1"),
    ("bare-metal container workload", kubevirt_node(workload="container"), f"{C}.kubevirt.nodes[0].workload", "'vm-passthrough' or 'vm-vgpu'"),
    ("kubevirt nodes while disabled", lambda s: (kubevirt_node()(s), s["kubevirt"].update(enabled=False)),
     f"{C}.kubevirt.nodes", "need kubevirt.enabled: true"),
    ("vgpu without the manager image", lambda s: (vm_worker("vm-vgpu", vgpuType="A10-24Q")(s), s["kubevirt"].pop("vgpuManager", None)),
     f"{C}.kubevirt.vgpuManager", "required: workers[2] runs vm-vgpu"),
    ("vgpu manager image without vgpu nodes", lambda s: (vm_worker("vm-passthrough")(s), s["kubevirt"].update(vgpuManager=VGPU_MANAGER)),
     f"{C}.kubevirt.vgpuManager", "only applies when a worker or kubevirt node runs vm-vgpu"),
    ("vgpu manager image without version", lambda s: (vm_worker("vm-vgpu", vgpuType="A10-24Q")(s),
     s["kubevirt"].update(vgpuManager={"repository": "registry.example.test/nvidia"})),
     f"{C}.kubevirt.vgpuManager.version", "required"),
    ("vgpu manager repository with a scheme", lambda s: (vm_worker("vm-vgpu", vgpuType="A10-24Q")(s),
     s["kubevirt"].update(vgpuManager={**VGPU_MANAGER, "repository": "https://registry.example.test/nvidia"})),
     f"{C}.kubevirt.vgpuManager.repository", "should match pattern"),
    ("kubevirt enabled with no VM node", lambda s: s.update(kubevirt={"enabled": True}),
     f"{C}.kubevirt.enabled", "no worker or kubevirt.nodes entry runs vm-passthrough or vm-vgpu"),
    ("kubevirt without the operator", lambda s: (vm_worker("vm-passthrough")(s), s["gpuOperator"].update(enabled=False)),
     f"{C}.gpuOperator.enabled", "workers[2] runs vm-passthrough, which needs the GPU Operator's sandbox device plugin"),
    ("lower-case feature gate", lambda s: (vm_worker("vm-passthrough")(s), s["kubevirt"].update(featureGates=["hostDevices"])),
     f"{C}.kubevirt.featureGates[0]", "should match pattern"),
    # unknown keys anywhere
    ("unknown top-level key", lambda s: s.update(extra=1), f"{C}.extra", "unknown key"),
    ("snake_case key", setting(w(0), memory_mib=4096), f"{C}.workers[0].memory_mib", "unknown key"),
    ("unknown nested key", setting(gpu(0, 0), vendor="nvidia"), f"{C}.proxmox.nodes[0].gpus[0].vendor", "unknown key"),
    ("unknown operator key", lambda s: s["gpuOperator"].update(defaultRuntime="containerd"), f"{C}.gpuOperator.defaultRuntime", "unknown key"),
    ("unknown time-slicing key", setting(w(2), timeSlicing={"replicas": 2, "replica": 3}), f"{C}.workers[2].timeSlicing.replica", "unknown key"),
]  # fmt: skip


def test_there_are_at_least_40_bad_config_cases() -> None:
    assert len(BAD) >= 40


def test_base_spec_is_valid() -> None:
    spec = load_spec(base_spec())
    assert isinstance(spec, ClusterSpec)
    assert [w.name for w in spec.workers] == ["mig-1", "mig-2", "ts-1"]


@pytest.mark.parametrize(("case", "mutate", "path", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_config(case: str, mutate: Callable[[Spec], None], path: str, message: str) -> None:
    spec = base_spec()
    mutate(spec)
    assert_problem(case, errors_of(spec), path, message)


def test_all_field_problems_at_once_in_natural_order() -> None:
    spec = base_spec()
    for i, worker in enumerate(spec["workers"]):
        worker["vmid"] = 1 + i  # three problems
    spec["proxmox"]["nodes"][0]["gpus"][0]["pciPath"] = "bad"
    spec["kubernetes"]["version"] = "latest"
    lines = errors_of(spec)
    assert len(lines) == 5, lines
    assert lines[0].startswith("cluster.kubernetes.version")
    assert [line.split(":")[0] for line in lines[2:]] == [f"cluster.workers[{i}].vmid" for i in range(3)]


def test_all_cross_field_problems_at_once() -> None:
    spec = base_spec()
    spec["workers"][1]["vmid"] = 2001
    spec["workers"][2]["node"] = "pve9"
    spec["workers"][0]["mig"] = "all-9g.99gb"
    spec["workers"].append({"name": "mig-1", "vmid": 2004, "node": "pve1", "gpus": ["vga"]})
    lines = errors_of(spec)
    assert {line.split(": ")[0] for line in lines} == {
        "cluster.workers[0].gpus[0].mig",
        "cluster.workers[1].vmid",
        "cluster.workers[2].node",
        "cluster.workers[3].gpus[0].ref",
        "cluster.workers[3].name",
    }


def test_each_problem_is_one_line() -> None:
    spec = base_spec()
    spec["workers"][1]["vmid"] = 2001
    spec["workers"][2]["gpus"] = ["nope"]
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    assert str(info.value).splitlines() == info.value.lines
    assert len(info.value.lines) == 2


def test_non_mapping_spec() -> None:
    assert errors_of(["not", "a", "mapping"]) == ["cluster: expected a mapping, got list"]  # type: ignore[arg-type]


def test_spec_is_frozen() -> None:
    spec = load_spec(base_spec())
    with pytest.raises(Exception, match="frozen"):
        spec.workers[0].vmid = 5  # type: ignore[misc]


def test_every_field_has_a_description() -> None:
    from pydantic import BaseModel

    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            for arg in _model_args(field.annotation):
                walk(arg)

    walk(ClusterSpec)
    assert len(seen) >= 10


def _model_args(annotation: Any) -> list[type[Any]]:
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _model_args(a)]


# --- random mutations never escape as anything but SpecError -------------------------------------------------

_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70_000), st.text(max_size=12),
    st.sampled_from(["all-1g.5gb", "A10", "pve1", "a10-0", "mig", "0000:41:00", "10de:20f1", "1.34", "dhcp"]),
    st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.text(max_size=6), st.integers(0, 9), max_size=2),
)  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_mutations_only_raise_spec_errors(data: st.DataObject) -> None:
    spec = base_spec()
    for _ in range(data.draw(st.integers(1, 4))):
        paths = [p for p in spec_paths(spec) if p]
        path = data.draw(st.sampled_from(paths))
        parent: Any = spec
        for part in path[:-1]:
            parent = parent[part]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(st.text(min_size=1, max_size=8))] = data.draw(_LEAVES)
        else:
            parent[path[-1]] = data.draw(_LEAVES)
    try:
        load_spec(spec)
    except SpecError as err:
        assert err.lines and all(line.startswith("cluster") and ": " in line for line in err.lines)
