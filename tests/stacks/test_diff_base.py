"""``--diff-base REF`` plans the base revision's code with its stack file (stacks/plan/compare.py): in a
temporary git worktree, removed afterwards, through a package shim that makes ``import proxmox_gpu_cluster`` the
worktree's files; secrets of both sides fingerprinted with one key; a missing base stack file is a new stack; a
base revision that refuses its stack file, a bad ref or no repository is exit 2 with its lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from proxmox_gpu_cluster.stacks.plan import compare as plan_compare
from proxmox_gpu_cluster.stacks.plan import main
from proxmox_gpu_cluster.stacks.plan.compare import empty_document, normalised, package_shim, worktree
from proxmox_gpu_cluster.stacks.plan.diff import diff
from proxmox_gpu_cluster.stacks.plan.report import diff_document
from tests.stacks.git_scratch import commit, copy_project, edit_script, git

Tags = dict[str, str]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Tags]:
    """A copy of the project with revisions to diff against; its working tree is the project as it is now."""
    repo = copy_project(tmp_path_factory.mktemp("diff-base") / "repo")
    tags = {"same": git(repo, "rev-parse", "HEAD").strip()}
    edit_script(repo)
    tags["script"] = commit(repo, "a node script changes")
    git(repo, "checkout", "-q", tags["same"], "--", ".")
    stack = repo / "Pulumi.dev.yaml"
    text = stack.read_text()
    stack.write_text(text.replace("cores: 8", "cores: 0", 1))
    assert stack.read_text() != text, "Pulumi.dev.yaml no longer sets cores: 8"
    tags["invalid"] = commit(repo, "an invalid spec")
    stack.unlink()
    tags["no-stack"] = commit(repo, "no dev stack yet")
    git(repo, "checkout", "-q", tags["same"], "--", ".")
    commit(repo, "back to the project as it is")
    return repo, tags


def run_plan(repo: Path, ref: str, *extra: str) -> int:
    args = ["dev", "--placeholder-secrets", "--main", str(repo), "--config", str(repo / "Pulumi.dev.yaml")]
    return main([*args, "--diff-base", ref, *extra])


def worktrees(repo: Path) -> list[str]:
    return [line for line in git(repo, "worktree", "list", "--porcelain").splitlines() if line.startswith("worktree")]


def test_the_same_code_and_stack_is_no_change_secrets_included(
    scratch: tuple[Path, Tags], capsys: pytest.CaptureFixture[str]
) -> None:
    """Same code, same stack file: nothing changes. The secrets (placeholders here) are fingerprinted with one key
    on both sides; without the shared key every secret input would read 'may have changed'."""
    repo, tags = scratch
    assert run_plan(repo, tags["same"], "--json") == 0
    out = capsys.readouterr()
    document = json.loads(out.out)
    assert document["changes"] == [], [c["name"] for c in document["changes"]]
    assert worktrees(repo) == [f"worktree {repo.resolve()}"]


def test_a_code_only_change_is_diffed_from_the_worktree(
    scratch: tuple[Path, Tags], capsys: pytest.CaptureFixture[str]
) -> None:
    """The base revision differs only in a node script: its steps run again. This can only show if the base side
    planned the worktree's scripts (the stack file is the same on both sides)."""
    repo, tags = scratch
    assert run_plan(repo, tags["script"], "--json") == 0
    changes = json.loads(capsys.readouterr().out)["changes"]
    names = {c["name"] for c in changes}
    assert names, "a script edit at the base revision showed no change: the base planned the current code"
    assert all(c["action"] == "update" for c in changes)
    assert any(name.endswith("-bootstrap-join") for name in names), sorted(names)
    assert not any("host-prep" in name for name in names), sorted(names)


def test_the_shim_imports_the_worktrees_files(scratch: tuple[Path, Tags], tmp_path: Path) -> None:
    """With the shim first on PYTHONPATH a fresh interpreter imports the package and its stacks subpackage from
    the worktree, not from the editable install of this checkout."""
    repo, tags = scratch
    with worktree(repo, tags["script"]) as tree:
        shim = tmp_path / "shim"
        assert package_shim(tree, shim)
        code = (
            "import os, proxmox_gpu_cluster, proxmox_gpu_cluster.stacks.plan as p, proxmox_gpu_cluster.scripts as s\n"
            "print(os.path.realpath(proxmox_gpu_cluster.__file__)); print(os.path.realpath(p.__file__))\n"
            "print(open(os.path.join(os.path.dirname(s.__file__), 'guest_join.sh')).read().endswith('edit\\n'))"
        )
        env = {**os.environ, "PYTHONPATH": str(shim)}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        package, plan_module, edited = out.stdout.splitlines()
        assert package == str((tree / "components" / "__init__.py").resolve())
        assert plan_module == str((tree / "stacks" / "plan" / "__init__.py").resolve())
        assert edited == "True"
    assert not tree.exists() and worktrees(repo) == [f"worktree {repo.resolve()}"]


def test_the_worktree_is_removed_on_an_interrupt(scratch: tuple[Path, Tags]) -> None:
    repo, tags = scratch
    with pytest.raises(KeyboardInterrupt), worktree(repo, tags["same"]) as tree:
        assert (tree / "Pulumi.yaml").is_file() and len(worktrees(repo)) == 2
        raise KeyboardInterrupt
    assert not tree.exists() and worktrees(repo) == [f"worktree {repo.resolve()}"]


def test_a_stack_missing_at_the_base_is_a_new_stack(
    scratch: tuple[Path, Tags], capsys: pytest.CaptureFixture[str]
) -> None:
    repo, tags = scratch
    assert run_plan(repo, tags["no-stack"], "--json") == 0
    out = capsys.readouterr()
    changes = json.loads(out.out)["changes"]
    assert changes and {c["action"] for c in changes} == {"add"}
    assert f"new stack: Pulumi.dev.yaml does not exist at {tags['no-stack']}" in out.err


def test_a_base_revision_that_refuses_its_stack_says_so(
    scratch: tuple[Path, Tags], capsys: pytest.CaptureFixture[str]
) -> None:
    repo, tags = scratch
    assert run_plan(repo, tags["invalid"]) == 2
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert out.out == ""
    assert (
        lines[0] == f"--diff-base {tags['invalid']}: the base revision refuses its stack file ({tags['invalid'][:12]}):"
    )
    assert "  proxmox-gpu-cluster:cluster.workers[0].cores: Input should be greater than or equal to 1" in lines[1:]
    assert worktrees(repo) == [f"worktree {repo.resolve()}"]


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("no-such-ref", "--diff-base no-such-ref: no such commit in "),
        ("HEAD~99", "--diff-base HEAD~99: no such commit"),
    ],
)
def test_a_bad_ref_is_one_line(
    scratch: tuple[Path, Tags], capsys: pytest.CaptureFixture[str], ref: str, expected: str
) -> None:
    repo, _ = scratch
    assert run_plan(repo, ref) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_outside_a_repository_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support import ROOT

    stack = tmp_path / "Pulumi.dev.yaml"
    stack.write_text((ROOT / "Pulumi.dev.yaml").read_text())
    env_ceiling = os.environ.get("GIT_CEILING_DIRECTORIES")
    os.environ["GIT_CEILING_DIRECTORIES"] = str(tmp_path.parent)  # tmp_path is never inside a repository then
    try:
        assert (
            main(["dev", "--placeholder-secrets", "--main", str(ROOT), "--config", str(stack), "--diff-base", "HEAD"])
            == 2
        )
    finally:
        if env_ceiling is None:
            del os.environ["GIT_CEILING_DIRECTORIES"]
        else:
            os.environ["GIT_CEILING_DIRECTORIES"] = env_ceiling
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"--diff-base HEAD: {tmp_path} is not in a git repository"), lines


def test_an_older_base_document_without_newer_fields_still_diffs(
    scratch: tuple[Path, Tags], capsys: pytest.CaptureFixture[str]
) -> None:
    """A base revision whose --json predates options, capacity and the rest: missing reads as empty."""
    repo, _ = scratch
    assert main(["dev", "--placeholder-secrets", "--main", str(repo), "--json"]) == 0
    current: dict[str, Any] = json.loads(capsys.readouterr().out)
    old = {"resources": [{k: r[k] for k in ("type", "name", "urn", "inputs")} for r in current["resources"]]}
    before = normalised(old)
    changes = diff(before, normalised(current))
    report = diff_document(changes, 1, "", before=before, after=normalised(current))
    assert report["changes"] == [], [c["name"] for c in report["changes"]]
    assert {c.action for c in diff(empty_document("p", "dev"), normalised(current))} == {"add"}


def test_child_options_carry_the_plan_options_with_absolute_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    options = plan_compare.child_options(True, ["a", "b"], ["pve1=pci.json"])
    assert options == ["--placeholder-secrets", "--namespace", "a", "--namespace", "b",
                       "--pci", f"pve1={tmp_path / 'pci.json'}"]  # fmt: skip


def test_the_worktree_is_removed_when_the_plan_is_terminated(scratch: tuple[Path, Tags]) -> None:
    """A cancelled CI job sends SIGTERM: the process exits through the cleanup (exit 143), no worktree left."""
    import signal
    import time

    repo, tags = scratch
    code = (
        "import sys, time\nfrom pathlib import Path\nfrom proxmox_gpu_cluster.stacks.plan.compare import worktree\n"
        f"with worktree(Path({str(repo)!r}), {tags['same']!r}):\n    print('in', flush=True)\n    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "in\n"
        assert len(worktrees(repo)) == 2
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert proc.wait(timeout=30) == 143 and time.monotonic() - started < 30
    finally:
        proc.kill()
        proc.wait()
    assert worktrees(repo) == [f"worktree {repo.resolve()}"]


def fake_revision(tree: Path, plan_source: str) -> None:
    """A revision whose package is one module: ``proxmox_gpu_cluster.plan`` as ``plan_source``."""
    (tree / "components").mkdir(parents=True)
    (tree / "components" / "__init__.py").write_text("")
    (tree / "components" / "plan.py").write_text(plan_source)
    (tree / "pyproject.toml").write_text('[tool.setuptools]\npackage-dir = {"proxmox_gpu_cluster" = "components"}\n')
    (tree / "__main__.py").write_text("")
    (tree / "Pulumi.dev.yaml").write_text("config: {}\n")


OLD_CLI = """import argparse, json, os
parser = argparse.ArgumentParser(prog="python -m proxmox_gpu_cluster.plan")
parser.add_argument("stack"); parser.add_argument("--json", action="store_true"); parser.add_argument("--config")
args = parser.parse_args()
key = os.environ.get("PGC_SECRET_DIGEST_KEY", "")
print(json.dumps({"resources": [{"type": "t:a:B", "name": "b", "urn": "urn:b", "inputs": {"k": len(key)}}]}))
"""


def test_an_older_base_cli_without_an_option_is_named(tmp_path: Path) -> None:
    fake_revision(tmp_path, OLD_CLI)
    with pytest.raises(plan_compare.BaseRevisionError) as info:
        plan_compare.plan_at_revision("old", "0" * 40, tmp_path, program=tmp_path / "__main__.py",
                                      stack_file=tmp_path / "Pulumi.dev.yaml", stack="dev",
                                      options=["--placeholder-secrets"], key=b"k" * 32)  # fmt: skip
    assert info.value.lines == [
        "--diff-base old: the base revision's plan is older than --placeholder-secrets (000000000000); "
        "diff against a later revision"
    ]


def test_an_older_base_json_is_normalised_and_gets_the_key(tmp_path: Path) -> None:
    """The shim serves the revision's own module (this checkout has no such plan); the key arrives as hex."""
    fake_revision(tmp_path, OLD_CLI)
    document = plan_compare.plan_at_revision("old", "0" * 40, tmp_path, program=tmp_path / "__main__.py",
                                             stack_file=tmp_path / "Pulumi.dev.yaml", stack="dev", options=[],
                                             key=b"k" * 32)  # fmt: skip
    assert document["resources"] == [{"type": "t:a:B", "name": "b", "urn": "urn:b", "inputs": {"k": 64},
                                      "parent": None, "provider": None, "dependencies": [], "options": {}}]  # fmt: skip
    assert document["capacity"] == [] and document["outputs"] == {}
