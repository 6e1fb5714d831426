"""proxmox-gpu-cluster: load the stack's spec and secrets, build the cluster, export the results."""

from proxmox_gpu_cluster import GpuCluster, export, load

spec, secrets = load()
export(GpuCluster("cluster", spec, secrets))
