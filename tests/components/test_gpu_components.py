"""The GPU-stack components built directly for existing nodes, with minimal args: GpuOperator, DraDriver,
GpuSmokeTest and KubeVirtGpuDevices."""

from __future__ import annotations

import pulumi_kubernetes as kubernetes
import pytest

from proxmox_gpu_cluster.core.nodes import ExistingGpuNode
from proxmox_gpu_cluster.core.operator_spec import DraSpec, GpuOperatorSpec, SmokeTestSpec
from proxmox_gpu_cluster.core.spec import KubeVirtSpec, VgpuManagerSpec
from proxmox_gpu_cluster.core.worker_spec import TimeSlicing
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.gpu.dra_driver import DraDriver
from proxmox_gpu_cluster.gpu.gpu_operator import GpuOperator
from proxmox_gpu_cluster.gpu.kubevirt_devices import KubeVirtGpuDevices
from proxmox_gpu_cluster.gpu.smoke_test import GpuSmokeTest
from proxmox_gpu_cluster.render.gpu_stack import GpuStack
from proxmox_gpu_cluster.testing import run

SHARED = ExistingGpuNode(name="bm-1", gpus={"L4": 4}, sharing="time-slicing", time_slicing=TimeSlicing(replicas=2))
VGPU = ExistingGpuNode(name="bm-2", gpus={"A10": 1}, workload="vm-vgpu", vgpu_type="A10-12Q")


def k8s() -> kubernetes.Provider:
    return kubernetes.Provider("k8s", kubeconfig="{}")


def test_operator_for_existing_nodes_points_at_its_own_configmaps() -> None:
    stack = GpuStack(operator=GpuOperatorSpec(), nodes=(SHARED.resolve(),))

    def program() -> None:
        GpuOperator("op", stack, provider=k8s())

    rec = run(program)
    config = rec.named("op-device-plugin-config").plain_inputs
    values = rec.one("kubernetes:helm.sh/v3:Release").plain_inputs["values"]
    assert values["devicePlugin"]["config"]["name"] == config["metadata"]["name"]
    assert stack.labels["bm-1"]["nvidia.com/device-plugin.config"] in config["data"]
    assert stack.capacity()[0].resources == {"nvidia.com/gpu": 8}


def test_operator_refuses_a_vgpu_manager_without_its_password() -> None:
    manager = VgpuManagerSpec(repository="registry.example.test/nvidia", image="vgpu-manager", version="580.95.02")
    stack = GpuStack(operator=GpuOperatorSpec(), nodes=(VGPU.resolve(),), vgpu_manager=manager)

    def program() -> None:
        GpuOperator("op", stack, provider=k8s())

    with pytest.raises(InvalidComponentArgs) as err:
        run(program)
    assert err.value.lines == ["op.vgpuRegistryPassword: the vGPU Manager's pull secret needs the password"]


def test_dra_driver_in_its_own_namespace() -> None:
    def program() -> None:
        DraDriver("dra", DraSpec(), driver_mode="operator", provider=k8s())

    rec = run(program)
    release = rec.one("kubernetes:helm.sh/v3:Release").plain_inputs
    assert release["values"]["nvidiaDriverRoot"] == "/run/nvidia/driver"
    assert rec.one("kubernetes:core/v1:Namespace").plain_inputs["metadata"]["name"] == "nvidia-dra-driver-gpu"


def test_smoke_test_requests_the_given_resource() -> None:
    def program() -> None:
        GpuSmokeTest(
            "smoke", SmokeTestSpec(enabled=True), resource="nvidia.com/gpu.shared", provider=k8s(), namespace="x"
        )

    job = run(program).one("kubernetes:batch/v1:Job").plain_inputs
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu.shared": "1"}}
    assert job["metadata"]["namespace"] == "x"


def test_kubevirt_devices_for_existing_nodes() -> None:
    passthrough = ExistingGpuNode(name="bm-3", gpus={"L40S": 2}, workload="vm-passthrough").resolve()

    def program() -> None:
        KubeVirtGpuDevices("kv", KubeVirtSpec(enabled=True), nodes=[passthrough, VGPU.resolve()], provider=k8s())

    patch = run(program).one("kubernetes:kubevirt.io/v1:KubeVirtPatch").plain_inputs
    permitted = patch["spec"]["configuration"]["permittedHostDevices"]
    assert [d["resourceName"] for d in permitted["mediatedDevices"]] == ["nvidia.com/NVIDIA_A10-12Q"]
    assert {d["resourceName"] for d in permitted["pciHostDevices"]} == {"nvidia.com/AD102GL_L40S"}
