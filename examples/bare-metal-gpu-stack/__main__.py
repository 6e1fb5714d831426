"""The GPU stack on nodes this program did not provision: labels and taints, the GPU Operator with time-slicing,
and a quota. No Proxmox anywhere: the nodes are given by name, GPU model and count."""

import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.core.capacity import capacity_output
from proxmox_gpu_cluster.core.operator_spec import GpuOperatorSpec
from proxmox_gpu_cluster.core.scheduling_spec import Quota
from proxmox_gpu_cluster.gpu.gpu_node import GpuNodeLabels, GpuNodeLabelsArgs
from proxmox_gpu_cluster.gpu.gpu_operator import GpuOperator, GpuOperatorArgs
from proxmox_gpu_cluster.gpu.gpu_quota import GpuQuotas, GpuQuotasArgs
from proxmox_gpu_cluster.render.gpu_stack import GpuStack
from proxmox_gpu_cluster.stacks.config import load_model, load_nodes

config = pulumi.Config()
k8s = kubernetes.Provider("k8s", kubeconfig=config.require_secret("kubeconfig"))

# One GpuStack for both components: the time-slicing ConfigMap and the labels that name it are computed once.
stack = GpuStack(operator=load_model(GpuOperatorSpec, "gpuOperator"), nodes=tuple(load_nodes("gpuNodes")))
labels = GpuNodeLabels("gpu-nodes", GpuNodeLabelsArgs(stack=stack), pulumi.ResourceOptions(provider=k8s))
# The release waits for the labels; the namespace and ConfigMaps are created meanwhile.
operator = GpuOperator(
    "gpu-operator", GpuOperatorArgs(stack=stack, release_after=(labels,)), pulumi.ResourceOptions(provider=k8s)
)
# Judged against what the nodes advertise: a quota on a resource no node has is refused.
quotas = GpuQuotasArgs(quotas=(load_model(Quota, "quota"),), capacity=tuple(stack.capacity()))
GpuQuotas("gpu-quotas", quotas, pulumi.ResourceOptions(provider=k8s))

# What each node will advertise, in the shape the offline plan prints as its capacity table.
pulumi.export("capacity", capacity_output(stack.capacity()))
pulumi.export("operatorNamespace", operator.namespace)
