"""KubeVirtGpuDevices: the GPU host devices and feature gates on an existing KubeVirt custom resource."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as kubernetes
from pydantic import Field, model_validator

from proxmox_gpu_cluster.args import ComponentArgs
from proxmox_gpu_cluster.core.errors import SpecViolations
from proxmox_gpu_cluster.core.spec import KubeVirtSpec
from proxmox_gpu_cluster.engine_version import require_cli
from proxmox_gpu_cluster.node_agent import caller_dependencies
from proxmox_gpu_cluster.render.gpu_stack import GpuNodes, nodes_problems
from proxmox_gpu_cluster.render.kubevirt import API_VERSION, kubevirt_patch_spec


class KubeVirtGpuDevicesArgs(ComponentArgs):
    """Which KubeVirt CR to patch and the nodes whose GPUs it must permit."""

    kubevirt: KubeVirtSpec = Field(
        default_factory=KubeVirtSpec, description="The KubeVirt CR (name, namespace) and the feature gates it keeps."
    )
    nodes: GpuNodes = Field(
        description="The GPU nodes (``ExistingGpuNode(...).resolve()``, ``GpuStack.nodes``) whose vm-passthrough "
        "GPUs and vGPU types the CR must permit."
    )

    @model_validator(mode="after")
    def _nodes(self) -> KubeVirtGpuDevicesArgs:
        problems = nodes_problems(self.nodes)
        if problems:
            raise SpecViolations(problems)
        return self


class KubeVirtGpuDevices(pulumi.ComponentResource):
    """A server-side-apply patch of the KubeVirt CR (``kubevirt.io/v1`` ``KubeVirt``, ``kubevirt.name`` in
    ``kubevirt.namespace``) permitting every GPU model of the vm-passthrough nodes and every vGPU type of the
    vm-vgpu nodes, with the ``HostDevices`` gate.

    KubeVirt is installed separately; the CR must exist. ``pulumi.com/patchForce`` takes the device and gate
    lists over from their previous field manager (``kubectl``, an installer): the lists are atomic, so the spec's
    ``kubevirt.featureGates`` must name every gate the cluster keeps. Where the HyperConverged Cluster Operator
    owns the KubeVirt CR it reconciles the CR back from its ``HyperConverged`` resource and undoes this patch;
    configure ``permittedHostDevices`` on the HyperConverged CR there instead (see docs/kubevirt.md).
    """

    pci_resources: pulumi.Output[list[str]]
    """Resource names of the permitted whole GPUs."""
    mediated_resources: pulumi.Output[list[str]]
    """Resource names of the permitted vGPU types."""
    feature_gates: pulumi.Output[list[str]]
    """The feature gates the CR is left with."""

    def __init__(self, name: str, args: KubeVirtGpuDevicesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """``opts``: the Kubernetes provider in ``opts.provider`` (the patch inherits it); ``opts.depends_on``
        reaches the patch."""
        require_cli()  # before anything registers
        super().__init__("proxmox-gpu-cluster:kubevirt_devices:KubeVirtGpuDevices", name, None, opts)
        kv = args.kubevirt
        body = kubevirt_patch_spec(args.nodes, kv.feature_gates)
        patch = kubernetes.apiextensions.CustomResourcePatch(
            f"{name}-kubevirt",
            api_version=API_VERSION,
            kind="KubeVirt",
            metadata=kubernetes.meta.v1.ObjectMetaArgs(
                name=kv.name, namespace=kv.namespace, annotations={"pulumi.com/patchForce": "true"}
            ),
            spec=body,
            opts=pulumi.ResourceOptions(parent=self, depends_on=caller_dependencies(opts)),
        )
        # Derived from the patch so that whoever uses them waits for it.
        permitted = body["configuration"]["permittedHostDevices"]
        pci = sorted({d["resourceName"] for d in permitted.get("pciHostDevices", [])})
        mdev = [d["resourceName"] for d in permitted.get("mediatedDevices", [])]
        gates = list(body["configuration"]["developerConfiguration"]["featureGates"])
        self.pci_resources = patch.urn.apply(lambda _: pci)
        self.mediated_resources = patch.urn.apply(lambda _: mdev)
        self.feature_gates = patch.urn.apply(lambda _: gates)
        self.register_outputs(
            {
                "pciResources": self.pci_resources,
                "mediatedResources": self.mediated_resources,
                "featureGates": self.feature_gates,
            }
        )
