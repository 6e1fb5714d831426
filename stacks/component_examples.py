"""Complete minimal programs for docs/components.md, one per component that has one, and the unit test of a
program written as Pulumi's testing guide shows. The generator (``component_reference``) prints them under their
component as written; tests/stacks/test_component_examples.py runs each from the rendered file, under the offline
plan's mock engine and under ``pulumi.runtime.set_mocks`` with a mock that echoes inputs (preview on and off).

Secrets come from config (``SECRETS``): set them with ``pulumi config
set --secret``; everything else is written out, as a program of one's own would."""

from __future__ import annotations

SECRETS = ("sshPrivateKey", "proxmoxApiToken", "kubeconfig", "kubeadmJoinToken", "kubeadmCaCertHash")
"""The config keys the examples read (all secrets)."""

_NODE = """\
from proxmox_gpu_cluster.core.spec import HostGpu, ProxmoxNode

# The node's spec alone: no ClusterSpec is needed to wire the Proxmox components.
node = ProxmoxNode(
    name="pve1",
    ssh_address="192.0.2.11",
    cpu_vendor="amd",
    host_prep=True,
    gpus=(HostGpu(name="a100-0", pci_path="0000:41:00", model="A100-SXM4-80GB"),),
)
"""

_PROXMOX = """\
config = pulumi.Config()
proxmox = proxmoxve.Provider(
    "pve", endpoint="https://pve1.example.test:8006/", api_token=config.require_secret("proxmoxApiToken")
)
"""

_STACK = """\
from proxmox_gpu_cluster.core.nodes import ExistingGpuNode
from proxmox_gpu_cluster.core.operator_spec import GpuOperatorSpec
from proxmox_gpu_cluster.render.gpu_stack import GpuStack

k8s = kubernetes.Provider("k8s", kubeconfig=pulumi.Config().require_secret("kubeconfig"))
# Nodes this program did not provision, by name, GPU model and count.
stack = GpuStack(
    operator=GpuOperatorSpec(driver_branch="580"),
    nodes=(ExistingGpuNode(name="gpu-bm-01", gpus={"A10": 2}).resolve(),),
)
"""

_MIG = """\
import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.guest_spec import ExpectedGpu, GuestBootstrapSpec, RolloutSpec

a100 = CATALOG["A100-PCIE-40GB"]
node = GuestBootstrapSpec(
    node_name="gpu-bm-03",
    gpus=(ExpectedGpu(vendor_device=a100.vendor_device, product=a100.product),),
    driver_mode="host",
    driver_branch="580",
    kernel_modules="open",
    toolkit=True,
    api_endpoint="k8s.example.test:6443",
    kubernetes_minor=34,
    rollout=RolloutSpec(),  # a MIG rollout cordons and drains the node, one node at a time
)
step = dict(
    bootstrap=node,
    mig_config="all-1g.5gb",
    operator_namespace="gpu-operator",
    timeout_seconds=900,
    host="192.0.2.33",
    user="ubuntu",
    ssh_private_key=pulumi.Config().require_secret("sshPrivateKey"),
)
ssh = pulumi.ResourceOptions(provider=command.Provider("ssh"))
"""

EXAMPLES: dict[str, str] = {
    "ProxmoxHostGpuPrep": f"""\
import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.proxmox.host_gpu_prep import ProxmoxHostGpuPrep, ProxmoxHostGpuPrepArgs

{_NODE}
args = ProxmoxHostGpuPrepArgs(
    node=node, owner="lab", ssh_user="root", ssh_private_key=pulumi.Config().require_secret("sshPrivateKey")
)
prep = ProxmoxHostGpuPrep("pve1-host-prep", args, pulumi.ResourceOptions(provider=command.Provider("ssh")))
pulumi.export("rebootRequired", prep.reboot_required)
""",
    "GpuPciMappings": f"""\
import pulumi
import pulumi_proxmoxve as proxmoxve

from proxmox_gpu_cluster.proxmox.pci_mapping import GpuPciMappings, GpuPciMappingsArgs, run_preflight

{_NODE}
{_PROXMOX}
# The IOMMU preflight of the node alone; every problem at once (IommuPreflightError) before anything registers.
preflight = run_preflight(node, proxmox)["pve1"]
mappings = GpuPciMappings(
    "pve1-pci", GpuPciMappingsArgs(node=node, result=preflight), pulumi.ResourceOptions(provider=proxmox)
)
pulumi.export("mappings", mappings.mappings)
""",
    "WorkerBootFiles": f"""\
import pulumi
import pulumi_proxmoxve as proxmoxve

from proxmox_gpu_cluster.core.worker_spec import Image
from proxmox_gpu_cluster.proxmox.boot_files import WorkerBootFiles, WorkerBootFilesArgs

{_PROXMOX}
image = Image(cloud_image_url="https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img")
files = WorkerBootFiles(
    "pve1-files", WorkerBootFilesArgs(node_name="pve1", images=(image,)), pulumi.ResourceOptions(provider=proxmox)
)
pulumi.export("vendorData", files.vendor_data_volume)
""",
    "GpuWorkerVm": f"""\
import pulumi
import pulumi_proxmoxve as proxmoxve

from proxmox_gpu_cluster.core.worker_spec import Worker
from proxmox_gpu_cluster.proxmox.worker_vm import GpuWorkerVm, WorkerVmArgs

{_PROXMOX}
worker = Worker(name="gpu-1", vmid=4101, node="pve1", gpus=("l4-0",), image={{"templateVmid": 9000}})
vm = GpuWorkerVm(
    "gpu-1",
    WorkerVmArgs(
        worker=worker,
        gpu_models=("L4",),  # an A100 (large BAR) in token mode also needs node_ssh_address
        ssh_public_keys=("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBxYhxkAFq8yGtzKQpNLT3ZN0r6Jw1c0Kf3z8lL0Q1u1 ops@lab",),
        mappings={{"l4-0": "lab-l4-0"}},  # the PCI mapping of each GPU (GpuPciMappings.mappings)
        vendor_data_file_id="local:snippets/gpu-1-vendor.yaml",
    ),
    pulumi.ResourceOptions(provider=proxmox),
)
pulumi.export("vmId", vm.vm_id)
""",
    "GpuNodeLabels": f"""\
import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.gpu.gpu_node import GpuNodeLabels, GpuNodeLabelsArgs

{_STACK}
GpuNodeLabels("gpu-nodes", GpuNodeLabelsArgs(stack=stack), pulumi.ResourceOptions(provider=k8s))
""",
    "GpuOperator": f"""\
import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.gpu.gpu_node import GpuNodeLabels, GpuNodeLabelsArgs
from proxmox_gpu_cluster.gpu.gpu_operator import GpuOperator, GpuOperatorArgs

{_STACK}
labels = GpuNodeLabels("gpu-nodes", GpuNodeLabelsArgs(stack=stack), pulumi.ResourceOptions(provider=k8s))
operator = GpuOperator(
    "gpu-operator", GpuOperatorArgs(stack=stack, release_after=(labels,)), pulumi.ResourceOptions(provider=k8s)
)
pulumi.export("releaseStatus", operator.release_status)
""",
    "GpuQuotas": f"""\
import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.core.scheduling_spec import Quota
from proxmox_gpu_cluster.gpu.gpu_quota import GpuQuotas, GpuQuotasArgs

{_STACK}
quotas = (Quota(namespace="team-a", resources={{"nvidia.com/gpu": 1}}),)
GpuQuotas(
    "gpu-quotas",
    GpuQuotasArgs(quotas=quotas, capacity=tuple(stack.capacity())),
    pulumi.ResourceOptions(provider=k8s),
)
""",
    "GpuPriorityClasses": """\
import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.core.scheduling_spec import PriorityClassSpec
from proxmox_gpu_cluster.gpu.priority_classes import GpuPriorityClasses, GpuPriorityClassesArgs

k8s = kubernetes.Provider("k8s", kubeconfig=pulumi.Config().require_secret("kubeconfig"))
classes = (PriorityClassSpec(name="gpu-training", value=1000), PriorityClassSpec(name="gpu-batch", value=100))
GpuPriorityClasses("gpu-priorities", GpuPriorityClassesArgs(classes=classes), pulumi.ResourceOptions(provider=k8s))
""",
    "GpuMonitoring": f"""\
import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.core.monitoring_spec import MonitoringSpec
from proxmox_gpu_cluster.gpu.gpu_monitoring import GpuMonitoring, GpuMonitoringArgs

{_STACK}
GpuMonitoring(
    "gpu-monitoring",
    GpuMonitoringArgs(monitoring=MonitoringSpec(prometheus=True), operator_namespace="gpu-operator", nodes=stack.nodes),
    pulumi.ResourceOptions(provider=k8s),
)
""",
    "GpuSmokeTest": """\
import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.gpu.smoke_test import GpuSmokeTest, GpuSmokeTestArgs

k8s = kubernetes.Provider("k8s", kubeconfig=pulumi.Config().require_secret("kubeconfig"))
args = GpuSmokeTestArgs(resource="nvidia.com/gpu", namespace="gpu-operator")
GpuSmokeTest("gpu-smoke-test", args, pulumi.ResourceOptions(provider=k8s))
""",
    "NodeStepAccess": """\
import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.gpu.node_access import NodeStepAccess, NodeStepAccessArgs

k8s = kubernetes.Provider("k8s", kubeconfig=pulumi.Config().require_secret("kubeconfig"))
access = NodeStepAccess(
    "node-steps", NodeStepAccessArgs(slot_namespace="gpu-rollouts"), pulumi.ResourceOptions(provider=k8s)
)
pulumi.export("slotNamespace", access.namespace)
""",
    "DraDriver": """\
import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.gpu.dra_driver import DraDriver, DraDriverArgs

k8s = kubernetes.Provider("k8s", kubeconfig=pulumi.Config().require_secret("kubeconfig"))
DraDriver("gpu-dra", DraDriverArgs(driver_mode="host"), pulumi.ResourceOptions(provider=k8s))
""",
    "GuestBootstrap": """\
import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.guest_spec import ExpectedGpu, GuestBootstrapSpec
from proxmox_gpu_cluster.guest.guest_bootstrap import GuestBootstrap, GuestBootstrapArgs

config = pulumi.Config()
a10 = CATALOG["A10"]
spec = GuestBootstrapSpec(
    node_name="gpu-bm-01",
    gpus=(ExpectedGpu(vendor_device=a10.vendor_device, product=a10.product),),
    driver_mode="host",
    driver_branch="580",
    kernel_modules="open",
    toolkit=True,
    api_endpoint="k8s.example.test:6443",
    kubernetes_minor=34,
)
GuestBootstrap(
    "gpu-bm-01",
    GuestBootstrapArgs(
        bootstrap=spec,
        host="192.0.2.31",
        user="ubuntu",
        ssh_private_key=config.require_secret("sshPrivateKey"),
        join_token=config.require_secret("kubeadmJoinToken"),
        ca_cert_hash=config.require_secret("kubeadmCaCertHash"),
    ),
    pulumi.ResourceOptions(provider=command.Provider("ssh")),
)
""",
    "GpuCluster": """\
from proxmox_gpu_cluster import GpuCluster, GpuClusterArgs, export, load

# The spec from the stack's config (<project>:cluster) and every secret it needs; all problems at once.
spec, secrets = load()
export(GpuCluster("cluster", GpuClusterArgs(spec=spec, secrets=secrets)))
""",
    "NodeCapacityGate": """\
import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.guest.capacity_gate import NodeCapacityGate, NodeCapacityGateArgs

args = NodeCapacityGateArgs(
    node_name="gpu-bm-01",
    resources={"nvidia.com/gpu": 2},
    host="192.0.2.31",
    user="ubuntu",
    ssh_private_key=pulumi.Config().require_secret("sshPrivateKey"),
)
gate = NodeCapacityGate("gpu-bm-01-capacity", args, pulumi.ResourceOptions(provider=command.Provider("ssh")))
pulumi.export("verified", gate.verified)
""",
    "NodeCapacityGates": """\
import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.guest.capacity_gate import GateTarget, NodeCapacityGates, NodeCapacityGatesArgs

targets = {
    "gpu-bm-01": GateTarget(resources={"nvidia.com/gpu": 2}, host="192.0.2.31", user="ubuntu"),
    "gpu-bm-02": GateTarget(resources={"nvidia.com/gpu": 4}, host="192.0.2.32", user="ubuntu"),
}
NodeCapacityGates(
    "capacity",
    NodeCapacityGatesArgs(targets=targets, ssh_private_key=pulumi.Config().require_secret("sshPrivateKey")),
    pulumi.ResourceOptions(provider=command.Provider("ssh")),
)
""",
    "WorkerRetirement": """\
import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.core.spec import DrainSpec
from proxmox_gpu_cluster.proxmox.worker_retirement import WorkerRetirement, WorkerRetirementArgs

args = WorkerRetirementArgs(
    node_name="gpu-1",
    vmid=4101,
    host="192.0.2.11",
    ssh_user="root",
    guest_user="ubuntu",
    ssh_private_key=pulumi.Config().require_secret("sshPrivateKey"),
    api_endpoint="k8s.example.test:6443",
    drain=DrainSpec(),
    kubeadm_reset=True,
)
WorkerRetirement("gpu-1-retirement", args, pulumi.ResourceOptions(provider=command.Provider("ssh")))
""",
    "KubeVirtGpuDevices": """\
import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.core.nodes import ExistingGpuNode
from proxmox_gpu_cluster.core.spec import KubeVirtSpec
from proxmox_gpu_cluster.gpu.kubevirt_devices import KubeVirtGpuDevices, KubeVirtGpuDevicesArgs

k8s = kubernetes.Provider("k8s", kubeconfig=pulumi.Config().require_secret("kubeconfig"))
node = ExistingGpuNode(name="gpu-vm-host-01", gpus={"A10": 2}, workload="vm-passthrough").resolve()
devices = KubeVirtGpuDevices(
    "kubevirt-gpus",
    KubeVirtGpuDevicesArgs(kubevirt=KubeVirtSpec(enabled=True), nodes=(node,)),
    pulumi.ResourceOptions(provider=k8s),
)
pulumi.export("pciResources", devices.pci_resources)
""",
    "MigDrain": f"""\
{_MIG}
from proxmox_gpu_cluster.guest.mig_rollout import MigDrain, MigDrainArgs

MigDrain("gpu-bm-03-mig", MigDrainArgs(**step), ssh)
""",
    "MigSettle": f"""\
{_MIG}
from proxmox_gpu_cluster.guest.mig_rollout import MigDrain, MigDrainArgs, MigSettle, MigSettleArgs

drain = MigDrain("gpu-bm-03-mig", MigDrainArgs(**step), ssh)
# In GpuCluster the operator's label change comes between the two; here the settle step follows the drain.
after_drain = pulumi.ResourceOptions(provider=command.Provider("ssh-settle"), depends_on=[drain])
MigSettle("gpu-bm-03-mig-settle", MigSettleArgs(**step), after_drain)
""",
}
"""Component class name -> a complete program that plans (``python -m proxmox_gpu_cluster.plan``)."""

UNIT_TEST = '''\
import pulumi


class EchoMocks(pulumi.runtime.Mocks):
    """As Pulumi's testing guide writes them: every resource echoes its inputs, every call answers {}."""

    def new_resource(self, args):
        return [args.name + "_id", args.inputs]

    def call(self, args):
        return {}


pulumi.runtime.set_mocks(EchoMocks(), preview=False)
pulumi.runtime.set_all_config({"project:sshPrivateKey": "k"}, secret_keys=["project:sshPrivateKey"])

from proxmox_gpu_cluster.core.spec import HostGpu, ProxmoxNode  # noqa: E402 (after set_mocks, as the guide does)
from proxmox_gpu_cluster.proxmox.host_gpu_prep import ProxmoxHostGpuPrep, ProxmoxHostGpuPrepArgs  # noqa: E402

node = ProxmoxNode(name="pve1", ssh_address="192.0.2.11", cpu_vendor="amd", host_prep=True,
                   gpus=(HostGpu(name="a100-0", pci_path="0000:41:00", model="A100-SXM4-80GB"),))
args = ProxmoxHostGpuPrepArgs(node=node, owner="lab", ssh_user="root", ssh_private_key="k")
prep = ProxmoxHostGpuPrep("pve1-host-prep", args)


@pulumi.runtime.test
def test_no_reboot_is_pending_when_the_step_reports_none():
    def check(required):
        assert required is False  # the mock's step printed nothing: no "reboot: required" line

    return prep.reboot_required.apply(check)
'''
"""A user's unit test of a program that uses the components, under ``pulumi.runtime.set_mocks``."""
