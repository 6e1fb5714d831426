"""The MIG phases of a node step (guest_mig.sh), around mig-manager, on cluster.py's rollout slots. Runs on the
machine (python3 3.10+, stdlib only) with cluster.py and kubeapi.py beside it, as the node itself.

    mig_manager.py --phase begin|restart|end --mig-config NAME --timeout S --operator-namespace NS
                   [--mode-change 1] [--mig-config-map CONFIGMAP] <rollout flags (cluster.py)>

A failure prints ``<step>: <what>: expected <x>, saw <y>`` and exits 1.

A ``failed`` that is not about the geometry: a new custom geometry lives in a new mig-parted ConfigMap (its name is
content-addressed), which the GPU Operator mounts into mig-manager only once the Helm release carries the name: it
rewrites the DaemonSet's ``mig-parted-config`` volume (gpu-operator v26.7.0 controllers/object_controls.go,
TransformMIGManager), and the DaemonSet replaces the pod. Until then the node's label already names the geometry, and
the old pod, which runs for every label change (NVIDIA/mig-parted cmd/nvidia-mig-manager/main.go, the informer's
UpdateFunc), fails to validate it against its config and reports ``failed`` (pkg/mig/reconfigure/reconfigure.go,
Run: validateMigConfig). The new pod runs for the label at its start (AddFunc) and reports again. So with the
ConfigMap that names the geometry (``--mig-config-map``), a ``failed`` counts only when the node's mig-manager pod
mounts that ConfigMap and the state label was written after that pod was created (the label's managedFields time:
the API server stamps the writer's entry at every change it makes, in whole seconds; a pod's first report comes
seconds after its creation). As the node, kubectl may list the pods bound to it (the Node authorizer allows a
``spec.nodeName`` field selector: kubernetes plugin/pkg/auth/authorizer/node/node_authorizer.go, authorizePod) and
read its own Node.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

if __package__:  # imported as part of the package (type checks)
    from .cluster import ANNOTATION, Rollout, options, rollout_of
    from .kubeapi import Failure, Kube, metadata, say
else:  # run from its bundle directory, where cluster.py and kubeapi.py sit beside it (sys.path[0])
    from cluster import ANNOTATION, Rollout, options, rollout_of  # type: ignore[no-redef,import-not-found]
    from kubeapi import Failure, Kube, metadata, say  # type: ignore[no-redef,import-not-found]

STATE = "nvidia.com/mig.config.state"  # mig-manager's report: pending, rebooting, success or failed
RESTARTED = "proxmox-gpu-cluster.io/mig-restart"  # mig-manager's state when the VM restarted for a MIG mode
REPORTED = "reported"  # RESTARTED once mig-manager reported after the restart (no state of mig-manager's)
SUCCESS_GRACE = 60  # how long an earlier label's success waits for mig-manager to begin a run for this one
APP = (
    "nvidia-mig-manager"  # the mig-manager pods' app label (gpu-operator assets/state-mig-manager/0600_daemonset.yaml)
)
VOLUME = "mig-parted-config"  # the pod volume the operator points at the mig-parted ConfigMap (its name contains it)


def mig(rollout: Rollout, phase: str, wanted: str, timeout: int, namespace: str, *, mode_change: bool = False,
        config_map: str = "") -> None:  # fmt: skip
    """MIG begin: drain through a slot when the node's nvidia.com/mig.config label holds another geometry, or the same
    one while a GPU's MIG mode must change (``mode_change``). Restart (before the Proxmox-side VM restart): hold
    the node (slot, cordon, drain), wait for mig-manager's report, record it as stale (RESTARTED). End: for a node
    cordoned or restarted, wait (bounded) for the wanted geometry and mig-manager's success after the restart, then
    uncordon; with ``config_map`` (the mig-parted ConfigMap that names the geometry) a "failed" from a mig-manager
    that does not read it yet is waited through (stale_failure)."""
    node = rollout.node_object()
    labels = metadata(node, "labels")
    if phase == "begin":
        current = labels.get("nvidia.com/mig.config", "")
        if current and (current != wanted or mode_change):
            rollout.begin(f"MIG {current} -> {wanted}" if current != wanted else f"MIG mode for {wanted}")
        else:
            say(f"mig: {rollout.node}: {current or 'no geometry yet'} -> {wanted}: nothing to drain")
        return
    if phase == "restart":
        return restarting(rollout, wanted, timeout)
    stale = metadata(node).get(RESTARTED)
    if not metadata(node).get(ANNOTATION) and stale is None:
        say(f"mig: {rollout.node} was not cordoned for a MIG change; nothing to wait for")
        return rollout.end()  # gives back a slot a killed end left held
    # Cordoned by begin or by the restart step (a first provisioning too), or restarted by the latter (the wait
    # tells mig-manager's report from after the restart).
    rollout.resume()
    what, waited, why = ("mig", STATE, f"success for {wanted} on {rollout.node}"), 0, ""
    while True:
        have, state = labels.get("nvidia.com/mig.config") or "none", labels.get(STATE) or "none"
        if stale not in (None, REPORTED) and state != stale:  # mig-manager reported after the VM restart
            # Recorded, not forgotten: a run killed before the success still waits for it next time.
            rollout.kube("annotate", "node", rollout.node, "--overwrite", f"{RESTARTED}={REPORTED}")
            stale = REPORTED
        fresh = stale in (None, REPORTED)
        if fresh and (have, state) == (wanted, "success"):
            break
        if fresh and have == wanted and state == "failed":
            late = stale_failure(rollout.kube, rollout.node, namespace, config_map) if config_map else ""
            if late and late != why:
                say(f"mig: {rollout.node}: mig-manager's failed is not for {wanted} yet: {late}; waiting")
            why = late
        if fresh and have == wanted and state == "failed" and not why:
            raise Failure(*what, f"failed: see kubectl logs -n {namespace} -l app=nvidia-mig-manager --tail=100 (a "
                          "GPU process still running, or a geometry the GPU refuses)")  # fmt: skip
        if waited >= timeout:
            since = ", its report from before the VM restart" if not fresh else ""
            since += f", {why}" if why and state == "failed" else ""
            hint = f"label {have}, state {state}{since} (is mig-manager running in {namespace}?)"
            raise Failure(*what[:2], f"{what[2]} within {timeout}s", hint)
        rollout.sleep(rollout.poll)
        waited += rollout.poll
        labels = metadata(rollout.node_object(), "labels")
    if stale is not None:
        rollout.kube("annotate", "node", rollout.node, f"{RESTARTED}-")
    say(f"mig: {rollout.node} runs {wanted} (mig-manager: success)")
    rollout.end()


def restarting(rollout: Rollout, wanted: str, timeout: int) -> None:
    """Before the VM restart that applies a pending MIG mode (the guest found a GPU whose mode is not current):
    hold the node for the change, whatever begin did (begin drains nothing on a first provisioning, nor when the
    mode could not be read then: the operator's driver container down): a rollout slot (maxUnavailable counts
    machines out, so one with no workload takes it too), the cordon, the drain (Evictions, bounded; a drained node's
    is a listing). No slot or no drain in time fails the step before anything restarts; the node then keeps what
    it holds (guest_rollout.sh cleanup) and the end step, after the restart, uncordons it and frees the slot.
    Then wait (bounded) for mig-manager's report for the current label, and record it as stale (RESTARTED), so the end
    step waits for its next one: mig-manager runs its reconfigure for the node's label at every start (its
    informer's AddFunc, NVIDIA/mig-parted cmd/nvidia-mig-manager/main.go), so after the boot it reports again.

    Its report for this label (pkg/mig/reconfigure/reconfigure.go, Run, at k8s-mig-manager v0.13.1 and v0.15.0):
    "failed" (``assert --mode-only`` checks the CURRENT mode, pkg/mig/mode/nvml.go GetMigMode, so the geometry's
    apply fails after it) or "rebooting" (WITH_REBOOT). "pending" is a run in progress; no state, a run not begun
    (a first provisioning: the operator's pods start after the node's labels); "success" with a mode not current
    is the report for an earlier label (except all-disabled, whose apply may pass with the mode only pending: that
    success stays valid, as mig-manager finds nothing to change after the restart and reports no new state).
    Waiting keeps a report that lands during the shutdown from being taken, after the boot, as the new one. With
    no report in time it restarts anyway (the reset is what applies the mode) and records what it saw."""
    rollout.begin(f"MIG mode for {wanted}: VM restart")  # a slot held already is renewed, never a second one
    state, waited = metadata(rollout.node_object(), "labels").get(STATE, ""), 0
    while state not in ("failed", "rebooting") and not (state == "success" and wanted == "all-disabled"):
        # A run begun or to begin (no state yet) reports within the budget; an earlier label's success stays when
        # no run comes (a mode change under an unchanged label: mig-manager acts on label changes only), so it gets
        # a minute for mig-manager to begin.
        limit = min(timeout, SUCCESS_GRACE) if state == "success" else timeout
        if waited >= limit:
            say(f"mig: {rollout.node}: no report from mig-manager for {wanted} within {limit}s (state "
                f"{state or 'none'}); restarting: mig-manager runs for the label again at the VM's start")  # fmt: skip
            break
        rollout.sleep(rollout.poll)
        waited += rollout.poll
        state = metadata(rollout.node_object(), "labels").get(STATE, "")
    if state == "success" and wanted == "all-disabled":
        return say(f"mig: {rollout.node}: restarting for the MIG mode; mig-manager's success stays valid")
    rollout.kube("annotate", "node", rollout.node, "--overwrite", f"{RESTARTED}={state or 'none'}")
    say(f"mig: {rollout.node}: restarting for the MIG mode; mig-manager's state {state or 'none'} is from before it")


def mounted_config(pod: dict[str, Any]) -> str:
    """The ConfigMap behind the pod's mig-parted-config volume, or "" (none)."""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if VOLUME in (volume.get("name") or "") and volume.get("configMap"):
            return str(volume["configMap"].get("name") or "")
    return ""


def state_written(node: dict[str, Any]) -> str:
    """When the state label was last written (its owner's managedFields time, RFC 3339), or "" (unknown)."""
    for entry in (node.get("metadata") or {}).get("managedFields") or []:
        labels = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels") or {}
        if f"f:{STATE}" in labels:
            return str(entry.get("time") or "")
    return ""


def stale_failure(kube: Kube, node: str, namespace: str, config_map: str) -> str:
    """Why the node's ``failed`` is not mig-manager's answer for its geometry with ``config_map`` yet, or ""
    when it is."""
    listing = kube.json("get", "pods", "-n", namespace, "-l", f"app={APP}", "--field-selector",
                        f"spec.nodeName={node}") or {}  # fmt: skip
    pods = [p for p in listing.get("items") or [] if not p["metadata"].get("deletionTimestamp")]
    if not pods:
        return f"no mig-manager pod on {node} in {namespace} yet"
    pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")
    mounted, created = mounted_config(pod), pod["metadata"].get("creationTimestamp") or ""
    if mounted != config_map:
        return f"mig-manager on {node} reads ConfigMap {mounted or 'none'}, not {config_map} yet"
    # The state and its time from one read: the caller's "failed" came from an earlier one, and mig-manager may
    # have written "pending" since (its time then would pass for the failure's).
    current = kube.json("get", "node", node, "--show-managed-fields") or {}
    now = metadata(current, "labels").get(STATE) or "none"
    if now != "failed":
        return f"the state moved on to {now}"
    written = state_written(current)
    if not written or written <= created:
        # A run of the new pod that fails before its "pending" leaves "failed" as it was: no new stamp, so it
        # fails when the wait ends, with this line.
        return f"the state has not changed since mig-manager's pod with {config_map} was created ({created})"
    return ""


def main(argv: Sequence[str]) -> int:
    """``--flag value`` pairs (the shell step checked every value)."""
    o = options(argv)
    try:
        mig(rollout_of("mig", o), o["phase"], o["mig_config"], int(o["timeout"]), o["operator_namespace"],
            mode_change=o.get("mode_change") == "1", config_map=o.get("mig_config_map", ""))  # fmt: skip
    except Failure as failure:
        say(f"{failure}\n{failure.output}".rstrip("\n"), err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
