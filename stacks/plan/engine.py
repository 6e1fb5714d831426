"""What the Pulumi engine adds to a provider's diff: protection, retainOnDelete, and the dependents it replaces along
with a delete-first replacement. Pure (plan documents and changes in, plain data out).

Read from pulumi/pulumi v3.259.0:
- pkg/resource/deploy/source_eval.go ``inheritFromParent``: a child without its own protect or retainOnDelete takes
  its parent's (the Python SDK does the same for protect, sdk/python/lib/pulumi/resource.py).
- pkg/resource/deploy/step.go ``DeleteStep.Apply``: deleting a resource protected in the state fails, preview too,
  and before retainOnDelete is looked at.
- pkg/resource/deploy/step_generator.go: a replace fails when the resource is protected both in the state and in the
  program (turning protect off in the same change lets it through); with delete-before-replace the engine first
  deletes every dependent whose inputs from the replaced resource would make its provider replace it
  (``calculateDependentReplacements``: those inputs become unknown), and refuses outright when one of those is
  protected in the state, whatever the program says.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxmox_gpu_cluster.stacks.plan.diff import Change


def effective(document: Mapping[str, Any], option: str) -> dict[str, bool]:
    """URN -> whether ``option`` (``protect``, ``retainOnDelete``) holds, inherited from the parent chain. A plan
    document cannot tell an explicit False from unset, so a child of a protected parent counts as protected:
    flagged, never missed."""
    by_urn = {r["urn"]: r for r in document["resources"]}
    out: dict[str, bool] = {}

    def of(urn: str, seen: frozenset[str]) -> bool:
        if urn not in out:
            r = by_urn.get(urn)
            parent = r.get("parent") if r else None
            own = bool(r and r.get("options", {}).get(option))
            out[urn] = own or bool(parent and parent not in seen and of(parent, seen | {urn}))
        return out[urn]

    for urn in by_urn:
        of(urn, frozenset())
    return out


def unprotect_command(urn: str) -> str:
    """The command that lifts protection in the state, quoted for a POSIX shell (a URN holds ``$`` and ``::``)."""
    return f"pulumi state unprotect {shlex.quote(urn)}"


def engine_urns(document: Mapping[str, Any]) -> dict[str, str]:
    """Plan URN -> the URN the engine stores for that resource. Its type part chains the types of every ancestor
    below the stack (``A$B$C``: sdk/python/lib/pulumi/resource.py takes the parent URN's whole type part), where the
    mock monitor's URN in a plan names only the parent's type (``B$C``: pulumi/runtime/mocks.py); ``pulumi state``
    commands need the engine's."""
    by_urn = {r["urn"]: r for r in document["resources"]}
    chains: dict[str, str] = {}

    def chain(urn: str, depth: int) -> str:
        if urn not in chains:
            r = by_urn[urn]
            parent = by_urn.get(r.get("parent") or "")
            if parent is None or parent["type"] == "pulumi:pulumi:Stack" or depth > 100:
                chains[urn] = r["type"]
            else:
                chains[urn] = f"{chain(parent['urn'], depth + 1)}${r['type']}"
        return chains[urn]

    return {
        urn: urn if r["type"] == "pulumi:pulumi:Stack" else "::".join([*urn.split("::")[:2], chain(urn, 0), r["name"]])
        for urn, r in by_urn.items()
    }


def protection(
    change: Change, before: Mapping[str, bool], after: Mapping[str, bool], dependent: bool, state_urn: str = ""
) -> Change:
    """``change`` flagged when the engine refuses it: a remove of a resource protected in the state, a replace of
    one protected in the state and the program, or (``dependent``) a delete-first replacement of a dependent
    protected in the state. ``state_urn``: the URN the engine stores for it (``engine_urns``)."""
    was = before.get(change.urn, False)
    refused = (change.action == "remove" and was) or (
        change.action == "replace" and was and (dependent or after.get(change.urn, False))
    )
    if not refused:
        return change
    command = unprotect_command(state_urn or change.urn)
    if change.action == "remove":  # the state's flag decides; the program no longer has the resource to unflag
        why = f"will fail: protected (run first: {command}; or deploy protect off before removing it)"
    elif dependent:
        why = f"will fail: protected, and replaced as a dependent of a delete-first replacement (run first: {command})"
    else:
        why = f"will fail: protected (run first: {command}; or turn protect off in the same change)"
    return replace(change, protected=True, unprotect=command, fails=(*change.fails, why))


def _custom(resource: Mapping[str, Any]) -> bool:
    # Components are never replaced as dependents. A plan document has no custom flag: every custom resource this
    # kind of program registers has an explicit provider, and providers are custom.
    return bool(resource.get("provider")) or resource["type"].startswith("pulumi:providers:")


def dependent_replacements(
    before: Mapping[str, Any],
    roots: Sequence[str],
    forced: Callable[[Mapping[str, Any]], Sequence[str]],
    covered: Callable[[str, Sequence[str]], bool],
) -> dict[str, list[str]]:
    """URN -> why the engine replaces it first, for the dependents (in the state, ``before``) of the delete-first
    replacements ``roots``. A dependent goes when an input that comes from something replaced (its
    ``propertyDependencies``) holds a path ``forced`` reports for it (provider rules plus replaceOnChanges) that its
    ignoreChanges do not cover (``covered(path, ignoreChanges)``), or when its provider is replaced."""
    by_urn = {r["urn"]: r for r in before["resources"]}
    names = {urn: r["name"] for urn, r in by_urn.items()}
    gone = set(roots)
    out: dict[str, list[str]] = {}
    grew = True
    while grew:
        grew = False
        for urn, r in by_urn.items():
            if urn in gone or not _custom(r):
                continue
            reasons = []
            provider = r.get("provider")
            if provider in gone:
                reasons.append(f"its provider {names.get(provider, provider)} is replaced delete-first")
            ignored = r.get("options", {}).get("ignoreChanges", [])
            for key, sources in sorted((r.get("propertyDependencies") or {}).items()):
                hit = [s for s in sources if s in gone]
                paths = [p for p in forced(r) if p.split(".")[0].split("[")[0] == key and not covered(p, ignored)]
                if hit and paths:
                    reasons.append(
                        f"its {key} comes from {', '.join(names.get(s, s) for s in hit)}, replaced delete-first "
                        f"(unknown until then, and {paths[0]} forces a replace)"
                    )
            if reasons:
                out[urn] = reasons
                gone.add(urn)
                grew = True
    return out
