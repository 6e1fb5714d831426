"""What a diff does to the machines and to the GPUs a cluster advertises, from the two plan documents. Pure.

``plan.diff.diff`` says which resources change; this module says what that means once they run:

- per worker, what it advertises before → after (the ``capacity`` rows), and the pods that lose their GPU (a count
  that drops, a resource that disappears, a worker that goes);
- the GPU Operator daemonsets that restart, decided from the operator's own code (NVIDIA/gpu-operator v26.7.0,
  ``controllers/object_controls.go``): the device-plugin, MIG-manager and DCGM-exporter ConfigMaps are mounted as
  volumes of the daemonsets' pod templates by name (``handleDevicePluginConfig``, ``TransformMIGManager``,
  ``TransformDCGMExporter``), and our ConfigMap names are content-addressed, so a content change is a template
  change and the daemonset rolls on every node it runs on. The device plugin and MIG manager also follow their
  node's label (``nvidia.com/device-plugin.config``: the config-manager sidecar; ``nvidia.com/mig.config``: the
  MIG manager applies the new geometry), so a label change restarts them on that node only. A restarted MIG manager
  leaves a node whose geometry already matches alone (NVIDIA/mig-parted v0.15.0, the chart's ``migManager.version``:
  ``pkg/mig/reconfigure/reconfigure.go``, ``isConfigAlreadyApplied``). The MIG manager runs
  only on container nodes with a MIG-capable GPU (``controllers/state_manager.go``: ``hasMIGCapableGPU``). The
  driver daemonset's pods are replaced by the operator's upgrade controller when ``upgradePolicy.autoUpgrade`` is
  on (``controllers/upgrade_controller.go``), else only when deleted (``assets/state-driver/0500_daemonset.yaml``:
  ``updateStrategy: OnDelete``);
- what runs on the machines: a removed worker's retirement (its delete command: ``worker_retirement.py``), VM
  restarts (the large-BAR and MIG restart steps run again: pulumi-command runs ``create`` again on an update when no
  ``update`` command is set) and Proxmox host reboots (host prep runs again), each with the input that changed. A
  guest or VM restart point that runs again only for a change whose class does not drain (``plan/classes.py``: a
  drain setting, a connection) restarts nothing and is left out.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.render.agent_bundle import LAUNCHER
from proxmox_gpu_cluster.stacks.plan.classes import ALL, rolled_machines
from proxmox_gpu_cluster.stacks.plan.diff import Change
from proxmox_gpu_cluster.stacks.plan.values import is_secret

RELEASE = "kubernetes:helm.sh/v3:Release"
NODE_PATCH = "kubernetes:core/v1:NodePatch"
VM = "proxmoxve:index/vmLegacy:VmLegacy"
DEVICE_PLUGIN_LABEL = "nvidia.com/device-plugin.config"
MIG_LABEL = "nvidia.com/mig.config"


def _advertised(row: Mapping[str, Any]) -> dict[str, int]:
    """A capacity row's resources, DRA devices marked (they are requested through claims, not limits)."""
    return {**row.get("resources", {}), **{f"{k} (DRA)": v for k, v in row.get("devices", {}).items()}}


def capacity_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per worker and resource whose advertised count differs: ``{worker, resource, before, after, note}``; note is
    ``new``/``gone`` for a resource that appears/disappears and ``worker added``/``worker removed``."""
    old = {r["worker"]: _advertised(r) for r in before.get("capacity", [])}
    new = {r["worker"]: _advertised(r) for r in after.get("capacity", [])}
    out = []
    for worker in sorted({*old, *new}):
        was, now = old.get(worker), new.get(worker)
        for resource in sorted({*(was or {}), *(now or {})}):
            b, a = (was or {}).get(resource, 0), (now or {}).get(resource, 0)
            if b == a:
                continue
            if was is None:
                note = "worker added"
            elif now is None:
                note = "worker removed"
            else:
                note = "new" if b == 0 else "gone" if a == 0 else ""
            out.append({"worker": worker, "resource": resource, "before": b, "after": a, "note": note})
    return out


def gpu_losses(capacity: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The capacity changes whose count drops: up to that many pods using the resource on that node lose their
    device or their place (a MIG change drains the node first; a removed worker is drained), and no new one fits."""
    return [dict(c) for c in capacity if c["after"] < c["before"]]


def _find(document: Mapping[str, Any], type_: str) -> list[Mapping[str, Any]]:
    return [r for r in document.get("resources", []) if r["type"] == type_]


def _get(value: Any, path: str) -> Any:
    for key in path.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def _labels(document: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Kubernetes node -> the labels this stack patches onto it."""
    return {
        _get(r["inputs"], "metadata.name"): _get(r["inputs"], "metadata.labels") or {}
        for r in _find(document, NODE_PATCH)
    }


def _container_workers(document: Mapping[str, Any]) -> list[str]:
    """Workers whose node runs the operator's container operands (device plugin, DCGM exporter, driver)."""
    return sorted(r["worker"] for r in document.get("capacity", []) if r.get("workload") == "container")


def _mig_workers(document: Mapping[str, Any]) -> list[str]:
    """Container workers with a MIG-capable GPU: where the operator schedules its MIG manager."""
    return sorted(
        r["worker"]
        for r in document.get("capacity", [])
        if r.get("workload") == "container" and any(getattr(CATALOG.get(m), "mig_capable", False) for m in r["gpus"])
    )


def _effect(daemonset: str, reason: str, nodes: Iterable[str], action: str = "restarts") -> dict[str, Any]:
    return {"daemonset": daemonset, "action": action, "reason": reason, "nodes": sorted(set(nodes))}


def _values_change(old: Any, new: Any, path: str) -> str:
    """``path: old → new`` when the Helm value at ``path`` differs, else empty."""
    b, a = _get(old, path), _get(new, path)
    return "" if b == a else f"{path}: {b} → {a}"


def operator_effects(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The GPU Operator daemonsets that restart, why, and on which nodes (see the module docstring)."""
    old_rel, new_rel = _find(before, RELEASE), _find(after, RELEASE)
    gpu_operator = [
        (o, n) for o in old_rel for n in new_rel if o["urn"] == n["urn"] and n["inputs"].get("chart") == "gpu-operator"
    ]
    everywhere = _container_workers(after)
    effects: list[dict[str, Any]] = []
    plugin_all = False
    for old, new in gpu_operator:
        ov, nv = old["inputs"].get("values", {}), new["inputs"].get("values", {})
        if old["inputs"].get("version") != new["inputs"].get("version"):
            reason = (
                f"chart {old['inputs'].get('version')} → {new['inputs'].get('version')}: the operator reconciles its "
                "operands with the new chart's images; each daemonset whose image changed rolls"
            )
            effects.append(_effect("every GPU Operator daemonset", reason, everywhere))
        plugin = [c for p in ("devicePlugin.config.name", "devicePlugin.config.default", "mig.strategy")
                  if (c := _values_change(ov, nv, p))]  # fmt: skip
        if plugin:
            plugin_all = True
            reason = "; ".join(plugin) + " (the pod template mounts the config by name)"
            daemonsets = "nvidia-device-plugin-daemonset and gpu-feature-discovery"
            effects.append(_effect(daemonsets, reason, everywhere, "restart"))
        if mig := _values_change(ov, nv, "migManager.config.name"):
            reason = (
                f"{mig} (the pod template mounts the config by name); each asserts its node's mig.config again, "
                "a no-op where the geometry already matches"
            )
            effects.append(_effect("nvidia-mig-manager", reason, _mig_workers(after)))
        driver = [c for p in ("driver.enabled", "driver.version", "driver.kernelModuleType")
                  if (c := _values_change(ov, nv, p))]  # fmt: skip
        if driver and _get(nv, "driver.enabled"):
            auto = _get(nv, "driver.upgradePolicy.autoUpgrade")
            parallel = _num(_get(nv, "driver.upgradePolicy.maxParallelUpgrades"))
            how = (
                f"the upgrade controller replaces the driver pods, {parallel}"
                " node(s) at a time, evicting each node's GPU pods first (the driver module is unloaded)"
                if auto
                else "autoUpgrade off: the old driver keeps running until its pod is deleted (OnDelete)"
            )
            effects.append(_effect("nvidia-driver-daemonset", f"{'; '.join(driver)}: {how}", everywhere))
        if dcgm := [
            c for p in ("dcgmExporter.enabled", "dcgmExporter.config.name") if (c := _values_change(ov, nv, p))
        ]:
            reason = "; ".join(dcgm) + " (metrics gap while it restarts; no GPU pod is touched)"
            effects.append(_effect("nvidia-dcgm-exporter", reason, everywhere))
    old_labels, new_labels = _labels(before), _labels(after)
    for node in sorted(set(old_labels) & set(new_labels)):
        b, a = old_labels[node], new_labels[node]
        if not plugin_all and b.get(DEVICE_PLUGIN_LABEL) != a.get(DEVICE_PLUGIN_LABEL):
            reason = f"{DEVICE_PLUGIN_LABEL}: {b.get(DEVICE_PLUGIN_LABEL)} → {a.get(DEVICE_PLUGIN_LABEL)}"
            action = "switches its config and restarts (config-manager sidecar)"
            effects.append(_effect("nvidia-device-plugin", reason, [node], action))
        if b.get(MIG_LABEL) != a.get(MIG_LABEL):
            reason = (
                f"{MIG_LABEL}: {b.get(MIG_LABEL)} → {a.get(MIG_LABEL)} (it stops the node's GPU clients while it "
                "does; the node is drained first through a rollout slot)"
            )
            effects.append(_effect("nvidia-mig-manager", reason, [node], "applies a new MIG geometry"))
    return effects


def _flags(command: Any) -> dict[str, str]:
    """A step's command line as ``flag -> values`` (a repeated flag's values joined), positionals under
    ``(args)``; the interpreter and the step's own path are left out (the agent bundle says when that changes)."""
    if not isinstance(command, str) or is_secret(command):
        return {}
    try:
        words = shlex.split(command)
    except ValueError:
        return {"(command)": command}
    out: dict[str, list[str]] = {}
    key, scope = "(args)", ""
    for word in words:
        if word == "--":  # what follows is the arguments of another step (the guest's, run through the host's)
            key, scope = "guest (args)", "guest "
        elif word.startswith("--"):
            key = scope + word
            out.setdefault(key, [])
        elif key != "(args)" or not (
            word in ("bash", "sudo", "-n", "-c", LAUNCHER) or (not out and word.endswith("/step.sh"))
        ):
            out.setdefault(key, []).append(word)
    return {k: " ".join(v) for k, v in out.items()}


def step_reason(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, change: Change) -> str:
    """Why a step runs again: its command's changed arguments (``--acs-override 0 → 1``), its agent bundle, or
    else its changed input paths (a secret input only as ``changed (secret)``)."""
    reasons = []
    if old is not None and new is not None:
        b, a = _flags(old["inputs"].get("create")), _flags(new["inputs"].get("create"))
        reasons = [f"{k} {b.get(k, '(none)')} → {a.get(k, '(none)')}" for k in sorted({*b, *a}) if b.get(k) != a.get(k)]
    if change.bundle:
        reasons.append(f"agent {change.bundle}")
    if not reasons:
        reasons = [_path_change(old, new, p) for p in change.paths]
    if not reasons and change.action == "replace":
        return "replaced along with its replaceWith target"
    return ", ".join(reasons) or change.action


def _path_change(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None, path: str) -> str:
    """``path old → new`` for a short plain value, ``path changed (secret)`` for a redacted one, else ``path``."""
    b = _get(old["inputs"], path) if old is not None else None
    a = _get(new["inputs"], path) if new is not None else None
    if is_secret(a) or is_secret(b):  # plain or fingerprinted: never shown, only said
        return f"{path} changed (secret)"
    plain = (str, int, float, bool, type(None))
    if isinstance(a, plain) and isinstance(b, plain) and len(str(a)) + len(str(b)) <= 80:
        return f"{path} {_num(b)} → {_num(a)}"
    return path


def _num(value: Any) -> Any:
    """A number as the spec wrote it (the engine serialises every number as a float)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _clusters(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The document's disruption reports (one per cluster spec)."""
    d = document.get("disruption") or {}
    return [d] if "hosts" in d else [v for v in d.values() if isinstance(v, Mapping)]


def _removal(document: Mapping[str, Any], worker: str) -> Mapping[str, Any]:
    """The ``workerRemoval`` report of the cluster ``worker`` belongs to."""
    clusters = _clusters(document)
    for c in clusters:
        if any(worker in h.get("workers", []) for h in c.get("hosts", {}).values()):
            return dict(c.get("workerRemoval", {}))
    return dict(clusters[0].get("workerRemoval", {})) if clusters else {}


def _retirement(before: Mapping[str, Any], step: Mapping[str, Any]) -> dict[str, Any]:
    """What deleting one retirement step does (its delete command, ``worker_retirement.py``, agent
    ``kubeapi.py`` retire: cordon, drain, delete the Node, ``kubeadm reset``), then what destroying its VM does."""
    flags = _flags(step["inputs"].get("delete"))
    worker, vmid = flags.get("--node-name", "").split(" ")[0], flags.get("--vmid", "")
    vms = [r for r in _find(before, VM) if vmid.isdigit() and r["inputs"].get("vmId") == int(vmid)]
    host = vms[0]["inputs"].get("nodeName", "") if vms else ""
    removal = _removal(before, worker)
    # retire_vm.sh skips the drain only when qm says the guest is gone; any other qm failure fails the step.
    steps = ["cordoned", f"drained (evictions, PodDisruptionBudgets respected, at most "
             f"{flags.get('--timeout') or removal.get('drainTimeoutSeconds', '?')} s; skipped with a warning only if "
             "qm finds the VM stopped or its guest agent gone, any other qm failure stops the removal)",
             "Node deleted"]  # fmt: skip
    if flags.get("guest --kubeadm-reset") == "1":
        steps.append("kubeadm reset")
    return {
        "worker": worker,
        "vmid": int(vmid) if vmid.isdigit() else None,
        "host": host,
        "steps": steps,
        "protected": bool(
            step.get("options", {}).get("protect") or any(v.get("options", {}).get("protect") for v in vms)
        ),
    }


REBOOT_KIND = {"-host-prep-prep": "host", "-large-bar": "vm", "-mig-restart": "vm", "-bootstrap-driver": "guest"}
"""Reboot point (``plan.REBOOTS``) -> what it restarts: the Proxmox node, the worker's VM, or the guest OS."""
SLOTTED = ("-bootstrap-driver", "-mig-restart")
"""The reboot points that restart only inside a rollout slot, for a change that drains."""


def machine_effects(
    before: Mapping[str, Any], after: Mapping[str, Any], changes: Sequence[Change], prefix: str = ""
) -> dict[str, Any]:
    """What runs on the machines: workers retired (removed, or before their VM is replaced), VMs replaced, and
    every reboot point that runs again with the reason (see the module docstring)."""
    old = {r["urn"]: r for r in before.get("resources", [])}
    new = {r["urn"]: r for r in after.get("resources", [])}
    retired, replaced, restarts = [], [], []
    # A guest or VM restart happens inside a rollout slot, for a change whose class drains (core/change_classes.py)
    # or a change of what the step runs; a step that runs again for a setting or a connection restarts nothing.
    rolled = rolled_machines(before, after)
    for c in changes:
        if c.name.endswith("-retirement-drain") and c.action in ("remove", "replace") and c.urn in old:
            entry = _retirement(before, old[c.urn])
            entry["then"] = "VM destroyed" if c.action == "remove" else "VM replaced (deleted first, then created)"
            retired.append(entry)
        elif c.type == VM and c.action == "replace":
            replaced.append(
                {"vm": c.name.removeprefix(prefix), "reason": step_reason(old.get(c.urn), new.get(c.urn), c)}
            )
        if c.action not in ("update", "replace"):
            continue
        for suffix, kind in REBOOT_KIND.items():
            if c.name.endswith(suffix) and c.name.startswith(prefix):
                machine = c.name.removeprefix(prefix).removesuffix(suffix)
                slotted = suffix in SLOTTED and c.action == "update" and not c.bundle
                if slotted and rolled is not None and not rolled & {ALL, machine}:
                    continue
                restarts.append({
                    "machine": machine,
                    "kind": kind,
                    "step": c.name.removeprefix(prefix),
                    "may": after.get("rebootPoints", {}).get(c.name, ""),
                    "mayReboot": _host_policy(after, machine) if kind == "host" else "",
                    "reason": step_reason(old.get(c.urn), new.get(c.urn), c),
                })  # fmt: skip
    return {"workersRetired": retired, "vmsReplaced": replaced, "reboots": restarts}


def _host_policy(document: Mapping[str, Any], host: str) -> str:
    for c in _clusters(document):
        if host in c.get("hosts", {}):
            return str(c["hosts"][host].get("mayReboot", ""))
    return ""


def impact(
    before: Mapping[str, Any], after: Mapping[str, Any], changes: Sequence[Change], prefix: str = ""
) -> dict[str, Any]:
    """Everything above as plain data (the ``impact`` of ``plan.report.diff_document``)."""
    capacity = capacity_changes(before, after)
    return {
        "capacity": capacity,
        "gpuLosses": gpu_losses(capacity),
        "operator": operator_effects(before, after),
        **machine_effects(before, after, changes, prefix),
    }


def impact_lines(data: Mapping[str, Any]) -> list[str]:
    """``impact`` as one line per item, for the text and markdown reports."""
    lines = []
    for c in data["capacity"]:
        note = f" ({c['note']})" if c["note"] else ""
        lines.append(f"{c['worker']}: {c['resource']} {c['before']} → {c['after']}{note}")
    for e in data["operator"]:
        lines.append(f"GPU Operator: {e['daemonset']} {e['action']} on {_list(e['nodes'])}: {e['reason']}")
    for c in data["gpuLosses"]:
        lines.append(
            f"Pods lose their GPU on {c['worker']}: {c['resource']} {c['before']} → {c['after']} "
            f"(up to {c['before'] - c['after']} pod(s) using it lose their device or place)"
        )
    for w in data["workersRetired"]:
        where = f" (VM {w['vmid']} on {w['host']})" if w["host"] else ""
        flag = "; will fail: protected (see its rows)" if w["protected"] else ""
        lines.append(f"Worker {w['worker']}{where} retired: {', '.join([*w['steps'], w['then']])}{flag}")
    for v in data["vmsReplaced"]:
        lines.append(f"VM {v['vm']} replaced: {v['reason']}")
    for r in data["reboots"]:
        kind = {"host": "Proxmox host", "vm": "VM of", "guest": "guest of"}[r["kind"]]
        policy = f", rebootPolicy {r['mayReboot']}" if r["mayReboot"] else ""
        lines.append(f"{kind} {r['machine']}: {r['step']} runs again ({r['reason']}){policy}; reboot point: {r['may']}")
    return lines


def _list(names: Sequence[str]) -> str:
    return ", ".join(names) or "no node"
