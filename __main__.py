"""proxmox-gpu-cluster: load the stack's spec and secrets, build the cluster, export the results."""

from proxmox_gpu_cluster import GpuCluster, GpuClusterArgs, export, load

spec, secrets = load()
# The stacks created their resources at the root before GpuCluster existed (aliases keep every URN's identity), and
# their names on Proxmox before clusters were scoped (kept, so nothing on the hosts is renamed).
args = GpuClusterArgs(spec=spec, secrets=secrets, aliases_from_stack_root=True, stack_scoped_names=True)
export(GpuCluster("cluster", args))
