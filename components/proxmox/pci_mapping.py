"""IOMMU preflight over the Proxmox API, and GpuPciMappings: a datacenter PCI mapping per passthrough GPU.

One mapping per GPU rather than one per model with a map entry per node and card: a worker claims specific
cards, and a VM that references a multi-device mapping gets whichever mapped card Proxmox finds free. Per-GPU
mappings keep that deterministic, and replacing one card touches only its own mapping. VMs reference mappings
(``hostpci.mapping``), which API tokens may use (``Mapping.Use``); a raw ``hostpci.id`` needs root@pam.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pulumi
import pulumi_proxmoxve as proxmoxve
from pydantic import Field, model_validator

from proxmox_gpu_cluster.args import ComponentArgs, Input
from proxmox_gpu_cluster.core.errors import Problem, SpecError, SpecViolations
from proxmox_gpu_cluster.core.iommu import NodePreflight, PciDevice, described_devices, pci_device, preflight_node
from proxmox_gpu_cluster.core.names import StackScope
from proxmox_gpu_cluster.core.spec import ClusterSpec, ProxmoxNode
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import caller_dependencies
from proxmox_gpu_cluster.outputs import current_scope, item


class IommuPreflightError(SpecError, pulumi.RunError):
    """The hosts do not match the spec; one line per problem, each naming its config path (below ``root``). A
    ``SpecError`` (the library's one error type) and a ``pulumi.RunError`` for the CLI."""

    def __init__(self, problems: list[Problem], root: str = "cluster") -> None:
        SpecError.__init__(self, problems, root=root)
        self.args = ("IOMMU preflight failed:\n" + "\n".join(self.lines),)


def read_pci_devices(
    node: str, provider: proxmoxve.Provider | None, parent: pulumi.Resource | None = None
) -> list[PciDevice] | None:
    """Every PCI function of ``node`` (bridges included: the default class blacklist would hide them); None when
    the answer holds no device list at all, which the provider never gives (it answers ``[]`` for none) and a mock
    engine does (Pulumi's testing guide answers every call with ``{}``)."""
    result = proxmoxve.hardware.get_pci(
        node_name=node, pci_class_blacklists=[], opts=pulumi.InvokeOptions(provider=provider, parent=parent)
    )
    if result.devices is None:
        return None
    return [
        pci_device(
            d.id, d.vendor, d.device, d.class_, d.iommu_group, d.subsystem_vendor, d.subsystem_device, d.device_name
        )
        for d in result.devices
    ]


def run_preflight(
    spec: ClusterSpec | ProxmoxNode | Sequence[ProxmoxNode],
    provider: proxmoxve.Provider | None,
    *,
    parent: pulumi.Resource | None = None,
) -> dict[str, NodePreflight]:
    """Preflight every node with passthrough GPUs; raise IommuPreflightError with all problems of all nodes.
    ``spec``: a cluster's spec (paths ``cluster.proxmox.nodes[i]...``), or the Proxmox nodes alone, for programs
    that wire the Proxmox components without a ``ClusterSpec`` (paths ``ProxmoxNode (<name>).gpus[i]...``).

    A synchronous invoke on purpose: the answer decides which resources exist, so it must be known before any
    of them registers (and it runs in ``pulumi preview`` too). An answer without a device list (a mock engine's
    ``{}``) is checked as a host exactly like the node's spec (``described_devices``).
    """
    if isinstance(spec, ClusterSpec):
        nodes = [(f"proxmox.nodes[{i}]", n) for i, n in enumerate(spec.proxmox.nodes)]
        root = "cluster"
    else:
        alone = [spec] if isinstance(spec, ProxmoxNode) else list(spec)
        nodes = [(f"ProxmoxNode ({n.name})", n) for n in alone]
        root = ""  # each path names its node
    results: dict[str, NodePreflight] = {}
    problems: list[Problem] = []
    for at, node in nodes:
        if not node.passthrough_gpus:
            continue
        devices = read_pci_devices(node.name, provider, parent)
        if devices is None:
            devices = described_devices([g for _, g in node.passthrough_gpus])
        result = preflight_node(node, devices, at=at)
        problems += result.problems
        if result.check == "host-verify" and not node.host_prep:
            problems.append(
                Problem(
                    f"{at}.hostPrep",
                    f"node {node.name} reports no IOMMU groups (IOMMU is off); set hostPrep: true or enable "
                    "IOMMU on the host yourself",
                )
            )
        results[node.name] = result
    if problems:
        raise IommuPreflightError(problems, root)
    return results


class GpuPciMappingsArgs(ComponentArgs):
    """One node's passthrough GPUs and what its IOMMU preflight found."""

    node: ProxmoxNode = Field(description="The Proxmox node as the spec describes it.")
    result: NodePreflight = Field(description="The node's IOMMU preflight (``run_preflight``), without problems.")
    scope: StackScope | None = Field(
        default=None, description="The project and stack the mapping ids belong to (default: this program's)."
    )
    verified_groups: Input[Mapping[str, int]] | None = Field(
        default=None,
        description="PCI path -> IOMMU group from host prep's verify step (``ProxmoxHostGpuPrep.groups``), used "
        "when the preflight deferred the isolation check (IOMMU not yet on, or the ACS override requested).",
    )

    @model_validator(mode="after")
    def _matches_node(self) -> GpuPciMappingsArgs:
        problems = [Problem("result.problems", f"the preflight found {len(self.result.problems)} problem(s); "
                            "run_preflight raises them")] if self.result.problems else []  # fmt: skip
        if self.result.node != self.node.name:
            problems.append(
                Problem("result.node", f"expected {self.node.name!r} (node.name), saw {self.result.node!r}")
            )
        declared = {g.name for _, g in self.node.passthrough_gpus}
        problems += [
            Problem(f"result.gpus[{i}].gpu", f"node {self.node.name} passes through no GPU {p.gpu!r} "
                    f"(known: {', '.join(sorted(declared)) or 'none'})")
            for i, p in enumerate(self.result.gpus) if p.gpu not in declared
        ]  # fmt: skip
        if problems:
            raise SpecViolations(problems)
        return self


class GpuPciMappings(pulumi.ComponentResource):
    """A ``proxmoxve.hardware.mapping.Pci`` per passthrough GPU of one node: every GPU the node declares except the
    console GPU, claimed by a worker or not, so adding or removing workers never adds or removes mappings.

    Children are named ``<name>-<pci path>`` (``pve1-pci-0000:41:00``), not by GPU name: node and GPU names may both
    contain dashes, so ``<node>-pci-<gpu>`` gave node ``a`` + GPU ``pci-b`` and node ``a-pci`` + GPU ``b`` one URN;
    a PCI path has a fixed shape without dashes.
    """

    mappings: pulumi.Output[dict[str, str]]
    """GPU name -> mapping name."""
    by_gpu: dict[str, proxmoxve.hardware.mapping.Pci]
    """GPU name -> its mapping resource: a VM names and waits for the mappings of its own GPUs only."""

    def __init__(self, name: str, args: GpuPciMappingsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the Proxmox provider in ``opts.provider`` (the children inherit it); ``opts.depends_on`` (host
        prep, when the mappings take its verified groups) reaches every mapping."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:pci_mapping:GpuPciMappings", name, None, opts)
        node, result = args.node, args.result
        scope = args.scope or current_scope()
        gpus = {g.name: g for _, g in node.passthrough_gpus}
        child = pulumi.ResourceOptions(parent=self, depends_on=caller_dependencies(opts))
        names: dict[str, pulumi.Output[str]] = {}
        self.by_gpu = {}
        for placement in result.gpus:
            gpu = gpus[placement.gpu]
            group: pulumi.Input[int] | None = placement.iommu_group
            if group is None and args.verified_groups is not None:
                group = item(args.verified_groups, placement.slot)
            mapping = proxmoxve.hardware.mapping.Pci(
                f"{name}-{gpu.pci_path}",
                proxmoxve.hardware.mapping.PciArgs(
                    name=scope.mapping_id(node.name, gpu.name),
                    comment=f"proxmox-gpu-cluster {scope.project}/{scope.stack}: {gpu.model} {node.name}/{gpu.name}",
                    maps=[
                        proxmoxve.hardware.mapping.PciMapArgs(
                            id=gpu.vendor_device,
                            node=node.name,
                            # No function: every function of the card passes through together.
                            path=gpu.pci_path,
                            iommu_group=group,
                            subsystem_id=placement.subsystem,
                        )
                    ],
                ),
                opts=child,
            )
            names[gpu.name] = mapping.name
            self.by_gpu[gpu.name] = mapping
        self.mappings = pulumi.Output.all(**names) if names else pulumi.Output.from_input({})
        self.register_outputs({"mappings": self.mappings})
