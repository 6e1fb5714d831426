"""What the mock engine (testing.run) spares the SDK while a program runs, and that it puts everything back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pulumi
import pulumi_command as command
import pytest
from pulumi import _types as pulumi_types
from pulumi.runtime import resource as pulumi_resource

from proxmox_gpu_cluster import testing
from proxmox_gpu_cluster.testing import run


def _sdk() -> tuple[Any, Any, Any]:
    return pulumi_resource._get_stack_trace, pulumi.log.debug, pulumi_types.resource_types


class Part(pulumi.ComponentResource):
    done: pulumi.Output[str]
    """An annotated output, as the project's components have: the SDK reads its type for every instance."""

    def __init__(self, name: str) -> None:
        super().__init__("test:part:Part", name, None)
        self.register_outputs({})


def test_the_sdk_is_itself_again_after_a_run_even_a_failing_one() -> None:
    before = _sdk()
    seen: list[tuple[Any, Any, Any]] = []

    def failing() -> None:
        seen.append(_sdk())
        raise pulumi.RunError("bad")

    with pytest.raises(pulumi.RunError):
        run(failing)
    assert all(a is not b for a, b in zip(seen[0], before, strict=True))  # swapped while the program ran
    assert _sdk() == before


def test_no_stack_is_walked_and_types_are_read_once_per_class(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[type] = []
    original = pulumi_types.resource_types

    def counting(cls: type) -> dict[str, type]:
        calls.append(cls)
        return original(cls)

    monkeypatch.setattr(pulumi_types, "resource_types", counting)

    def program() -> None:
        assert not pulumi_resource._get_stack_trace().frames
        for i in range(3):
            Part(f"p{i}")

    rec = run(program)
    assert len(rec.of_type("test:part:Part")) == 3
    assert calls.count(Part) == 1


def test_an_archive_is_hashed_once_per_run_and_shows_its_content_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.sh").write_text("echo a\n")
    hashed: list[Path] = []
    original = testing._content_hash

    def counting(path: Path) -> str:
        hashed.append(path)
        return original(path)

    monkeypatch.setattr(testing, "_content_hash", counting)

    def program() -> None:
        provider = command.Provider("cmd")
        for i in range(3):
            command.remote.CopyToRemote(
                f"copy{i}",
                command.remote.CopyToRemoteArgs(
                    connection=command.remote.ConnectionArgs(host="h"),
                    source=pulumi.FileArchive(str(tmp_path)),
                    remote_path="dir",
                ),
                opts=pulumi.ResourceOptions(provider=provider),
            )

    rec = run(program)
    hashes = {r.inputs["source"]["archive"]["hash"] for r in rec.of_type("command:remote:CopyToRemote")}
    assert hashes == {original(tmp_path)}
    assert hashed == [tmp_path]
    run(program)  # a new run hashes again: the files may have changed in between
    assert hashed == [tmp_path, tmp_path]
