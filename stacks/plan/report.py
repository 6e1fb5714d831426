"""What a diff disrupts, and the diff as text, markdown (a pull-request comment) or JSON. Pure (the changes of
``plan.diff.diff`` and the two plan documents in, plain data and text out).

The summary says what a reviewer needs before anything runs: the Proxmox nodes whose host prep runs again (and so may
reboot), the VMs replaced or destroyed, the GPU nodes drained through rollout slots (a new driver step or MIG
geometry) and in how many rounds, the ConfigMaps recreated, and which node-agent steps run again because what they
run changed (their bundle's fingerprint in the command, ``render/agent_bundle.py``), in plain text: a step's stdin
is secret, so its script change would otherwise show only as a changed ``create``. Given the two plan documents, it
also says what the changes do once they run (``plan/impact.py``): each node's advertised resources before → after,
the GPU Operator daemonsets that restart, the pods that lose their GPU, the workers retired and the machines that
may restart, with the input that changed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from proxmox_gpu_cluster.stacks.plan.classes import ALL, class_document, field_changes, rolled_machines
from proxmox_gpu_cluster.stacks.plan.diff import Change, change_rows
from proxmox_gpu_cluster.stacks.plan.impact import impact, impact_lines

Plan = Mapping[str, Any] | None
"""A plan document (``plan.plan_document``); None when the caller has only the changes."""


def _owner(change: Change, suffixes: Sequence[str], prefix: str) -> str | None:
    """The worker or Proxmox node a step belongs to, from its name ``<prefix><owner><suffix>``."""
    for suffix in suffixes:
        if change.name.endswith(suffix) and change.name.startswith(prefix):
            return change.name.removesuffix(suffix).removeprefix(prefix)
    return None


def summary(
    changes: Sequence[Change],
    max_unavailable: int = 1,
    prefix: str = "",
    *,
    before: Plan = None,
    after: Plan = None,
) -> dict[str, Any]:
    """What the changes disrupt (see the module docstring); ``prefix``: ``cluster_prefix`` of the plan;
    ``before``/``after``: the two plan documents (``impact`` is None without them)."""
    touched = [c for c in changes if c.action in ("update", "replace")]
    hosts = sorted({o for c in touched if (o := _owner(c, ("-host-prep-prep",), prefix)) is not None})
    vms = sorted(c.name for c in changes if c.type.endswith("vmLegacy:VmLegacy") and c.action in ("replace", "remove"))
    drained = _drained(touched, prefix, before, after)
    fields = field_changes(before, after) if before is not None and after is not None else []
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
        "willFail": sorted(c.name.removeprefix(prefix) for c in changes if c.fails),
        "fieldChanges": class_document(fields),
        "refused": [f.path for f in fields if f.refused],
        "impact": impact(before, after, changes, prefix) if before is not None and after is not None else None,
    }


def _drained(touched: Sequence[Change], prefix: str, before: Plan, after: Plan) -> list[str]:
    """The workers drained through a rollout slot: those whose driver, join or MIG step runs again, for a changed
    spec field whose class drains (``core/change_classes.py``: a drain or slot setting, ``sshAgent``, ``authMode``
    or ``joinMethod`` changes the step's command or connection, and the step drains nothing for it) or, for the
    driver and MIG steps, for a change of what the step runs (its agent bundle: the diff cannot tell what the new
    code decides; the join step drains only for a new minor and the VM-restart step only for pending hardware, both
    spec changes). Without the specs (an older
    revision's plan document) every driver and MIG step counts, and no join step (its re-runs are mostly a new
    join token or new code)."""
    rolled = rolled_machines(before, after) if before is not None and after is not None else None
    bundles = {c.name for c in touched if c.bundle}
    out: set[str] = set()
    for c in touched:
        if (owner := _owner(c, ("-bootstrap-driver", "-mig-begin"), prefix)) is not None:
            drains = rolled is None or ALL in rolled or owner in rolled or c.name in bundles
        elif (owner := _owner(c, ("-bootstrap-join", "-bootstrap-vm-restart"), prefix)) is not None:
            drains = rolled is not None and (ALL in rolled or owner in rolled)
        if owner is not None and drains:
            out.add(owner)
    return sorted(out)


def agent_steps(changes: Sequence[Change], prefix: str = "") -> dict[str, list[str]]:
    """``<step> <old>→<new>`` -> the resources (without ``prefix``) that run it again because its bundle changed."""
    out: dict[str, list[str]] = {}
    for c in changes:
        if c.bundle:
            out.setdefault(c.bundle, []).append(c.name.removeprefix(prefix))
    return {bundle: sorted(names) for bundle, names in sorted(out.items())}


def diff_document(
    changes: Sequence[Change],
    max_unavailable: int = 1,
    prefix: str = "",
    *,
    before: Plan = None,
    after: Plan = None,
) -> dict[str, Any]:
    """The diff as plain data (``--json``)."""
    s = summary(changes, max_unavailable, prefix, before=before, after=after)
    return {"summary": s, "changes": [asdict(c) for c in changes]}


def render_diff(
    changes: Sequence[Change],
    max_unavailable: int = 1,
    prefix: str = "",
    *,
    markdown: bool = False,
    before: Plan = None,
    after: Plan = None,
) -> str:
    """The diff for a terminal, or for a pull-request comment (``markdown``)."""
    s = summary(changes, max_unavailable, prefix, before=before, after=after)
    retired = [w["worker"] for w in (s["impact"] or {}).get("workersRetired", [])]
    if s["nodesRolled"]:
        rolled = (
            f"{len(s['nodesRolled'])} GPU node(s) drained and changed, {max_unavailable} at a time "
            f"({s['rollingRounds']} round(s)): {', '.join(s['nodesRolled'])}"
        )
    elif retired:
        rolled = f"no GPU node drained through a rollout slot; drained to be retired: {', '.join(retired)}"
    else:
        rolled = "no GPU node drained"
    failing = (
        [
            # The engine refuses such a step when it reaches it (pulumi v3.259.0 step.go, step_generator.go): what
            # ran before it is applied, so an approved change can leave a half-done up.
            f"WILL FAIL at pulumi up ({len(s['willFail'])} resource(s), see their rows; the up stops there, after "
            f"applying what ran before): {', '.join(s['willFail'])}"
        ]
        if s["willFail"]
        else []
    )
    refused = (
        [
            f"REFUSED: no supported path for {len(s['refused'])} spec change(s) (pulumi up would fail or leave the "
            f"cluster broken; see their Spec lines for the procedure): {', '.join(s['refused'])}"
        ]
        if s["refused"]
        else []
    )
    lines = [
        *failing,
        *refused,
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
    lines += _field_lines(s["fieldChanges"])
    effects = impact_lines(s["impact"]) if s["impact"] is not None else []
    rows = [row for c in changes for row in change_rows(c)]
    if not markdown:
        what = ["", "What it does to the nodes:", *(f"  {line}" for line in effects)] if effects else []
        return "\n".join([*lines, *what, "", *rows]) + "\n"
    items = [f"- {markdown_text(line)}" for line in effects]
    what = ["", "#### What it does to the nodes", "", *items] if effects else []
    head = ["### Offline plan diff", "", *(f"- {markdown_text(line)}" for line in lines), *what, ""]
    body = ["<details><summary>Resources</summary>", "", code_block(rows, "diff"), "", "</details>"]
    return "\n".join([*head, *body]) + "\n"


def _field_lines(fields: Sequence[Mapping[str, Any]]) -> list[str]:
    """The ``fieldChanges`` of a summary as ``class_lines`` prints them."""
    out = []
    for f in fields:
        head = f"Spec {f['path']}: {f['from']} → {f['to']}"
        if f["refused"]:
            out.append(f"{head} [refused: no supported path]: {f['refused']}")
        elif f["class"] == "unclassified":
            out.append(f"{head} [unclassified]")
        elif not f["supported"]:
            out.append(f"{head} [{f['class']}, NOT carried out by pulumi up]: {f['what']}; instead: {f['procedure']}")
        else:
            out.append(f"{head} [{f['class']}]: {f['what']}")
    return out


_MARKDOWN = re.compile(r"[\\`*_\[\]<>&|#~]|@(?=\w)")


def markdown_text(line: str) -> str:
    """A line of plain text as GitHub markdown shows it literally: its punctuation escaped, ``<``/``>``/``&`` as
    entities (no HTML, no comment that hides the rest), ``@name`` not a mention. Values in a diff come from the
    stack file, which a pull request's author writes."""
    entities = {"<": "&lt;", ">": "&gt;", "&": "&amp;", "@": "&#64;"}
    return _MARKDOWN.sub(lambda m: entities.get(m[0], "\\" + m[0]), line)


def code_block(lines: Sequence[str], info: str = "") -> str:
    """``lines`` as a fenced code block no line of them can close (a fence longer than any run of backticks)."""
    text = "\n".join(lines)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}"


def _names(names: Sequence[str]) -> str:
    return ", ".join(names) or "none"
