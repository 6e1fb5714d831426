"""The GPU-stack components built directly for existing nodes, with minimal args: GpuOperator, DraDriver,
GpuSmokeTest and KubeVirtGpuDevices."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as kubernetes
import pytest

from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.nodes import ExistingGpuNode
from proxmox_gpu_cluster.core.operator_spec import DraSpec, GpuOperatorSpec, SmokeTestSpec
from proxmox_gpu_cluster.core.spec import KubeVirtSpec, VgpuManagerSpec
from proxmox_gpu_cluster.core.worker_spec import TimeSlicing
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.gpu.dra_driver import DraDriver, DraDriverArgs
from proxmox_gpu_cluster.gpu.gpu_operator import GpuOperator, GpuOperatorArgs
from proxmox_gpu_cluster.gpu.kubevirt_devices import KubeVirtGpuDevices, KubeVirtGpuDevicesArgs
from proxmox_gpu_cluster.gpu.smoke_test import GpuSmokeTest, GpuSmokeTestArgs
from proxmox_gpu_cluster.render.gpu_stack import GpuStack
from proxmox_gpu_cluster.testing import run
from tests.components.gpu_opts import check_opts

SHARED = ExistingGpuNode(name="bm-1", gpus={"L4": 4}, sharing="time-slicing", time_slicing=TimeSlicing(replicas=2))
VGPU = ExistingGpuNode(name="bm-2", gpus={"A10": 1}, workload="vm-vgpu", vgpu_type="A10-12Q")


def k8s() -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(provider=kubernetes.Provider("k8s", kubeconfig="{}"))


def test_operator_for_existing_nodes_points_at_its_own_configmaps() -> None:
    stack = GpuStack(operator=GpuOperatorSpec(), nodes=(SHARED.resolve(),))

    def program() -> None:
        GpuOperator("op", GpuOperatorArgs(stack=stack), k8s())

    rec = run(program)
    config = rec.named("op-device-plugin-config").plain_inputs
    values = rec.one("kubernetes:helm.sh/v3:Release").plain_inputs["values"]
    assert values["devicePlugin"]["config"]["name"] == config["metadata"]["name"]
    assert stack.labels["bm-1"]["nvidia.com/device-plugin.config"] in config["data"]
    assert stack.capacity()[0].resources == {"nvidia.com/gpu": 8}


def test_operator_refuses_a_vgpu_manager_without_its_password() -> None:
    manager = VgpuManagerSpec(repository="registry.example.test/nvidia", image="vgpu-manager", version="580.95.02")
    stack = GpuStack(operator=GpuOperatorSpec(), nodes=(VGPU.resolve(),), vgpu_manager=manager)

    with pytest.raises(InvalidComponentArgs) as err:
        GpuOperatorArgs(stack=stack)
    assert err.value.lines == [
        "GpuOperatorArgs.vgpu_registry_password: the vGPU Manager's pull secret needs the password"
    ]
    with pytest.raises(SpecError) as spec_err:
        GpuStack(operator=GpuOperatorSpec(), nodes=(VGPU.resolve(),))
    assert spec_err.value.lines == ["GpuStack.vgpu_manager: vm-vgpu nodes (bm-2) need the vGPU Manager image"]


def test_operator_opts_carry_the_provider_and_what_the_release_waits_for() -> None:
    args = GpuOperatorArgs(stack=GpuStack(operator=GpuOperatorSpec(), nodes=(SHARED.resolve(),)))
    check_opts(lambda opts: GpuOperator("op", args, opts), "op", first=("op-release",))


def test_dra_driver_in_its_own_namespace() -> None:
    def program() -> None:
        DraDriver("dra", DraDriverArgs(dra=DraSpec(), driver_mode="operator"), k8s())

    rec = run(program)
    release = rec.one("kubernetes:helm.sh/v3:Release").plain_inputs
    assert release["values"]["nvidiaDriverRoot"] == "/run/nvidia/driver"
    assert rec.one("kubernetes:core/v1:Namespace").plain_inputs["metadata"]["name"] == "nvidia-dra-driver-gpu"


def test_smoke_test_requests_the_given_resource() -> None:
    def program() -> None:
        args = GpuSmokeTestArgs(test=SmokeTestSpec(enabled=True), resource="nvidia.com/gpu.shared", namespace="x")
        GpuSmokeTest("smoke", args, k8s())

    job = run(program).one("kubernetes:batch/v1:Job").plain_inputs
    shared = GpuStack(operator=GpuOperatorSpec(), nodes=(SHARED.resolve(),)).capacity()
    assert GpuSmokeTestArgs(resource="nvidia.com/gpu", namespace="x", capacity=tuple(shared)).capacity
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu.shared": "1"}}
    assert job["metadata"]["namespace"] == "x"


def test_kubevirt_devices_for_existing_nodes() -> None:
    passthrough = ExistingGpuNode(name="bm-3", gpus={"L40S": 2}, workload="vm-passthrough").resolve()

    def program() -> None:
        args = KubeVirtGpuDevicesArgs(kubevirt=KubeVirtSpec(enabled=True), nodes=(passthrough, VGPU.resolve()))
        KubeVirtGpuDevices("kv", args, k8s())

    patch = run(program).one("kubernetes:kubevirt.io/v1:KubeVirtPatch").plain_inputs
    permitted = patch["spec"]["configuration"]["permittedHostDevices"]
    assert [d["resourceName"] for d in permitted["mediatedDevices"]] == ["nvidia.com/NVIDIA_A10-12Q"]
    assert {d["resourceName"] for d in permitted["pciHostDevices"]} == {"nvidia.com/AD102GL_L40S"}


def test_dra_smoke_and_kubevirt_opts_carry_the_provider_and_what_they_wait_for() -> None:
    dra = DraDriverArgs(driver_mode="host")
    check_opts(lambda opts: DraDriver("dra", dra, opts), "dra", first=("dra-release",))
    smoke = GpuSmokeTestArgs(namespace=pulumi.Output.from_input("gpu-operator"))
    check_opts(lambda opts: GpuSmokeTest("smoke", smoke, opts), "smoke", first=("smoke-job",))
    nodes = (ExistingGpuNode(name="bm-3", gpus={"L40S": 2}, workload="vm-passthrough").resolve(),)
    kv = KubeVirtGpuDevicesArgs(nodes=nodes)
    check_opts(lambda opts: KubeVirtGpuDevices("kv", kv, opts), "kv", first=("kv-kubevirt",))


@pytest.mark.parametrize(
    ("build", "lines"),
    [
        (lambda: DraDriverArgs(driver_mode="container", namespace="Bad"),  # type: ignore[arg-type]
         ["DraDriverArgs.driver_mode: Input should be 'host' or 'operator'",
          "DraDriverArgs.namespace: String should match pattern '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'"]),
        (lambda: GpuSmokeTestArgs(resource="gpu", namespace="x", rerun_key="a\nb"),
         ["GpuSmokeTestArgs.rerun_key: String should match pattern '^[^\x00-\x1f\x7f-\x9f\u2028\u2029]*$'",
          "GpuSmokeTestArgs.resource: String should match pattern "
          "'^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$'"]),
        # Judged against what the container nodes advertise, when given: MIG only, so no whole GPU to request.
        (lambda: GpuSmokeTestArgs(namespace="x", capacity=tuple(GpuStack(operator=GpuOperatorSpec(), nodes=(
            ExistingGpuNode(name="bm-4", gpus={"A30": 1}, sharing="mig", mig="all-1g.6gb").resolve(),
            ExistingGpuNode(name="bm-5", gpus={"L40S": 1}, workload="vm-passthrough").resolve())).capacity())),
         ["GpuSmokeTestArgs.resource: no container node advertises nvidia.com/gpu (nvidia.com/mig-1g.6gb)"]),
        (lambda: KubeVirtGpuDevicesArgs(nodes=(VGPU,)),  # type: ignore[arg-type]
         ["KubeVirtGpuDevicesArgs.nodes[0] (bm-2): bm-2: an ExistingGpuNode; pass ExistingGpuNode(...).resolve(), the node "
          "as the stack sees it"]),
        (lambda: KubeVirtGpuDevicesArgs(kubevirt={"enabled": True, "feature_gates": "x"}, nodes=()),  # type: ignore[arg-type]
         ["KubeVirtGpuDevicesArgs.kubevirt.feature_gates: Input should be a valid tuple"]),
    ],
)  # fmt: skip
def test_bad_args_are_lines(build: object, lines: list[str]) -> None:
    with pytest.raises(InvalidComponentArgs) as err:
        build()  # type: ignore[operator]
    assert err.value.lines == lines


def test_release_after_orders_the_release_alone() -> None:
    """What only the release waits for: the namespace and ConfigMaps (and the DRA namespace) are created meanwhile,
    which opts.depends_on (delaying every child's registration) could not say."""

    def program() -> None:
        opts = k8s()
        labels = pulumi.CustomResource("test:index:Labels", "labels", {})
        stack = GpuStack(operator=GpuOperatorSpec(), nodes=(SHARED.resolve(),))
        GpuOperator("op", GpuOperatorArgs(stack=stack, release_after=(labels,)), opts)
        DraDriver("dra", DraDriverArgs(driver_mode="host", release_after=(labels,)), opts)

    rec = run(program)
    labels = rec.named("labels")
    for name in ("op-release", "dra-release"):
        assert labels.urn in rec.named(name).dependencies, name
    for name in ("op-namespace", "op-device-plugin-config", "dra-namespace"):
        assert not rec.depends_on(rec.named(name), labels), name
