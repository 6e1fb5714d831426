"""What a diff disrupts, and the diff as text, markdown (a pull-request comment) or JSON. Pure (the changes of
``plan_diff.diff`` in, plain data and text out).

The summary says what a reviewer needs before anything runs: the Proxmox nodes whose host prep runs again (and so may
reboot), the VMs replaced or destroyed, the GPU nodes drained through rollout slots (a new driver step or MIG
geometry) and in how many rounds, the ConfigMaps recreated, and which node-agent steps run again because what they
run changed (their bundle's fingerprint in the command, ``render/agent_bundle.py``), in plain text: a step's stdin
is secret, so its script change would otherwise show only as a changed ``create``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from proxmox_gpu_cluster.stacks.plan_diff import Change, change_rows


def _owner(change: Change, suffixes: Sequence[str], prefix: str) -> str | None:
    """The worker or Proxmox node a step belongs to, from its name ``<prefix><owner><suffix>``."""
    for suffix in suffixes:
        if change.name.endswith(suffix) and change.name.startswith(prefix):
            return change.name.removesuffix(suffix).removeprefix(prefix)
    return None


def summary(changes: Sequence[Change], max_unavailable: int = 1, prefix: str = "") -> dict[str, Any]:
    """What the changes disrupt (see the module docstring); ``prefix``: ``cluster_prefix`` of the plan."""
    touched = [c for c in changes if c.action in ("update", "replace")]
    hosts = sorted({o for c in touched if (o := _owner(c, ("-host-prep-prep",), prefix)) is not None})
    vms = sorted(c.name for c in changes if c.type.endswith("vmLegacy:VmLegacy") and c.action in ("replace", "remove"))
    drained = sorted({o for c in touched if (o := _owner(c, ("-bootstrap-driver", "-mig-begin"), prefix)) is not None})
    return {
        "added": sum(c.action == "add" for c in changes),
        "removed": sum(c.action == "remove" for c in changes),
        "updated": sum(c.action == "update" for c in changes),
        "replaced": sum(c.action == "replace" for c in changes),
        "hostPrepRuns": hosts,
        "vmsReplacedOrDestroyed": vms,
        "nodesRolled": drained,
        "rollingRounds": math.ceil(len(drained) / max_unavailable) if drained else 0,
        "configMapsRecreated": sorted(
            c.name for c in changes if c.type == "kubernetes:core/v1:ConfigMap" and c.action == "replace"
        ),
        "agentSteps": agent_steps(changes, prefix),
    }


def agent_steps(changes: Sequence[Change], prefix: str = "") -> dict[str, list[str]]:
    """``<step> <old>→<new>`` -> the resources (without ``prefix``) that run it again because its bundle changed."""
    out: dict[str, list[str]] = {}
    for c in changes:
        if c.bundle:
            out.setdefault(c.bundle, []).append(c.name.removeprefix(prefix))
    return {bundle: sorted(names) for bundle, names in sorted(out.items())}


def diff_document(changes: Sequence[Change], max_unavailable: int = 1, prefix: str = "") -> dict[str, Any]:
    """The diff as plain data (``--json``)."""
    return {"summary": summary(changes, max_unavailable, prefix), "changes": [asdict(c) for c in changes]}


def render_diff(
    changes: Sequence[Change], max_unavailable: int = 1, prefix: str = "", *, markdown: bool = False
) -> str:
    """The diff for a terminal, or for a pull-request comment (``markdown``)."""
    s = summary(changes, max_unavailable, prefix)
    rolled = (
        f"{len(s['nodesRolled'])} GPU node(s) drained and changed, {max_unavailable} at a time "
        f"({s['rollingRounds']} round(s)): {', '.join(s['nodesRolled'])}"
        if s["nodesRolled"]
        else "no GPU node drained"
    )
    lines = [
        f"{s['added']} to add, {s['updated']} to update, {s['replaced']} to replace, {s['removed']} to remove",
        f"Proxmox hosts whose host prep runs again (may reboot, per rebootPolicy): {_names(s['hostPrepRuns'])}",
        f"VMs replaced or destroyed: {_names(s['vmsReplacedOrDestroyed'])}",
        rolled,
        f"ConfigMaps recreated: {_names(s['configMapsRecreated'])}",
        *(
            [
                f"Node agent: {bundle} re-runs on {len(names)} machine(s) (what it runs changed): {', '.join(names)}"
                for bundle, names in s["agentSteps"].items()
            ]
            or ["Node agent: no step runs again for a change of what it runs"]
        ),
    ]
    rows = [row for c in changes for row in change_rows(c)]
    if not markdown:
        return "\n".join([*lines, "", *rows]) + "\n"
    head = ["### Offline plan diff", "", *(f"- {line}" for line in lines), ""]
    body = ["<details><summary>Resources</summary>", "", "```diff", *rows, "```", "", "</details>"]
    return "\n".join([*head, *body]) + "\n"


def _names(names: Sequence[str]) -> str:
    return ", ".join(names) or "none"
