"""proxmox-gpu-cluster: load the stack's spec and secrets, build the cluster, export the results."""

from proxmox_gpu_cluster import GpuCluster, export, load

spec, secrets = load()
# The stacks created their resources at the root before GpuCluster existed: aliases keep every URN's identity.
export(GpuCluster("cluster", spec, secrets, aliases_from_stack_root=True))
