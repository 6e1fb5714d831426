"""The whole GPU cluster as one component inside a bigger program: the team's inference release waits for the GPU
Operator and uses the cluster's Kubernetes provider."""

import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster import GpuCluster, GpuClusterArgs, load

spec, secrets = load()  # from this project's namespace: ml-platform:cluster and its secrets
cluster = GpuCluster("gpu", GpuClusterArgs(spec=spec, secrets=secrets))
after_operator = [cluster.operator] if cluster.operator is not None else []

namespace = kubernetes.core.v1.Namespace(
    "inference",
    metadata=kubernetes.meta.v1.ObjectMetaArgs(name="inference"),
    opts=pulumi.ResourceOptions(provider=cluster.providers.kubernetes),
)
release = kubernetes.helm.v3.Release(
    "inference-server",
    kubernetes.helm.v3.ReleaseArgs(
        chart="inference-server",
        version="1.4.2",
        repository_opts=kubernetes.helm.v3.RepositoryOptsArgs(repo="https://charts.lab.internal"),
        namespace=namespace.metadata.name,
        values={
            "resources": {"limits": {"nvidia.com/gpu": 1}},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    ),
    opts=pulumi.ResourceOptions(provider=cluster.providers.kubernetes, depends_on=after_operator),
)

pulumi.export("workers", cluster.workers)
pulumi.export("capacity", cluster.capacity)
pulumi.export("inferenceStatus", release.status.apply(lambda s: s.status))
