"""What a ``pulumi up`` of a spec may disrupt: which Proxmox nodes it may reboot and under which condition, and
what happens to a worker's Kubernetes node before its VM is replaced or removed. Pure.

The offline plan prints this (and ``--json`` carries it) so a reviewer sees it before anything runs; the steps
themselves check the conditions again when they run (host_prep.sh, retire_vm.sh).
"""

from __future__ import annotations

from dataclasses import dataclass

from proxmox_gpu_cluster.core.change_classes import rolled_fields
from proxmox_gpu_cluster.core.guest_spec import bootstrap_spec, kernel_modules
from proxmox_gpu_cluster.core.spec import ClusterSpec, ProxmoxNode
from proxmox_gpu_cluster.render.host_scripts import kernel_args


@dataclass(frozen=True)
class HostReboot:
    """Whether a run may reboot one Proxmox node, and why it would."""

    node: str
    may_reboot: str
    """``no`` (no host prep, or rebootPolicy never), ``when-idle`` or ``yes`` (rebootPolicy always)."""
    reason: str
    """The kernel arguments the spec asks for (``iommuPassthrough``, ``acsOverride``): a running kernel without one
    of them is rebooted."""
    workers: tuple[str, ...]
    """This stack's worker VMs on the node: with ``yes`` a reboot takes them down too."""
    iommu_off: bool = False
    """An Intel node is also rebooted when its running kernel has the IOMMU off (kernels before 6.8 without
    ``intel_iommu=on``): host prep adds the argument. AMD's IOMMU is on by default (an AMD node with it off fails
    host prep instead: only the firmware can turn it on), as is Intel's from 6.8 (Proxmox VE 8.2+ and 9), so a
    host whose IOMMU is on is never rebooted for it."""
    prepared: bool = True
    """Whether host prep runs on the node at all."""

    @property
    def condition(self) -> str:
        """When host prep reboots the node, in words."""
        why = []
        if self.iommu_off:
            why.append("its running kernel has the IOMMU off (Intel before kernel 6.8: host prep adds intel_iommu=on)")
        if self.reason:
            why.append(f"its running kernel lacks {self.reason}")
        why.append("a declared GPU will not come off its host driver at runtime")
        return " or ".join(why)

    @property
    def text(self) -> str:
        """One line for the plan."""
        if not self.prepared:
            return f"{self.node}: no host prep; never changed or rebooted by this stack"
        if self.may_reboot == "no":
            return (
                f"{self.node}: never rebooted by this stack (rebootPolicy never): if {self.condition}, host prep "
                "reports 'reboot: required' and host verify waits for you to reboot it"
            )
        condition = f"only if {self.condition}"
        if self.may_reboot == "when-idle":
            return (
                f"{self.node}: may reboot {condition}, and only when no VM or container runs on it (rebootPolicy "
                "when-idle: otherwise the step fails and names them)"
            )
        down = f"; this stack's VMs there go down with it: {', '.join(self.workers)}" if self.workers else ""
        return f"{self.node}: may reboot {condition}, even with guests running (rebootPolicy always){down}"


def host_reboot(spec: ClusterSpec, node: ProxmoxNode) -> HostReboot:
    """The reboot decision host prep may take on ``node``."""
    workers = tuple(w.name for w in spec.workers if w.node == node.name)
    if not node.host_prep or not node.passthrough_gpus:
        return HostReboot(node.name, "no", "", workers, prepared=False)
    may = {"never": "no", "when-idle": "when-idle", "always": "yes"}[node.reboot_policy]
    return HostReboot(node.name, may, " ".join(kernel_args(node)), workers, iommu_off=node.cpu_vendor == "intel")


def disruption(spec: ClusterSpec) -> dict[str, object]:
    """The disruption report of ``spec`` as plain data (what ``--json`` prints)."""
    drain = spec.kubernetes.drain
    hosts = [host_reboot(spec, n) for n in spec.proxmox.nodes]
    reset = ["kubeadm reset"] if spec.kubernetes.join_method == "kubeadm" else []
    return {
        "hosts": {
            r.node: {
                "mayReboot": r.may_reboot,
                "onlyIfKernelLacks": r.reason,
                "onlyIfIommuOff": r.iommu_off,
                "workers": list(r.workers),
            }
            for r in hosts
        },
        "workerRemoval": {
            "order": ["cordon", "drain", *reset, "delete Node", "destroy VM"],
            "drainTimeoutSeconds": drain.timeout_seconds,
            "protected": [w.name for w in spec.workers if w.protect],
        },
        "vmRestarts": "never by the provider: changes that need one stay pending until the VM is restarted (a MIG "
        "mode change is the one exception: migModeRestarts)",
        "migModeRestarts": mig_restarts(spec),
        "driverChangeReboots": spec.gpu_operator.driver_mode == "host"
        and any(w.workload == "container" for w in spec.workers),
        "rollingChanges": host_roll(spec),
        "firstBoot": first_boot(spec),
        "kernelModules": kernel_module_sources(spec),
        "operatorDriverRoll": _operator_roll(spec),
        # The gates wait for the operator's release: a cluster without the operator has none (cluster/builders.py).
        "capacityGateSeconds": spec.gpu_operator.capacity_gate_seconds
        if spec.kubernetes.join_method == "kubeadm" and spec.gpu_operator.enabled
        else 0,
    }


def kernel_module_sources(spec: ClusterSpec) -> dict[str, str]:
    """Per worker, where its NVIDIA kernel module comes from: ``precompiled-or-dkms`` (host driver: the guest's
    driver step takes Ubuntu's precompiled, signed module when the archive has one for the running kernel built
    against the chosen build, and DKMS otherwise; guest_driver_apt.sh), ``operator`` (the GPU Operator's driver
    container) or ``none`` (vm-passthrough: the GPUs are bound to vfio-pci)."""
    kinds = {"host": "precompiled-or-dkms", "operator": "operator", "vfio": "none"}
    return {w.name: kinds[bootstrap_spec(spec, w).driver_mode] for w in spec.workers}


def _module_line(spec: ClusterSpec) -> str | None:
    host = [w for w, kind in kernel_module_sources(spec).items() if kind == "precompiled-or-dkms"]
    if not host:
        return None
    op, guest = spec.gpu_operator, spec.guest
    name = (
        f"linux-modules-nvidia-{op.driver_branch}{'-server' if guest.driver_flavor == 'server' else ''}"
        f"{'-open' if kernel_modules(op.kernel_module_type, op.driver_branch) == 'open' else ''}-<kernel>"
    )
    pin = (
        f"; Ubuntu builds them against a branch's newest build only, so the pinned {op.driver_version} gets them "
        "only while it is the archive's newest"
        if op.driver_version
        else ""
    )
    return (
        f"Driver kernel modules ({', '.join(host)}): Ubuntu's precompiled, signed {name} when the archive has "
        f"it for the guest's running kernel built against the chosen build (no DKMS build), DKMS otherwise{pin}; "
        "a kernel update keeps its module either way (the precompiled flavour metapackage while it fits the held "
        "build, DKMS once Ubuntu has moved on); the driver step prints which it took"
    )


def first_boot(spec: ClusterSpec) -> dict[str, dict[str, int]]:
    """Per worker, the restarts of its first provisioning: the VM starts once (a large-BAR window is set before
    that start, in both auth modes) and the guest reboots only where its first boot cannot take the change: a
    KubeVirt worker once, to boot with the IOMMU on (its GRUB drop-in); a container worker never (cloud-init's vendor
    data keeps nouveau out, and the new driver's module loads with modprobe)."""
    return {
        w.name: {"vmStarts": 1, "vmRestarts": 0, "guestReboots": 0 if w.workload == "container" else 1}
        for w in spec.workers
    }


def mig_restart_workers(spec: ClusterSpec) -> list[str]:
    """The workers whose MIG mode the stack sets (container workers with MIG-capable GPUs, GPU Operator, kubeadm
    join): those the mig-restart step may restart from Proxmox."""
    if spec.kubernetes.join_method != "kubeadm" or not spec.gpu_operator.enabled:
        return []
    return [w.name for w in spec.workers if bootstrap_spec(spec, w).mig_modes]


def mig_restarts(spec: ClusterSpec) -> dict[str, object] | None:
    """The VM restarts a MIG mode change may cost: at most one per worker per change (and per first provisioning),
    only when its guest reports a mode pending a GPU reset (the guest cannot reset a passed-through GPU)."""
    workers = mig_restart_workers(spec)
    if not workers:
        return None
    return {
        "workers": workers,
        "perChangeAtMost": 1,
        "when": "the guest reports a GPU's MIG mode pending a reset",
        "how": ["qm shutdown --forceStop 1", "qm start"],
        "order": ["take slot", "cordon", "drain", "set MIG mode", "label", "restart VM if pending",
                  "wait for mig-manager success", "uncordon", "release slot"],
    }  # fmt: skip


def host_roll(spec: ClusterSpec) -> dict[str, object] | None:
    """How a change that takes joined nodes out of service (a new host driver, kernel arguments, vfio binding, a
    MIG geometry) rolls: slots of ``maxUnavailable`` nodes, in the order Pulumi reaches them (None when nodes join
    elsewhere)."""
    if spec.kubernetes.join_method != "kubeadm" or not spec.workers:
        return None
    drain = spec.kubernetes.drain
    nodes = [w.name for w in spec.workers]
    slots = drain.max_unavailable
    return {
        "order": ["take slot", "cordon", "drain", "change", "reboot if needed", "verify", "uncordon", "release slot"],
        "maxUnavailable": slots,
        "nodes": nodes,
        "rounds": -(-len(nodes) // slots),
        "slotWaitSeconds": drain.slot_wait_seconds,
    }


def _operator_roll(spec: ClusterSpec) -> dict[str, object] | None:
    """How the operator's upgrade controller rolls a new driver (operator driver mode only)."""
    op = spec.gpu_operator
    if op.driver_mode != "operator" or not op.enabled:
        return None
    up = op.driver_upgrade
    return {
        "autoUpgrade": up.auto_upgrade,
        "maxParallelUpgrades": up.max_parallel_upgrades,
        "maxUnavailable": up.max_unavailable,
        "drain": up.drain.enable,
    }


def disruption_lines(spec: ClusterSpec) -> list[str]:
    """The plan's disruption section, one line per item."""
    lines = [f"Proxmox node {host_reboot(spec, n).text}" for n in spec.proxmox.nodes]
    drain = spec.kubernetes.drain
    reset = ", reset (kubeadm reset)" if spec.kubernetes.join_method == "kubeadm" else ""
    lines.append(
        f"Worker VMs ({len(spec.workers)}): replaced delete-first; before a VM is replaced or removed its node is "
        f"cordoned, drained (at most {drain.timeout_seconds} s, PodDisruptionBudgets respected){reset} and deleted "
        "from Kubernetes"
    )
    boots = first_boot(spec)
    reboots = [w for w, b in boots.items() if b["guestReboots"]]
    lines.append(
        f"First provisioning: every worker VM starts once (large-BAR GPUs get their MMIO window before that start): "
        f"0 VM restarts; guest reboots: {len(reboots)}"
        + (f" ({', '.join(reboots)}: KubeVirt workers boot once more with the IOMMU on)" if reboots else "")
    )
    protected = [w.name for w in spec.workers if w.protect]
    if protected:
        lines.append(f"Protected from replacement and removal: {', '.join(protected)}")
    lines.append(
        "VM settings that need a restart (cores, memory, GPUs, cloud-init) stay pending until you drain and restart "
        "the VM: the provider never restarts a worker"
    )
    migs = mig_restart_workers(spec)
    if migs:
        lines.append(
            f"MIG mode changes ({len(migs)} worker(s): {', '.join(migs)}): inside the node's rollout slot (cordoned, "
            "drained) the guest sets the mode; after the label change the mig-restart step restarts the VM from "
            "Proxmox (qm shutdown, qm start) only if the guest reports the mode pending a GPU reset: at most 1 VM "
            f"restart per worker per change, so at most {len(migs)} VM restart(s) when every one changes; then "
            "mig-manager's success, uncordon. A new worker's driver step sets the mode before the join in host driver "
            "mode (a mode left pending costs that worker 1 VM restart before its GPUs are partitioned); in operator "
            "driver mode the mig-restart step waits for the operator's driver container and mig-manager's report, "
            "then restarts a new worker's VM once if its mode is pending"
        )
    host = host_roll(spec)
    if host is not None:
        lines.append(
            # which fields roll is the one table's answer (core/change_classes.py), the one the diff announces from
            f"Rolling changes of joined nodes (a change of {', '.join(rolled_fields())}: a new host driver build or "
            "branch, kernel arguments, vfio binding, a Kubernetes minor upgrade (once the API server is at it), VM "
            "hardware (the VM stopped and started from Proxmox), a MIG geometry, which also waits for mig-manager's "
            "success): "
            f"at most {host['maxUnavailable']} of {len(spec.workers)} node(s) at a time, cluster-wide, so at least "
            f"{host['rounds']} round(s): take a slot, cordon, drain, change, reboot if needed, verify, uncordon, "
            "release; a node that fails stays cordoned and frees its slot; a node that has not joined yet rolls nothing"
        )
    elif spec.gpu_operator.driver_mode == "host" and any(w.workload == "container" for w in spec.workers):
        lines.append(
            "Guest reboots: nodes joined elsewhere (joinMethod none) are not drained: a new driver build or branch "
            "is installed on every worker at once; change gpuOperator.driverBranch/driverVersion in a maintenance "
            "window"
        )
    op = spec.gpu_operator
    if op.driver_mode == "host" and op.driver_version is None and any(w.workload == "container" for w in spec.workers):
        lines.append(
            f"Driver builds: only branch {op.driver_branch} is pinned, so workers set up at different times may run "
            f"different {op.driver_branch}.x builds (the driverVersions output shows each); pin "
            "gpuOperator.driverVersion for one build everywhere"
        )
    if (modules := _module_line(spec)) is not None:
        lines.append(modules)
    roll = _operator_roll(spec)
    if roll is not None:
        nodes = sum(1 for w in spec.workers if w.workload == "container")
        how = "drained first" if roll["drain"] else "GPU pods deleted, the node not drained"
        lines.append(
            f"Driver changes (operator mode): the operator's upgrade controller rolls them over the {nodes} container "
            f"worker(s), {roll['maxParallelUpgrades']} at a time (at most {roll['maxUnavailable']} unavailable), {how}"
            + ("" if roll["autoUpgrade"] else "; autoUpgrade is off, so it waits for you to label nodes for upgrade")
        )
    gate = disruption(spec)["capacityGateSeconds"]
    if gate:
        lines.append(
            f"After every change to the GPU stack each worker must advertise its capacity row within {gate} s, or the "
            "update fails naming the node"
        )
    return lines
