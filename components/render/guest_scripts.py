"""Arguments of the guest steps in ``components/scripts/guest_*.sh``. Pure.

Each step runs its node-agent bundle (``render/agent_bundle.py``: ``guest_lib.sh`` + the step's script, installed
once per machine) with these arguments. They come from the validated ``GuestBootstrapSpec``, whose patterns leave
nothing a shell could interpret, and the scripts check them again. Secrets never become arguments: they travel on
the step's stdin only (``agent_bundle.secrets_stdin``), under the variable names below.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.core.spec import DrainSpec

STEPS = ("cloud-init", "driver", "runtime", "join", "verify")
"""The bootstrap steps in the order they run."""
JOIN_TOKEN_VAR = "PGC_JOIN_TOKEN"  # noqa: S105 (the variable's name, not a token)
CA_CERT_HASH_VAR = "PGC_CA_CERT_HASH"


def drain_args(node_name: str, api_endpoint: str, drain: DrainSpec, kubeadm_reset: bool) -> list[str]:
    """guest_drain.sh arguments. ``api_endpoint``: the address the node joined through, which kubectl in the guest
    uses (with kubelet's credential)."""
    args = ["--node-name", node_name, "--api-endpoint", api_endpoint, "--timeout", str(drain.timeout_seconds)]
    args += ["--delete-emptydir-data", _flag(drain.delete_emptydir_data), "--force", _flag(drain.force)]
    return [*args, "--kubeadm-reset", _flag(kubeadm_reset)]


def mig_args(
    b: GuestBootstrapSpec,
    phase: str,
    mig_config: str,
    timeout_seconds: int,
    operator_namespace: str,
    *,
    config_map: str | None = None,
) -> list[str]:
    """guest_mig.sh arguments for ``phase`` (begin, restart or end) of a change to ``mig_config``; ``config_map``:
    the mig-parted ConfigMap that names it (end: a failure of a mig-manager not reading it yet is waited through)."""
    args = ["--phase", phase, "--mig-config", mig_config, "--timeout", str(timeout_seconds)]
    args += ["--mig-config-map", config_map] if config_map else []
    return [*args, "--operator-namespace", operator_namespace, *mig_mode_args(b), *rollout_args(b)]


def mig_mode_args(b: GuestBootstrapSpec) -> list[str]:
    """``--mig-mode INDEX=1|0`` per MIG-capable GPU (guest_mig_mode.sh), of the driver and MIG steps."""
    return [arg for mode in b.mig_modes for arg in ("--mig-mode", mode)]


def capacity_args(
    node_name: str, resources: Mapping[str, int], *, timeout: int = 600, device_plugin_config: str | None = None
) -> list[str]:
    """guest_capacity.sh arguments: every resource the node must advertise, in a stable order (a new expectation
    is a new command, so the gate runs again)."""
    args = ["--node", node_name, "--timeout", str(timeout)]
    for resource, count in sorted(resources.items()):
        args += ["--expect", f"{resource}={count}"]
    if device_plugin_config:
        args += ["--device-plugin-config", device_plugin_config]
    return args


def driver_args(b: GuestBootstrapSpec) -> list[str]:
    """guest_driver.sh arguments (the pins live here, so a version bump is an update of this step)."""
    args = ["--mode", b.driver_mode, "--branch", b.driver_branch, "--flavor", b.driver_flavor]
    args += ["--modules", b.kernel_modules]
    if b.driver_version is not None:
        args += ["--version", b.driver_version]
    for arg in b.kernel_args:
        args += ["--kernel-arg", arg]
    if b.driver_mode == "vfio":
        for vendor_device in sorted({g.vendor_device for g in b.gpus}):
            args += ["--vfio-id", vendor_device]
    # The operator's driver container runs only after the join: there mig-manager and the MIG steps set the mode.
    return args + (mig_mode_args(b) if b.driver_mode == "host" else []) + rollout_args(b)


ROLLOUT_FLAGS = {
    "namespace": ("--rollout-namespace", "ROLLOUT_NAMESPACE"),
    "max_unavailable": ("--rollout-max-unavailable", "ROLLOUT_MAX"),
    "lease_seconds": ("--rollout-lease-seconds", "ROLLOUT_LEASE"),
    "wait_seconds": ("--rollout-wait-seconds", "ROLLOUT_WAIT"),
    "drain_timeout_seconds": ("--rollout-drain-timeout", "ROLLOUT_DRAIN_TIMEOUT"),
    "delete_emptydir_data": ("--rollout-delete-emptydir-data", "ROLLOUT_EMPTYDIR"),
    "force": ("--rollout-force", "ROLLOUT_FORCE"),
}
"""RolloutSpec field -> guest_rollout.sh flag and the shell variable whose default is the field's (a test compares
them): a setting at its default is not passed, which keeps every worker's state small."""


def rollout_args(b: GuestBootstrapSpec) -> list[str]:
    """guest_rollout.sh arguments of the driver, verify and MIG steps (none without a rollout): the node, the API
    endpoint, and each setting that differs from its default."""
    r = b.rollout
    if r is None:
        return []
    args = ["--rollout", "1", "--rollout-node", b.node_name, "--rollout-api", b.api_endpoint]
    for field, (flag, _) in ROLLOUT_FLAGS.items():
        value = getattr(r, field)
        if value != type(r).model_fields[field].default:
            args += [flag, _flag(value) if isinstance(value, bool) else str(value)]
    return args


def runtime_args(b: GuestBootstrapSpec) -> list[str]:
    """guest_runtime.sh arguments."""
    args = ["--toolkit", _flag(b.toolkit)]
    if b.toolkit:
        args += ["--toolkit-version", b.toolkit_version, "--default-runtime", _flag(b.default_runtime)]
        args += ["--cdi", _flag(b.cdi)]
    return args


def join_args(b: GuestBootstrapSpec) -> list[str]:
    """guest_join.sh arguments (no secrets: those go through ``secret_stdin``); the rollout settings for the minor
    upgrade of a joined node."""
    args = ["--node-name", b.node_name, "--api-endpoint", b.api_endpoint, "--minor", str(b.kubernetes_minor)]
    return args + rollout_args(b)


def verify_args(b: GuestBootstrapSpec, *, after: str | None = None) -> list[str]:
    """guest_verify.sh arguments: every GPU expected, and what the host driver and toolkit must show; ``after``:
    the key of the steps before it that may cordon the node (``after_key``), so it runs again after each of them."""
    args: list[str] = []
    for gpu in b.gpus:
        args += ["--gpu", f"{gpu.vendor_device}={gpu.product}"]
    host = b.driver_mode == "host"
    args += ["--nvidia-smi", _flag(host)]
    if host:
        args += ["--driver", b.driver_version or b.driver_branch]
    args += ["--containerd-nvidia", _flag(b.toolkit)]
    # Only when set, so container workers' verify command (and so their plan) is what it was before KubeVirt.
    if b.driver_mode == "vfio":
        args += ["--vfio", "1"]
    if b.kvm:
        args += ["--kvm", "1"]
    for arg in b.kernel_args:
        args += ["--kernel-arg", arg]
    if b.kernel_below is not None:
        args += ["--kernel-below", b.kernel_below]
    if b.cpus is not None:  # what the VM runs on (a change restarts the VM, then verify checks it and uncordons)
        args += ["--cpus", str(b.cpus)]
    if b.memory_mib is not None:
        args += ["--memory-mib", str(b.memory_mib)]
    if b.join_method == "kubeadm":  # the minor the join step installed or upgraded to (and a new one reruns verify)
        args += ["--kubernetes", str(b.kubernetes_minor)]
    if after is not None:
        args += ["--after", after]
    return args + rollout_args(b)


def after_key(*commands: str) -> str:
    """The verify step's ``--after``: 16 hex digits of the commands (or keys) of the steps before it that may cordon
    the node. A step that cordons leaves the uncordon to verify, which Pulumi runs again only when its own command
    changes: a kernel-module kind or a network change reruns the driver or the VM restart and nothing in verify's
    checks (found running the change matrix in the fake world)."""
    return hashlib.sha256("\0".join(commands).encode()).hexdigest()[:16]


def _flag(value: bool) -> str:
    return "1" if value else "0"


def hold_args(b: GuestBootstrapSpec) -> list[str]:
    """guest_hold.sh arguments: why, and the rollout settings (none: a node joined elsewhere is not held)."""
    return ["--why", "VM restart for pending hardware", *rollout_args(b)]
