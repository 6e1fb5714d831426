"""The change matrix (issue 31): generated from the spec's own field list (the models docs/spec.md is generated
from), a change of every field is diffed and the diff must state the field's class from the one table
(core/change_classes.py); and realistic edits of the prod stack, planned by the offline plan CLI old → new, say
a drain only where a step drains and refuse what has no supported path.

The generated part builds, for each field, the smallest two specs that differ in it alone (the field's model
reached from ``ClusterSpec`` along its first path, a list item named where its model has a name) and diffs them
the way the CLI's diff does (``plan.report.render_diff`` of the two plan documents' ``specs``). Running changes in the
fake world is test_change_matrix_world.py's (the fields that reach the guests' steps, so far)."""

from __future__ import annotations

import typing
from collections import deque
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from proxmox_gpu_cluster.core.change_classes import CHANGE_CLASSES, REMOVALS, field_class
from proxmox_gpu_cluster.core.spec import ClusterSpec
from proxmox_gpu_cluster.stacks.plan import run as plan_module
from proxmox_gpu_cluster.stacks.plan.classes import _model_of
from proxmox_gpu_cluster.stacks.plan.report import render_diff
from proxmox_gpu_cluster.stacks.reference import spec_models
from tests.stacks.test_diff_golden import _memoised, run_cli, spec, worker, write_stack
from tests.support import ROOT

Step = tuple[str, bool, bool]
"""A key on the way to a model, whether its value is a list of that model, and whether that model has a name."""


def _routes() -> dict[type[BaseModel], list[Step]]:
    """Each model reachable from ClusterSpec -> the keys from the spec's root to one of its values (first found)."""
    routes: dict[type[BaseModel], list[Step]] = {ClusterSpec: []}
    todo: deque[type[BaseModel]] = deque([ClusterSpec])
    while todo:
        model = todo.popleft()
        for name, f in model.model_fields.items():
            sub = _model_of(f.annotation)
            if sub is not None and sub not in routes:
                many = typing.get_origin(_strip(f.annotation)) is tuple
                routes[sub] = [*routes[model], (f.alias or name, many, "name" in sub.model_fields)]
                todo.append(sub)
    return routes


def _strip(annotation: Any) -> Any:
    """A field type without Optional and Annotated around it."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated or (origin is not None and len(args) == 1 and origin is not tuple):
        return _strip(args[0])
    return annotation


ROUTES = _routes()
REALISTIC: dict[str, tuple[Any, Any]] = {
    "KubernetesSpec.version": ("1.34", "1.35"),
    "Worker.diskGiB": (100, 200),
    "Worker.cores": (8, 16),
    "GpuOperatorSpec.driverVersion": ("580.95.05", "580.105.08"),
    "GpuOperatorSpec.driverBranch": ("580", "595"),
}
"""Fields whose generated change would not be one an operator makes."""


def _values(key: str, f: FieldInfo) -> tuple[Any, Any]:
    """A change of the field: its default (or a value of its type) → another value of its type."""
    if key in REALISTIC:
        return REALISTIC[key]
    t = _strip(f.annotation)
    origin = typing.get_origin(t)
    if origin is typing.Literal:
        a, b, *_ = typing.get_args(t)
        return a, b
    if _model_of(f.annotation) is not None:  # a list of items or an optional part: one appears
        return ([], [{"name": "item-1"}]) if origin is tuple else (None, {})
    if origin in (tuple, list):
        return [], ["x"]
    if origin is dict:
        return {}, {"x": 1}
    if t is bool:
        return False, True
    if t is int:
        return 1, 2
    return "a", "b"


def _nested(route: list[Step], leaf: dict[str, Any]) -> dict[str, Any]:
    """``leaf`` placed at the end of ``route``; every list item on the way is named ``item-0`` where its model has a
    name (items pair by name in a diff)."""
    value: Any = leaf
    for key, many, named in reversed(route):
        if named and "name" not in value:
            value = {"name": "item-0", **value}
        value = {key: [value] if many else value}
    return dict(value)


def matrix() -> list[tuple[str, type[BaseModel], str, FieldInfo]]:
    return [
        (f"{m.__name__}.{f.alias or n}", m, f.alias or n, f)
        for m in spec_models()
        if m in ROUTES
        for n, f in m.model_fields.items()
    ]


def test_the_matrix_covers_every_field_a_cluster_spec_reaches() -> None:
    covered = {k for k, *_ in matrix()}
    outside = {k for k in CHANGE_CLASSES if k.split(".")[0] not in {m.__name__ for m in ROUTES}}
    # ExistingGpuNode configures the GPU-stack components for nodes provisioned elsewhere: no cluster spec holds
    # it, so no stack diff can show it; its class is still declared (test_change_classes.py).
    assert {k.split(".")[0] for k in outside} == {"ExistingGpuNode"}
    assert covered | outside == set(CHANGE_CLASSES)


def _diff_text(before: dict[str, Any], after: dict[str, Any]) -> str:
    docs = [{"resources": [], "specs": {"proxmox-gpu-cluster": s}} for s in (before, after)]
    return render_diff([], before=docs[0], after=docs[1])


@pytest.mark.parametrize(("key", "model", "alias", "field"), matrix(), ids=[k for k, *_ in matrix()])
def test_the_diff_states_each_fields_class(key: str, model: type[BaseModel], alias: str, field: FieldInfo) -> None:
    old, new = _values(key, field)
    named = "name" in model.model_fields and alias != "name"
    base = {"name": "item-0"} if named else {}
    text = _diff_text(_nested(ROUTES[model], {**base, alias: old}), _nested(ROUTES[model], {**base, alias: new}))
    lines = [line for line in text.splitlines() if line.startswith("Spec ")]
    if alias == "name" and ROUTES[model] and ROUTES[model][-1][1]:
        # a named list item's new name is another item: the old one removed, the new one added (a worker that
        # keeps its vmid: the rename itself is refused)
        parent = field_class(key) if key == "Worker.name" else None
        assert any("[refused" in line for line in lines) == (parent is not None), text
        return
    klass = field_class(key, removed=new is None and old is not None)
    assert klass is not None
    assert len(lines) == 1, text
    expected = f"[{klass.change}" if klass.change != "refused" else "[refused"
    assert expected in lines[0] and f"{alias}" in lines[0], lines[0]
    if not klass.supported:
        assert klass.procedure in lines[0] or "refused" in lines[0]


def test_removing_a_list_item_states_the_removals_class() -> None:
    for key in REMOVALS:
        model_name, alias = key.split(".")
        model = next(m for m in ROUTES if m.__name__ == model_name)
        before = _nested([*ROUTES[model], (alias, True, True)], {"name": "item-1"})
        after = _nested(ROUTES[model], {alias: []})
        [line] = [x for x in _diff_text(before, after).splitlines() if x.startswith("Spec ")]
        assert f"[{REMOVALS[key].change}]" in line and "(an item) → (none)" in line


# The offline plan CLI on realistic edits of the prod stack (as a reviewer's pull request would be planned).

WORKERS = ("gpu-a100-a", "gpu-a100-b", "gpu-a10-a", "gpu-a10-b")
QUIET = {
    "drain-timeout": lambda c: spec(c)["kubernetes"].setdefault("drain", {}).update(timeoutSeconds=900),
    "max-unavailable": lambda c: spec(c)["kubernetes"].setdefault("drain", {}).update(maxUnavailable=2),
    "slot-wait": lambda c: spec(c)["kubernetes"].setdefault("drain", {}).update(slotWaitSeconds=600),
    "ssh-agent": lambda c: spec(c)["proxmox"].update(sshAgent=not spec(c)["proxmox"].get("sshAgent", False)),
    "auth-mode": lambda c: spec(c)["proxmox"].update(authMode="password"),
    "join-method": lambda c: spec(c)["kubernetes"].update(joinMethod="none"),
}
"""The issue's false drain announcements: one field each, whose steps run again and drain nothing."""


def plan_diff(tmp_path: Any, edit: Any) -> str:
    tmp_path.mkdir(parents=True, exist_ok=True)
    base = write_stack(tmp_path / "base.yaml")
    new = write_stack(tmp_path / "new.yaml", edit)
    args = ["prod", "--main", str(ROOT), "--placeholder-secrets", "--config", str(base), "--diff-config", str(new)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plan_module, "plan", _memoised)  # the unchanged prod plan once for every edit
        code, out, err = run_cli(args)
    assert code == 0, err
    return out


@pytest.mark.slow  # one offline plan of prod per edit (several seconds each)
@pytest.mark.parametrize("name", list(QUIET))
def test_a_setting_or_connection_change_announces_no_drain(tmp_path: Any, name: str) -> None:
    text = plan_diff(tmp_path, QUIET[name])
    head = text.split("\n\n", 1)[0]
    assert "no GPU node drained" in head, head
    assert "drained and changed" not in text
    assert not [line for line in text.splitlines() if "reboot point: the guest" in line or "-mig-restart runs" in line]
    assert any(line.startswith("Spec ") and "[in-place]" in line for line in head.splitlines()), head


@pytest.mark.slow
def test_a_driver_bump_still_drains_every_worker_through_slots(tmp_path: Any) -> None:
    text = plan_diff(tmp_path, lambda c: spec(c)["gpuOperator"].update(driverVersion="580.105.08"))
    assert f"4 GPU node(s) drained and changed, 1 at a time (4 round(s)): {', '.join(sorted(WORKERS))}" in text
    assert "Spec cluster.gpuOperator.driverVersion: (none) → 580.105.08 [rolled]" in text


@pytest.mark.slow
def test_a_skipped_kubernetes_minor_and_a_datastore_move_are_refused_before_up(tmp_path: Any) -> None:
    text = plan_diff(tmp_path, lambda c: spec(c)["kubernetes"].update(version="1.36"))
    assert text.startswith("WILL FAIL at pulumi up (4 resource(s)")
    assert "REFUSED: no supported path for 1 spec change(s)" in text and "one minor at a time" in text
    upgrade = plan_diff(tmp_path / "u", lambda c: spec(c)["kubernetes"].update(version="1.35"))  # the next minor
    assert "WILL FAIL" not in upgrade and "REFUSED" not in upgrade
    assert "4 GPU node(s) drained and changed, 1 at a time (4 round(s))" in upgrade
    moved = plan_diff(tmp_path / "m", lambda c: worker(c, "gpu-a10-b").update(datastore="ceph"))
    assert moved.startswith("WILL FAIL at pulumi up (1 resource(s)") and "gpu-a10-b-vm" in moved.splitlines()[0]
    assert "cannot move the Cloud-Init drive while the VM is running" in moved
