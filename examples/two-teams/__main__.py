"""Two teams' GPU clusters in one program: each from its own config namespace (vision:cluster, speech:cluster, and
each namespace's secrets), on the same Proxmox node and in the same Kubernetes cluster.

What they share is composed: each cluster's names on Proxmox carry its own scope, and host prep binds the union of
both clusters' GPUs on the shared node (one drop-in per cluster). What exists once (a GPU, a VM id, a Kubernetes
node, the GPU Operator, the rollout slots' namespace) belongs to one of them: a second claim is refused before
anything registers, naming both clusters.
"""

import pulumi

from proxmox_gpu_cluster import GpuCluster, GpuClusterArgs, load

spec, secrets = load("vision")
vision = GpuCluster("vision", GpuClusterArgs(spec=spec, secrets=secrets))
spec, secrets = load("speech")
speech = GpuCluster("speech", GpuClusterArgs(spec=spec, secrets=secrets))

pulumi.export("visionWorkers", vision.workers)
pulumi.export("speechWorkers", speech.workers)
