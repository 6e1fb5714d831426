"""What the issue (26) demands of each golden pull request of test_diff_golden.py, independent of the wording
around it: changed values as old → new, capacity before → after per node, cluster-wide restarts, the disruption of
a removed worker, the protected removal that will fail, the providers' replacement rules, secrets only as
"changed (secret)". A golden file can only say the output did not change; these say it is right."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from proxmox_gpu_cluster.render.agent_bundle import fingerprint
from tests.stacks.test_diff_golden import CIPHERTEXTS, SCENARIOS, CodePlanner, Planner, code_planner, planner
from tests.support import ROOT

__all__ = ["code_planner", "planner"]  # the shared fixtures

PINNED_URNS = set((ROOT / "tests" / "stacks" / "urns" / "prod.txt").read_text().split())
"""The engine's URNs of the prod stack (test_urns.py pins them): the only ones ``pulumi state`` accepts."""
ZERO = r"(?:0|none|\(none\))"
WORKERS = ("gpu-a100-a", "gpu-a100-b", "gpu-a10-a", "gpu-a10-b")


def lines_with(text: str, *words: str) -> list[str]:
    """The lines of ``text`` holding every word (case-insensitive)."""
    return [line for line in text.splitlines() if all(w.lower() in line.lower() for w in words)]


def shows_change(text: str, old: str, new: str) -> bool:
    """``old → new`` on one line, or a unified diff's ``-`` line with ``old`` and ``+`` line with ``new``."""
    lines = text.splitlines()
    inline = any(old in line and new in line.split(old, 1)[1].split("→", 1)[-1] and "→" in line for line in lines)
    removed = any(line.strip().startswith("-") and old in line for line in lines)
    added = any(line.strip().startswith("+") and new in line for line in lines)
    return inline or (removed and added)


def capacity(text: str, worker_name: str, resource: str, old: str, new: str) -> bool:
    """A line ``<worker>: ... <resource> <old> → <new>`` (the issue's ``gpu-a10-a: nvidia.com/gpu 8 → 16``)."""
    pattern = rf"{re.escape(worker_name)}: .*{re.escape(resource)}:? {old} → {new}(?![\d.])"
    return any(re.search(pattern, line) for line in text.splitlines())


def change(document: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in document["changes"] if c["name"] == name]
    assert len(found) == 1, f"{name}: {len(found)} changes"
    return found[0]


def json_values(document: dict[str, Any], name: str) -> str:
    """The old → new lines ``--json`` gives for one change."""
    return "\n".join(change(document, name)["values"])


def holds(data: Any, **fields: Any) -> bool:
    """``data`` (the JSON summary, at any depth) holds a mapping with these fields: the JSON says it too."""
    if isinstance(data, dict):
        if all(data.get(k) == v for k, v in fields.items()):
            return True
        return any(holds(v, **fields) for v in data.values())
    return isinstance(data, list) and any(holds(v, **fields) for v in data)


def changed_names(document: dict[str, Any], *types: str) -> set[str]:
    return {c["name"] for c in document["changes"] if not types or c["type"].endswith(types)}


def drained(text: str) -> set[str]:
    """The workers named on the diff's lines about draining nodes (not the resource rows)."""
    head = [
        line for line in text.splitlines() if "drain" in line.lower() and not line.lstrip().startswith(("+", "-", "~"))
    ]
    return {w for w in (*WORKERS, "gpu-a10-c") for line in head if re.search(rf"\b{w}\b", line)}


def test_driver_version_bump(planner: Planner) -> None:
    out = planner.outputs("driver-version-bump")
    for text in (out.txt, out.md, json_values(out.document, "cluster-gpu-a10-a-bootstrap-driver")):
        assert shows_change(text, "580.95.05", "580.105.08")
    assert drained(out.txt) == set(WORKERS)
    assert changed_names(out.document, "VmLegacy", "host-prep-prep") == set()


def test_driver_branch_change(planner: Planner) -> None:
    out = planner.outputs("driver-branch-change")
    assert shows_change(out.txt, "--branch 580", "--branch 595")
    assert drained(out.txt) == set(WORKERS)


def test_driver_change_lists_each_guest_reboot_with_its_reason(planner: Planner) -> None:
    text = planner.outputs("driver-version-bump").txt
    for name in WORKERS:
        assert [line for line in lines_with(text, name) if re.search(r"reboot|restart", line, re.I)], name


def test_time_slicing_replicas(planner: Planner) -> None:
    out = planner.outputs("time-slicing-replicas")
    assert capacity(out.txt, "gpu-a10-a", "nvidia.com/gpu", "8", "16")
    assert capacity(out.txt, "gpu-a10-b", "nvidia.com/gpu", "4", "8")
    assert holds(out.document["summary"], worker="gpu-a10-a", resource="nvidia.com/gpu", before=8, after=16)
    assert not re.search(r"gpu-a100-[ab]: nvidia\.com/\S+ \S+ →", out.txt)  # the MIG nodes advertise the same
    assert change(out.document, "cluster-gpu-operator-device-plugin-config")["action"] == "replace"
    # pulumi-kubernetes replaces a Job whose spec.template changes (the annotation naming what it waited for)
    assert change(out.document, "cluster-gpu-smoke-test-job")["action"] == "replace"
    assert drained(out.txt) == set()


def restarts(text: str, what: str) -> list[str]:
    """The lines saying ``what`` (a regex) restarts on every GPU node."""
    return [
        line
        for line in text.splitlines()
        if re.search(rf"{what}.*restart", line, re.I) and all(re.search(rf"\b{w}\b", line) for w in WORKERS)
    ]


def test_time_slicing_replicas_restart_the_device_plugin_on_every_node(planner: Planner) -> None:
    assert restarts(planner.outputs("time-slicing-replicas").txt, r"device[- ]plugin")


def test_mig_geometry(planner: Planner) -> None:
    out = planner.outputs("mig-geometry")
    assert capacity(out.txt, "gpu-a100-b", "nvidia.com/mig-3g.20gb", "1", "2")
    assert holds(out.document["summary"], worker="gpu-a100-b", resource="nvidia.com/mig-3g.20gb", before=1, after=2)
    assert capacity(out.txt, "gpu-a100-b", "nvidia.com/mig-2g.10gb", "1", ZERO)
    assert capacity(out.txt, "gpu-a100-b", "nvidia.com/mig-1g.5gb", "2", ZERO)
    assert drained(out.txt) == {"gpu-a100-b"}
    assert lines_with(out.txt, "mig-manager")
    # the pods using the profiles the node stops advertising
    assert lines_with(out.txt, "lose", "gpu-a100-b", "nvidia.com/mig-2g.10gb")
    assert shows_change(out.txt, "2g.10gb: 1", "3g.20gb: 2")  # the mig-parted config as a diff of its lines


def test_add_worker(planner: Planner) -> None:
    out = planner.outputs("add-worker")
    assert capacity(out.txt, "gpu-a10-c", "nvidia.com/gpu", ZERO, "4")
    assert holds(out.document["summary"], worker="gpu-a10-c", resource="nvidia.com/gpu", after=4)
    assert change(out.document, "cluster-gpu-a10-c-vm")["action"] == "add"
    touched = {c["name"] for c in out.document["changes"] if c["action"] != "add"}
    assert not [n for n in touched if n.endswith(("-vm", "-host-prep-prep", "-bootstrap-driver"))]
    assert drained(out.txt) == set()


def removal_lines(text: str) -> list[str]:
    """The disruption lines about the removed worker: drained, reset, its Node deleted, its VM destroyed."""
    return [
        line
        for line in lines_with(text, "gpu-a10-b")
        if all(re.search(w, line, re.I) for w in ("drain", "reset", r"node\b.*delet", "destroy"))
    ]


@pytest.mark.parametrize("name", ["remove-worker", "remove-protected-worker"])
def test_removing_a_worker_says_what_its_retirement_does(planner: Planner, name: str) -> None:
    text = planner.outputs(name).txt
    assert removal_lines(text)
    assert "gpu-a10-b" in drained(text)
    assert capacity(text, "gpu-a10-b", "nvidia.com/gpu", "4", ZERO)


def test_removing_an_unprotected_worker_does_not_fail(planner: Planner) -> None:
    out = planner.outputs("remove-worker")
    assert change(out.document, "cluster-gpu-a10-b-vm")["action"] == "remove"
    assert "will fail" not in out.txt and "unprotect" not in out.txt
    assert holds(out.document["summary"], worker="gpu-a10-b", protected=False)


def test_removing_a_protected_worker_will_fail(planner: Planner) -> None:
    out = planner.outputs("remove-protected-worker")
    for text in (out.txt, out.md, json.dumps(change(out.document, "cluster-gpu-a10-b-vm"))):
        assert "will fail: protected" in text and "pulumi state unprotect" in text
    assert holds(out.document["summary"], worker="gpu-a10-b", protected=True)
    vm = [line for line in out.txt.splitlines() if "cluster-gpu-a10-b-vm" in line and "unprotect" in line]
    assert vm, "the VM's removal is flagged with the command that unprotects it"


def test_the_unprotect_command_names_the_engines_urn(planner: Planner) -> None:
    """``pulumi state unprotect`` needs the URN the engine stores: every ancestor's type chained (A$B$C), not the
    mock monitor's abbreviation to the parent's type."""
    text = planner.outputs("remove-protected-worker").txt
    urns = re.findall(r"pulumi state unprotect '([^']+)'", text)
    assert urns and [u for u in urns if u not in PINNED_URNS] == []


def test_operator_chart_bump(planner: Planner) -> None:
    out = planner.outputs("operator-chart-bump")
    assert shows_change(out.txt, "v25.10.1", "v26.7.0")
    assert change(out.document, "cluster-gpu-operator-release")["action"] == "update"
    assert drained(out.txt) == set() and changed_names(out.document, "VmLegacy") == set()


def test_operator_chart_bump_restarts_the_operands_on_every_node(planner: Planner) -> None:
    assert restarts(planner.outputs("operator-chart-bump").txt, "daemonset")


def test_monitoring_alerts(planner: Planner) -> None:
    out = planner.outputs("monitoring-alerts")
    assert shows_change(out.txt, "DCGM_FI_DEV_GPU_TEMP > 85", "DCGM_FI_DEV_GPU_TEMP > 80")
    assert shows_change(out.txt, '"30m"', '"60m"')
    assert changed_names(out.document) == {"cluster-gpu-monitoring-alerts", "cluster-gpu-monitoring-dashboard"}
    assert drained(out.txt) == set() and not re.search(r"gpu-a\S+: nvidia\.com/\S+ \S+ →", out.txt)


def test_smoke_test_image_replaces_the_job(planner: Planner) -> None:
    out = planner.outputs("smoke-test-image")
    job = change(out.document, "cluster-gpu-smoke-test-job")
    assert job["action"] == "replace" and changed_names(out.document) == {job["name"]}
    assert shows_change(out.txt, "cuda:12.8.1-base", "cuda:12.9.1-base")


def test_a_rotated_secret_shows_as_changed_never_as_its_value(planner: Planner) -> None:
    out = planner.outputs("rotate-join-token")
    joins = {f"cluster-{w}-bootstrap-join" for w in WORKERS}
    assert changed_names(out.document) >= joins
    for name in joins:
        assert "stdin" in change(out.document, name)["paths"]
        assert lines_with(out.txt, "stdin", "changed (secret)")
    for text in (out.txt, out.md, out.json):
        assert not [c for c in CIPHERTEXTS if c in text or c.split(":")[2] in text]


def test_a_changed_secret_input_shows_as_changed_secret(planner: Planner) -> None:
    out = planner.outputs("renumber-host")
    prep = change(out.document, "cluster-pve-b-host-prep-prep")
    assert prep["paths"] == ["connection"] and [
        v for v in prep["values"] if v.startswith("connection: changed (secret)")
    ]
    # every step that connects to pve-b (its workers' VM-restart steps too)
    assert len(lines_with(out.txt, "connection: changed (secret)")) == 9
    # never an old → new of the secret itself (a reason after it may show the stack file's plain values)
    assert not [line for line in lines_with(out.txt, "connection:") if "→" in line.split("changed (secret)")[0]]
    # SSH to the host changes, so its host prep runs again, and may reboot it
    assert lines_with(out.txt, "pve-b", "host-prep", "reboot")


def test_a_changed_secret_input_says_why_beside_it(planner: Planner) -> None:
    """The non-secret reason next to "changed (secret)": here the host's new address."""
    text = planner.outputs("renumber-host").txt
    secret = lines_with(text, "connection: changed (secret)")
    assert secret and all("10.20.0.22" in line or "sshAddress" in line for line in secret)


def agent_change(text: str, step: str) -> tuple[str, str, str]:
    """The diff's line saying ``step``'s bundle changed: (old fingerprint, new fingerprint, the line)."""
    found = [
        m for line in text.splitlines() if (m := re.search(rf"\b{step} ([0-9a-f]{{12}}) ?→ ?([0-9a-f]{{12}})", line))
    ]
    assert found, f"no line names the {step} bundle's fingerprint change"
    return found[0][1], found[0][2], found[0].string


@pytest.mark.slow  # shares the scratch-repository plans of test_diff_golden.py's code-only goldens
def test_a_node_script_change_names_the_steps_that_run_it_again(code_planner: CodePlanner) -> None:
    out = code_planner.outputs("code-only-node-script")
    old, new, line = agent_change(out.txt, "driver")
    assert old == fingerprint("driver") != new  # the base is this checkout's code; the edit changed the bundle
    assert all(f"{w}-bootstrap-driver" in line for w in WORKERS)
    for name in WORKERS:  # the driver step may reboot each guest
        assert [x for x in lines_with(out.txt, name, "bootstrap-driver") if re.search("reboot", x, re.I)], name
    assert changed_names(out.document, "VmLegacy", "host-prep-prep") == set()
    assert {c["action"] for c in out.document["changes"]} == {"update"}


@pytest.mark.slow
def test_a_node_agent_change_names_the_steps_that_run_it_again(code_planner: CodePlanner) -> None:
    out = code_planner.outputs("code-only-node-agent")
    old, new, line = agent_change(out.txt, "capacity")
    assert old == fingerprint("capacity") != new
    assert all(f"{w}-capacity-check" in line for w in WORKERS)
    assert drained(out.txt) == set()  # a capacity gate only reads the node


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_secret_shows_only_as_changed(planner: Planner, name: str) -> None:
    """No rendering prints a secret's fingerprint: the fingerprints are keyed with a random key per diff, for
    comparing, never for showing (the reader gets "changed (secret)")."""
    out = planner.outputs(name)
    for text in (out.txt, out.md, out.json):
        assert "[secret:" not in text
