"""Compose the Proxmox layer: IOMMU preflight, host prep, PCI mappings, boot files and worker VMs per node."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_proxmoxve as proxmoxve

from proxmox_gpu_cluster.cluster import adapters
from proxmox_gpu_cluster.core.iommu import NodePreflight
from proxmox_gpu_cluster.core.names import StackScope
from proxmox_gpu_cluster.core.spec import ClusterSpec
from proxmox_gpu_cluster.node_agent import install_agent
from proxmox_gpu_cluster.outputs import item
from proxmox_gpu_cluster.proxmox.boot_files import WorkerBootFiles, WorkerBootFilesArgs
from proxmox_gpu_cluster.proxmox.host_gpu_prep import ProxmoxHostGpuPrep, ProxmoxHostGpuPrepArgs
from proxmox_gpu_cluster.proxmox.pci_mapping import (
    GpuPciMappings,
    GpuPciMappingsArgs,
    IommuPreflightError,
    run_preflight,
)
from proxmox_gpu_cluster.proxmox.worker_vm import GpuWorkerVm
from proxmox_gpu_cluster.ssh import connection as ssh_connection

STACK_CLUSTER = "cluster"
"""The name the stack program (``__main__.py``) gives its one GpuCluster."""


@dataclass(frozen=True)
class ProxmoxLayer:
    """What the Proxmox layer created."""

    vms: dict[str, GpuWorkerVm]
    """Worker name -> its VM."""
    iommu_checks: dict[str, str]
    """Node -> which IOMMU isolation check applies: ``plan`` (preflight, now) or ``host-verify`` (after prep)."""
    host_preps: dict[str, ProxmoxHostGpuPrep]
    """Node -> its host prep (nodes with ``hostPrep``)."""
    host_agents: dict[str, command.remote.CopyToRemote]
    """Node -> the node agent's copy there (every node with workers: their retirements run there)."""


def build_proxmox(
    spec: ClusterSpec,
    *,
    prefix: str,
    parent: pulumi.Resource,
    proxmox: proxmoxve.Provider,
    host_command: command.Provider,
    ssh_private_key: pulumi.Input[str] | None,
    scope: StackScope,
) -> ProxmoxLayer:
    """Preflight every node first (an error stops the program before anything registers past the providers),
    then per node: host prep (opt-in) -> PCI mappings -> boot files -> the node's worker VMs.

    Host prep and the mappings follow the GPUs a node declares, not the workers that claim them: adding, removing
    or moving a worker changes nothing on the host. ``ssh_private_key``: None means the ssh-agent
    (``proxmox.sshAgent``), and no step carries a key. ``scope``: what the names on the hosts (PCI mappings,
    snippets, images, host prep's drop-in) belong to.
    """
    try:
        preflights: dict[str, NodePreflight] = run_preflight(spec, proxmox, parent=parent)
    except IommuPreflightError as err:
        # The stack's one cluster keeps the stack file's root; any other names its GpuCluster, so in a program of
        # several clusters each line says whose host does not match.
        if prefix == STACK_CLUSTER:
            raise
        raise IommuPreflightError(list(err.problems), root=f"GpuCluster({prefix}).spec") from None
    vms: dict[str, GpuWorkerVm] = {}
    preps: dict[str, ProxmoxHostGpuPrep] = {}
    host_agents: dict[str, command.remote.CopyToRemote] = {}
    for node in spec.proxmox.nodes:
        if not node.passthrough_gpus:
            continue
        result = preflights[node.name]
        prep = None
        if node.host_prep:
            prep = preps[node.name] = ProxmoxHostGpuPrep(
                f"{prefix}-{node.name}-host-prep",
                ProxmoxHostGpuPrepArgs(
                    node=node, owner=scope.token, ssh_user=spec.proxmox.ssh_user, ssh_private_key=ssh_private_key
                ),
                pulumi.ResourceOptions(parent=parent, provider=host_command),
            )
        after_prep: list[pulumi.Resource] = [prep] if prep is not None else []
        workers = [w for w in spec.workers if w.node == node.name]
        mappings = GpuPciMappings(
            f"{prefix}-{node.name}-pci",
            GpuPciMappingsArgs(
                node=node,
                result=result,
                scope=scope,
                verified_groups=prep.groups if prep is not None and result.check == "host-verify" else None,
            ),
            pulumi.ResourceOptions(parent=parent, provider=proxmox, depends_on=after_prep),
        )
        if not workers:
            continue
        # The node agent for the workers' steps on this node (their retirement, large-BAR windows in token mode): host
        # prep's copy, or one of its own. A node without workers runs no step and is never reached over SSH.
        agent = prep.agent if prep is not None else None
        if agent is None:
            connection = ssh_connection(node.ssh_address, spec.proxmox.ssh_user, ssh_private_key)
            agent = install_agent(
                f"{prefix}-{node.name}-agent", "host", connection=connection, provider=host_command, parent=parent
            )
        host_agents[node.name] = agent
        files = WorkerBootFiles(
            f"{prefix}-{node.name}-boot-files",
            WorkerBootFilesArgs(
                node_name=node.name,
                images=tuple(w.image for w in workers),
                snippet_datastore=node.snippet_datastore,
                scope=scope,
            ),
            pulumi.ResourceOptions(parent=parent, provider=proxmox),
        )
        for worker in workers:
            url = worker.image.cloud_image_url
            # Its own GPUs' mappings only: a VM never waits for (or is blocked by) a mapping another worker uses.
            own = [mappings.by_gpu[claim.ref] for claim in worker.gpus]
            vms[worker.name] = GpuWorkerVm(
                f"{prefix}-{worker.name}",
                adapters.worker_vm(
                    spec,
                    worker,
                    mappings={claim.ref: mappings.by_gpu[claim.ref].name for claim in worker.gpus},
                    # The known volume id and an ordering edge, not the snippet's output: a VM reading that output
                    # would be deleted with every delete-first replacement of the snippet (WorkerBootFiles).
                    vendor_data_file_id=files.vendor_data_volume,
                    image_file_id=item(files.image_file_ids, url) if url else None,
                    ssh_private_key=ssh_private_key,
                ),
                pulumi.ResourceOptions(
                    parent=parent,
                    providers=[proxmox, host_command],
                    depends_on=[*own, *after_prep, agent, files.vendor_data_snippet],
                ),
            )
    return ProxmoxLayer(
        vms=vms, iommu_checks={n: r.check for n, r in preflights.items()}, host_preps=preps, host_agents=host_agents
    )
