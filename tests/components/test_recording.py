"""The recording's data model and queries, on hand-built recordings (no engine)."""

from __future__ import annotations

from typing import Any

import pytest

from proxmox_gpu_cluster.recording import (
    REDACTED,
    SECRET_SIG,
    SECRET_VALUE,
    UNKNOWN,
    RecordedResource,
    Recording,
    critical_path,
    is_secret,
    redact,
    unwrap,
)


def resource(name: str, parent: str = "", deps: tuple[str, ...] = (), type_: str = "t:m:R") -> RecordedResource:
    return RecordedResource(
        type=type_, name=name, urn=f"urn:{name}", parent=parent, custom=True, provider="", dependencies=list(deps),
        property_dependencies={}, inputs={}, protect=False, ignore_changes=[], replace_on_changes=[],
        additional_secret_outputs=[], delete_before_replace=False, retain_on_delete=False,
    )  # fmt: skip


def recording() -> Recording:
    # stack -> comp -> (a, b); c depends on comp's child a; d depends on c; e is unrelated; f is a child of d.
    return Recording(
        resources=[
            resource("stack", type_="pulumi:pulumi:Stack"),
            resource("comp", "urn:stack", type_="t:m:Comp"),
            resource("a", "urn:comp"),
            resource("b", "urn:comp", ("urn:a",)),
            resource("c", "urn:stack", ("urn:a",)),
            resource("d", "urn:stack", ("urn:c",)),
            resource("e", "urn:stack"),
            resource("f", "urn:d"),
        ]
    )


def test_tree_queries() -> None:
    rec = recording()
    assert rec.stack.name == "stack"
    assert [r.name for r in rec.children(rec.named("comp"))] == ["a", "b"]
    assert [r.name for r in rec.descendants(rec.named("stack"))] == ["comp", "a", "b", "c", "d", "f", "e"]
    assert rec.one("t:m:Comp").name == "comp"
    with pytest.raises(AssertionError, match="expected one t:m:R"):
        rec.one("t:m:R")


def test_depends_on_follows_dependencies_parents_and_component_children() -> None:
    rec = recording()
    assert rec.depends_on(rec.named("d"), rec.named("a"))
    assert rec.depends_on(rec.named("d"), rec.named("comp"))  # through its child a
    assert rec.depends_on(rec.named("f"), rec.named("c"))  # through its parent d
    assert not rec.depends_on(rec.named("e"), rec.named("a"))
    assert not rec.depends_on(rec.named("a"), rec.named("d"))
    assert not rec.depends_on(rec.named("c"), rec.named("b"))


def envelope(value: Any) -> dict[str, Any]:
    return {SECRET_SIG: SECRET_VALUE, "value": value}


def test_redact_and_unwrap_walk_nested_values() -> None:
    value = {"a": [envelope("s3cret"), UNKNOWN, {"b": envelope({"c": 1})}], "d": ("x", 2)}
    assert is_secret(envelope(1)) and not is_secret({"value": 1})
    assert redact(value) == {"a": [REDACTED, "[unknown]", {"b": REDACTED}], "d": ["x", 2]}
    assert unwrap(value) == {"a": ["s3cret", "[unknown]", {"b": {"c": 1}}], "d": ["x", 2]}


def test_critical_path_follows_dependencies_and_ancestors_dependencies() -> None:
    rec = recording()
    # f's parent d waits for c, which waits for a: f -> d -> c -> a (all custom; comp is a component: not counted).
    rec.named("comp").custom = rec.named("stack").custom = False
    assert [r.name for r in critical_path(rec)] == ["a", "c", "d", "f"]
    assert critical_path(Recording()) == []
