"""The one table of change classes: for every field of the cluster spec, what a ``pulumi up`` does when an operator
changes it on a running cluster, and what that disrupts. Pure (no Pulumi).

Keys are ``<Model>.<key>``, the model and camelCase key as ``docs/spec.md`` lists them (its generator,
``stacks/reference.py``, walks the same models; a test fails when a field has no class here). A change of a list
field (``ClusterSpec.workers``, ``ProxmoxNode.gpus``...) is the adding or removing of an item; a change inside an
item is the class of that item's own field.

Classes: ``in-place`` (no machine disrupted), ``rolled`` (joined nodes change through rollout slots: slot, cordon,
drain, change, reboot if needed, verify, uncordon, release), ``vm-restart`` (the VM must be stopped and started
through Proxmox), ``host-reboot`` (host prep, as ``rebootPolicy`` allows), ``replace`` (deleted and created; a
worker's VM drained and retired first), ``refused`` (no supported path: the diff refuses it with the procedure).

``supported`` says whether ``pulumi up`` carries the change out today: a ``vm-restart`` change the provider only
writes into the VM's configuration (``reboot_after_update: false``) stays pending until someone restarts the VM,
and the diff says so with ``procedure``. The diff (``stacks/plan/classes.py``) and the drain it announces read
this table; ``docs/day2.md`` holds it as a table (``stacks/day2_table.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

ChangeClass = Literal["in-place", "rolled", "vm-restart", "host-reboot", "replace", "refused"]
CLASSES: tuple[ChangeClass, ...] = ("in-place", "rolled", "vm-restart", "host-reboot", "replace", "refused")

REPLACE_VM = "pulumi up --replace <the worker VM's URN> with the change (drained and retired first, then rebuilt)"
"""The procedure that always works for a worker: rebuild its VM from the new spec."""
RESTART_VM = (
    "kubectl drain <node> --ignore-daemonsets --delete-emptydir-data; qm shutdown <vmid> && qm start <vmid> on its "
    "Proxmox node; kubectl uncordon <node> once its GPUs show"
)
"""The procedure for a VM change the provider leaves pending."""


@dataclass(frozen=True)
class FieldClass:
    """What changing one spec field on a running cluster does."""

    change: ChangeClass
    what: str
    """What ``pulumi up`` does, in one line."""
    procedure: str = ""
    """For ``refused`` and unsupported changes: what to do instead, in one line."""
    supported: bool = True
    """Whether ``pulumi up`` carries it out today (else it stays pending or fails: see ``procedure``)."""
    refused_when: str = ""
    """A condition under which a change of an otherwise supported field is refused (``diskGiB``: a smaller one)."""
    still_when_unset: bool = False
    """A change to no value leaves the machines as they are: nothing drains (``driverVersion``: the branch pin)."""

    @property
    def drains(self) -> bool:
        """Whether the change drains joined nodes through rollout slots (the one answer the diff announces)."""
        return self.change == "rolled" or (self.change == "vm-restart" and self.supported)


def _c(
    change: ChangeClass, what: str, procedure: str = "", *, supported: bool = True, when: str = "", still: bool = False
) -> FieldClass:
    return FieldClass(change, what, procedure, supported, when, still)


_LABELS = "node labels and device-plugin configuration change; operator daemonsets may restart; nodes stay in service"
_HELM = "a GPU Operator Helm value changes; the operator reconciles its daemonsets; nodes stay in service"
_MONITORING = "a monitoring object (ServiceMonitor, PrometheusRule, dashboard or exporter ConfigMap) changes"
_ROLL = "through rollout slots: cordon, drain, change, reboot if needed, verify, uncordon"
_SETTING = "a setting of the steps changes; they run again and decide from the machine; every node stays in service"
_CLOUD_INIT = "the cloud-init drive changes; the guest reads it only at its first boot"
_RESTART = (
    "the provider writes the VM configuration, pending; the vm-restart step holds the node (rollout slot, cordon, "
    "drain), stops and starts the VM from its Proxmox node, then verify checks the hardware and uncordons"
)
_OPERATOR_ROLL = "the operator's upgrade controller settings change; nothing rolls until the driver changes"

CHANGE_CLASSES: Mapping[str, FieldClass] = {
    # ClusterSpec
    "ClusterSpec.proxmox": _c("in-place", "see ProxmoxSpec's fields"),
    "ClusterSpec.workers": _c("in-place", "an added worker is created and joined beside the others"),
    "ClusterSpec.kubernetes": _c("in-place", "see KubernetesSpec's fields"),
    "ClusterSpec.guest": _c("in-place", "see GuestSpec's fields"),
    "ClusterSpec.gpuOperator": _c("in-place", "see GpuOperatorSpec's fields"),
    "ClusterSpec.kubevirt": _c("in-place", "see KubeVirtSpec's fields"),
    "ClusterSpec.quotas": _c("in-place", "ResourceQuotas change; running pods are not evicted"),
    "ClusterSpec.priorityClasses": _c("in-place", "PriorityClasses are created or deleted; running pods keep theirs"),
    # ExistingGpuNode (the GPU-stack components' nodes, provisioned elsewhere)
    "ExistingGpuNode.name": _c("in-place", "the labels move to the named node; every node stays in service"),
    "ExistingGpuNode.gpus": _c("in-place", "the capacity table and its gate change"),
    "ExistingGpuNode.workload": _c("in-place", _LABELS),
    "ExistingGpuNode.sharing": _c("in-place", _LABELS),
    "ExistingGpuNode.timeSlicing": _c("in-place", _LABELS),
    "ExistingGpuNode.mig": _c("in-place", "its mig.config label changes; mig-manager repartitions it undrained"),
    "ExistingGpuNode.vgpuType": _c("in-place", _LABELS),
    "ExistingGpuNode.dra": _c("in-place", _LABELS),
    "ExistingGpuNode.taint": _c("in-place", "the node's taint changes; running pods stay"),
    # ProxmoxSpec
    "ProxmoxSpec.endpoint": _c("in-place", "the Proxmox provider's endpoint changes (same cluster, new address)"),
    "ProxmoxSpec.tlsVerify": _c("in-place", "the Proxmox provider's TLS setting changes"),
    "ProxmoxSpec.authMode": _c("in-place", "the Proxmox provider's credentials change; every node stays in service"),
    "ProxmoxSpec.username": _c("in-place", "the Proxmox provider's user changes"),
    "ProxmoxSpec.sshUser": _c(
        "refused",
        "the host steps would run as a user whose home holds no agent",
        "install the node agent for the new user first (run pulumi up with the old user, add the user on every "
        "node), or keep proxmox.sshUser",
        supported=False,
    ),
    "ProxmoxSpec.sshAgent": _c("in-place", "every step's SSH connection changes; every node stays in service"),
    "ProxmoxSpec.nodes": _c("host-reboot", "an added node is prepared (host prep, as rebootPolicy allows)"),
    # Worker
    "Worker.name": _c(
        "refused",
        "a renamed worker is a new VM created before the old one with the same vmid is deleted",
        "remove the worker in one pulumi up, then add it under the new name (or give it a new vmid)",
        supported=False,
    ),
    "Worker.vmid": _c("replace", "the VM is replaced delete-first: its node is drained and retired, then rebuilt"),
    "Worker.node": _c("replace", "the VM is replaced on the new node delete-first: drained and retired, rebuilt"),
    "Worker.cores": _c("vm-restart", _RESTART),
    "Worker.memoryMiB": _c("vm-restart", _RESTART),
    "Worker.diskGiB": _c(
        "in-place",
        "the provider grows the boot disk online; the guest grows its filesystem at its next boot",
        "a smaller disk cannot be made: keep diskGiB, or rebuild the worker (" + REPLACE_VM + ")",
        when="the new size is smaller (bpg/terraform-provider-proxmox v0.111.1 vm.go: Cannot shrink)",
    ),
    "Worker.datastore": _c(
        "refused",
        "the provider cannot move a running VM's disks (bpg vm.go: cannot move the Cloud-Init drive "
        "while the VM is running)",
        "keep Worker.datastore, or rebuild the worker there: " + REPLACE_VM,
        supported=False,
    ),
    "Worker.image": _c("in-place", "boot inputs apply only to VMs created afterwards (ignoreChanges)"),
    "Worker.network": _c("in-place", "see Network's fields"),
    "Worker.sshUser": _c(
        "refused",
        "the guest steps would log in as a user cloud-init never created",
        "keep Worker.sshUser, or rebuild the worker with it: " + REPLACE_VM,
        supported=False,
    ),
    "Worker.gpus": _c("vm-restart", _RESTART + " (the new GPUs)"),
    "Worker.workload": _c("rolled", _ROLL + " (driver mode, vfio binding, kernel arguments)"),
    "Worker.sharing": _c("rolled", _ROLL + " for a MIG geometry; device-plugin labels otherwise"),
    "Worker.timeSlicing": _c("in-place", _LABELS),
    "Worker.mig": _c("rolled", _ROLL + "; mig-manager applies the geometry, the VM restarts if a mode is pending"),
    "Worker.vgpuType": _c("in-place", _LABELS),
    "Worker.dra": _c("in-place", _LABELS),
    "Worker.taint": _c("in-place", "the node's taint changes; running pods stay"),
    "Worker.protect": _c("in-place", "the VM's protect option changes (Pulumi state only)"),
    "Worker.onBoot": _c("in-place", "the VM's start-at-boot flag changes"),
    "Worker.tags": _c("in-place", "the VM's Proxmox tags change"),
    # KubernetesSpec
    "KubernetesSpec.apiEndpoint": _c(
        "refused",
        "joined nodes keep the endpoint of their kubelet.conf; the steps would talk to another one",
        "point the existing endpoint (DNS name or load balancer) at the API server instead of changing it",
        supported=False,
    ),
    "KubernetesSpec.version": _c(
        "rolled",
        "each joined worker moves up one minor in its rollout slot once the API server is at it (drain, kubeadm, "
        "kubeadm upgrade node, kubelet and kubectl, kubelet restarted and reporting the new version, verify)",
        "upgrade the control plane first; then one minor at a time; a lower minor: rebuild each worker (pulumi up "
        "--replace its VM)",
        when="the minor goes down, or up by more than one, while workers that joined under the old one remain",
    ),
    "KubernetesSpec.joinMethod": _c("in-place", "join and rollout steps are added or dropped; nodes stay in service"),
    "KubernetesSpec.drain": _c("in-place", "see DrainSpec's fields"),
    # GuestSpec
    "GuestSpec.sshPublicKeys": _c(
        "vm-restart",
        _CLOUD_INIT + "; running workers keep their authorized keys",
        "add the new key to each worker's ~/.ssh/authorized_keys before rotating sshPrivateKey",
        supported=False,
    ),
    "GuestSpec.driverFlavor": _c("rolled", _ROLL + " (another driver package line)"),
    # Up or down: the steps' apt_install passes --allow-downgrades (tests/components/scripts/test_real_apt.py, with
    # the real apt: a pin lowered and raised under holds).
    "GuestSpec.toolkitVersion": _c(
        "in-place", "the runtime step installs the toolkit version (up or down); the node stays in service"
    ),
    "GuestSpec.defaultRuntime": _c("in-place", "the runtime step reconfigures containerd; the node stays in service"),
    # GpuOperatorSpec
    "GpuOperatorSpec.enabled": _c("in-place", "the GPU Operator release is installed or removed"),
    "GpuOperatorSpec.chartVersion": _c("in-place", _HELM + " (each daemonset whose image changed rolls)"),
    "GpuOperatorSpec.namespace": _c("replace", "the release and its namespace are recreated"),
    "GpuOperatorSpec.driverMode": _c("rolled", _ROLL + " (to operator: the host driver and toolkit are removed)"),
    "GpuOperatorSpec.driverBranch": _c("rolled", _ROLL + " (host mode; the operator rolls it in operator mode)"),
    "GpuOperatorSpec.driverVersion": _c(
        "rolled",
        _ROLL + " (up or down; host mode; the operator rolls it in operator mode); unpinned, the branch pin keeps the "
        "installed build: nothing drains",
        still=True,
    ),
    "GpuOperatorSpec.driverUpgrade": _c("in-place", _OPERATOR_ROLL),
    "GpuOperatorSpec.kernelModuleType": _c("rolled", _ROLL + " (the other kind's packages go; one reboot)"),
    "GpuOperatorSpec.cdi": _c("in-place", _HELM + "; the runtime step reconfigures containerd"),
    "GpuOperatorSpec.dcgm": _c("in-place", _HELM),
    "GpuOperatorSpec.migStrategy": _c("in-place", _HELM + " (the device plugin restarts)"),
    "GpuOperatorSpec.nfd": _c("in-place", _HELM),
    "GpuOperatorSpec.monitoring": _c("in-place", _MONITORING),
    "GpuOperatorSpec.smokeTest": _c("in-place", "the smoke-test Job is replaced"),
    "GpuOperatorSpec.capacityGateSeconds": _c("in-place", "the capacity gate's timeout changes"),
    "GpuOperatorSpec.dra": _c("in-place", "the DRA driver release changes"),
    # KubeVirtSpec
    **{
        f"KubeVirtSpec.{k}": _c("in-place", "the KubeVirt patch changes; running VMs keep their devices")
        for k in ("enabled", "name", "namespace", "patchKubeVirt", "featureGates", "vgpuManager", "nodes")
    },
    # Quota, PriorityClassSpec
    **{f"Quota.{k}": _c("in-place", "the ResourceQuota changes") for k in ("namespace", "resources", "priorityClass")},
    "PriorityClassSpec.name": _c("replace", "the PriorityClass is replaced"),
    "PriorityClassSpec.value": _c(
        "refused",
        "Kubernetes refuses to change a PriorityClass's value (immutable)",
        "add a PriorityClass under a new name and move the workloads to it",
        supported=False,
    ),
    "PriorityClassSpec.preemptionPolicy": _c(
        "refused",
        "Kubernetes refuses to change a PriorityClass's preemptionPolicy (immutable)",
        "add a PriorityClass under a new name and move the workloads to it",
        supported=False,
    ),
    "PriorityClassSpec.description": _c("in-place", "the PriorityClass's description changes"),
    "PriorityClassSpec.globalDefault": _c("in-place", "the PriorityClass's globalDefault changes"),
    # TimeSlicing
    **{
        f"TimeSlicing.{k}": _c("in-place", _LABELS)
        for k in ("replicas", "renameByDefault", "failRequestsGreaterThanOne")
    },
    # ProxmoxNode
    "ProxmoxNode.name": _c("replace", "a renamed node is another node: its workers are replaced"),
    "ProxmoxNode.sshAddress": _c("in-place", "the host steps' SSH connection changes; they run again"),
    "ProxmoxNode.cpuVendor": _c("host-reboot", "host prep runs again with the vendor's kernel arguments"),
    "ProxmoxNode.bootLoader": _c("host-reboot", "host prep runs again; a missing kernel argument reboots the node"),
    "ProxmoxNode.hostPrep": _c("host-reboot", "host prep runs (rebootPolicy) or stops running"),
    "ProxmoxNode.rebootPolicy": _c("in-place", "host prep's reboot condition changes; nothing reboots by itself"),
    "ProxmoxNode.acsOverride": _c(
        "host-reboot",
        "host prep reboots the node for the kernel argument as rebootPolicy allows; this stack's "
        "workers there go down undrained with always, and block when-idle",
        "drain the node's workers and shut their VMs down, then pulumi up; start them after",
        supported=False,
    ),
    "ProxmoxNode.iommuPassthrough": _c(
        "host-reboot",
        "host prep reboots the node for iommu=pt as rebootPolicy allows; this stack's workers there "
        "go down undrained with always, and block when-idle",
        "drain the node's workers and shut their VMs down, then pulumi up; start them after",
        supported=False,
    ),
    "ProxmoxNode.nestedVirtualization": _c("in-place", "host verify checks the kvm module's setting"),
    "ProxmoxNode.snippetDatastore": _c(
        "refused",
        "the VMs keep pointing at the old snippet, which is deleted: their next start fails",
        "keep snippetDatastore, or rebuild each worker of the node with it: " + REPLACE_VM,
        supported=False,
    ),
    "ProxmoxNode.gpus": _c(
        "host-reboot",
        "host prep binds the GPUs to vfio-pci (a reboot only where one will not "
        "come off its host driver, as rebootPolicy allows); PCI mappings change",
    ),
    # Image
    "Image.cloudImageUrl": _c("in-place", "a new image is downloaded; only VMs created afterwards boot it"),
    "Image.checksum": _c("in-place", "the download is checked against it; running workers are untouched"),
    "Image.templateVmid": _c("in-place", "only VMs created afterwards are cloned from it"),
    "Image.datastore": _c("replace", "the downloaded image file is replaced; running workers are untouched"),
    # Network
    "Network.bridge": _c("vm-restart", _RESTART),
    "Network.vlan": _c("vm-restart", _RESTART),
    "Network.ipv4": _c(
        "refused",
        "the steps would reach the worker at an address its guest never takes (cloud-init network "
        "config applies at first boot)",
        "keep the address, or rebuild the worker with it: " + REPLACE_VM,
        supported=False,
    ),
    "Network.gateway": _c("vm-restart", _CLOUD_INIT, "change it in the guest's netplan too", supported=False),
    "Network.dns": _c("vm-restart", _CLOUD_INIT, "change it in the guest's netplan too", supported=False),
    "Network.searchDomain": _c("vm-restart", _CLOUD_INIT, "change it in the guest's netplan too", supported=False),
    # GpuAssignment
    "GpuAssignment.ref": _c("vm-restart", _RESTART + " (the new GPU)"),
    "GpuAssignment.mig": _c(
        "rolled", _ROLL + "; mig-manager applies the geometry, the VM restarts if a mode is pending"
    ),
    # DrainSpec, DriverUpgradeSpec and its parts
    **{
        f"DrainSpec.{k}": _c("in-place", _SETTING)
        for k in (
            "timeoutSeconds",
            "deleteEmptydirData",
            "force",
            "maxUnavailable",
            "slotLeaseSeconds",
            "slotWaitSeconds",
        )
    },
    "DrainSpec.slotNamespace": _c(
        "in-place", "the slot namespace and the nodes' grant there move; every node stays in service"
    ),
    **{
        f"DriverUpgradeSpec.{k}": _c("in-place", _OPERATOR_ROLL)
        for k in (
            "autoUpgrade",
            "maxParallelUpgrades",
            "maxUnavailable",
            "waitForCompletionSeconds",
            "waitForCompletionPodSelector",
            "gpuPodDeletion",
            "drain",
        )
    },
    **{
        f"GpuPodDeletionSpec.{k}": _c("in-place", _OPERATOR_ROLL) for k in ("force", "timeoutSeconds", "deleteEmptyDir")
    },
    **{
        f"DriverDrainSpec.{k}": _c("in-place", _OPERATOR_ROLL)
        for k in ("enable", "force", "timeoutSeconds", "deleteEmptyDir")
    },
    # Monitoring
    **{
        f"MonitoringSpec.{k}": _c("in-place", _MONITORING)
        for k in ("metrics", "prometheus", "namespace", "labels", "scrapeInterval", "alerts", "dashboard")
    },
    **{f"DcgmMetric.{k}": _c("in-place", _MONITORING) for k in ("field", "type", "help")},
    **{
        f"AlertsSpec.{k}": _c("in-place", _MONITORING)
        for k in (
            "temperatureWarningCelsius",
            "temperatureCriticalCelsius",
            "framebufferPercent",
            "utilizationPercent",
            "utilizationMinutes",
            "singleBitEccPerHour",
            "pcieReplaysPerMinute",
            "exporterMissingMinutes",
            "criticalXids",
        )
    },
    **{
        f"DashboardSpec.{k}": _c("in-place", _MONITORING)
        for k in ("enabled", "namespace", "label", "labelValue", "folder")
    },
    # SmokeTestSpec, DraSpec, VgpuManagerSpec, KubeVirtNode
    **{
        f"SmokeTestSpec.{k}": _c("in-place", "the smoke-test Job is replaced")
        for k in ("enabled", "image", "timeoutSeconds")
    },
    "DraSpec.chartVersion": _c("in-place", "the DRA driver release is upgraded"),
    "DraSpec.namespace": _c("replace", "the DRA driver release and its namespace are recreated"),
    **{
        f"VgpuManagerSpec.{k}": _c("in-place", _HELM + " (vGPU manager image or its pull secret)")
        for k in ("repository", "image", "version", "pullSecret", "registryUsername")
    },
    **{f"KubeVirtNode.{k}": _c("in-place", _LABELS) for k in ("name", "workload", "gpus", "vgpuType", "taint")},
    # HostGpu
    "HostGpu.name": _c("replace", "the GPU's PCI mapping is recreated; a worker claiming it follows Worker.gpus"),
    "HostGpu.pciPath": _c(
        "refused",
        "a new PCI path creates the new mapping before deleting the old one of the same id",
        "remove the GPU from the node (and its workers) in one pulumi up, then add it with the new path",
        supported=False,
    ),
    "HostGpu.model": _c(
        "vm-restart",
        "the mapping and the verify step's expectation change; the card itself changes only with a restart",
        RESTART_VM,
        supported=False,
    ),
    "HostGpu.deviceId": _c("in-place", "the PCI mapping's device id and host prep's vfio ids change"),
    "HostGpu.console": _c("host-reboot", "host prep stops or starts preparing the GPU for passthrough"),
}
"""``<Model>.<key>`` -> its change class; every field ``docs/spec.md`` lists has one (a test says so)."""


REMOVALS: Mapping[str, FieldClass] = {
    "ClusterSpec.workers": _c(
        "replace", "the removed worker is drained, deleted from Kubernetes and its VM destroyed (retirement)"
    ),
    "ProxmoxSpec.nodes": _c("in-place", "the removed node is left as it is (host prep is not undone)"),
    "ProxmoxNode.gpus": _c("in-place", "the GPU's PCI mapping is deleted; its vfio binding stays until a reboot"),
}
"""List fields whose item removal is another class than its adding (the ``CHANGE_CLASSES`` entry)."""


def rolled_fields() -> list[str]:
    """The fields whose change rolls through rollout slots, as a reader writes them (``Model.key``)."""
    return sorted(k for k, c in CHANGE_CLASSES.items() if c.drains)


def field_class(key: str, *, removed: bool = False) -> FieldClass | None:
    """The class of ``<Model>.<key>`` (``removed``: of removing an item of a list field), None for a key the table
    does not know."""
    return (removed and REMOVALS.get(key)) or CHANGE_CLASSES.get(key)
