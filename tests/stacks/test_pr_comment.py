"""The workflow's offline step (stacks/pr_comment.py) on a scratch git repository with two commits: one comment
body with the marker first, a section per stack, the stack file's change and a code-only change diffed, a stack the
plan refuses shown with its lines (exit 1: the workflow posts, then fails the check), removed and new stacks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from proxmox_gpu_cluster.stacks.pr_comment import MARKER, MAX_BODY, Section, fenced, render
from tests.stacks.git_scratch import commit, copy_project, edit_script, git


def offline_step(repo: Path, *args: str) -> tuple[int, str]:
    """Run the step as the workflow does (a fresh interpreter in the checkout); its exit code and the body."""
    out = repo / "comment.md"
    command = [sys.executable, "-m", "proxmox_gpu_cluster.stacks.pr_comment", *args, "--out", str(out)]
    proc = subprocess.run(command, cwd=repo, capture_output=True, text=True, check=False, timeout=900)
    body = out.read_text(encoding="utf-8")
    out.unlink()
    assert proc.stdout == "", proc.stdout
    return proc.returncode, body


def section(body: str, stack: str) -> str:
    """The text of one stack's section."""
    start = body.index(f"### Stack `{stack}`")
    following = body.find("\n### Stack `", start + 1)
    return body[start : following if following > 0 else len(body)]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_project(tmp_path_factory.mktemp("pr-comment") / "repo")


def test_a_stack_edit_and_a_script_edit(repo: Path) -> None:
    """prod's time-slicing replicas 4 -> 8 and an edit of guest_join.sh in one pull request: prod shows its
    ConfigMap change, dev and kubevirt (stack files untouched) the code-only change: their join steps run again."""
    base = git(repo, "rev-parse", "HEAD").strip()
    prod = repo / "Pulumi.prod.yaml"
    text = prod.read_text()
    prod.write_text(text.replace("timeSlicing: {replicas: 4}", "timeSlicing: {replicas: 8}", 1))
    assert prod.read_text() != text
    edit_script(repo)
    commit(repo, "replicas and a script")
    code, body = offline_step(repo, "--base", base)
    assert code == 0, body
    assert body.splitlines()[0] == MARKER
    assert [line for line in body.splitlines() if line.startswith("### Stack")] == [
        "### Stack `dev`", "### Stack `kubevirt`", "### Stack `prod`"]  # fmt: skip
    assert f"base `{base[:12]}`" in body
    prod_part = section(body, "prod")
    assert "replicas" in prod_part and "kubernetes:core/v1:ConfigMap" in prod_part, prod_part
    for stack in ("dev", "kubevirt"):
        part = section(body, stack)
        assert "bootstrap-join" in part, part
        assert "ConfigMap" not in part.split("<details>")[0] or "ConfigMaps recreated: none" in part
        # One key fingerprints both sides' secrets: an unchanged secret is never "may have changed".
        assert "not fingerprinted" not in part, part


def test_refused_removed_and_new_stacks(repo: Path) -> None:
    """A broken dev spec, kubevirt's stack file removed and a new stack: the body says each; exit 1 fails the
    check after the comment is posted."""
    base = commit(repo, "base of the second pull request")
    dev = repo / "Pulumi.dev.yaml"
    shutil.copy2(dev, repo / "Pulumi.lab.yaml")
    dev.write_text(dev.read_text().replace("cores: 8", "cores: 0", 1))
    (repo / "Pulumi.kubevirt.yaml").unlink()
    (repo / "Pulumi.bad name.yaml").write_text("config: {}\n")
    (repo / "Pulumi.a`b\x1b.yaml").write_text("config: {}\n")
    commit(repo, "a broken dev, no kubevirt, a new lab stack")
    code, body = offline_step(repo, "--base", base)
    assert code == 1, body
    assert body.splitlines()[0] == MARKER
    dev_part = section(body, "dev")
    assert "### Stack `dev` — refused" in dev_part and "The plan refuses this stack" in dev_part
    assert "proxmox-gpu-cluster:cluster.workers[0].cores: Input should be greater than or equal to 1" in dev_part
    assert "```text" in dev_part
    assert "The stack file is removed" in section(body, "kubevirt")
    lab = section(body, "lab")
    assert "New stack: every resource is added." in lab and "to add" in lab, lab
    assert "0 to add, 0 to update, 0 to replace, 0 to remove" in section(body, "prod")
    assert "Not planned (no plain stack name): `Pulumi.a'b\\x1b.yaml`, `Pulumi.bad name.yaml`" in body
    assert body.count("### Offline plan diff") == 0 and body.count("## Offline plan diff") == 1


def test_documentation_only_plans_nothing(repo: Path) -> None:
    base = commit(repo, "base of a documentation change")
    (repo / "docs").mkdir(exist_ok=True)
    (repo / "docs" / "note.md").write_text("a note\n")
    (repo / "NOTES.md").write_text("more\n")
    commit(repo, "documentation")
    code, body = offline_step(repo, "--base", base)
    assert code == 0
    assert "changes nothing `pulumi up` runs" in body and "### Stack" not in body


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--base", "no-such-ref"], "**No offline diff**: --base no-such-ref: no such commit"),
        (["--base=--upload-pack=x"], "**No offline diff**: --base '--upload-pack=x': expected a git revision"),
        (["--base", "HEAD", "--head", "HEAD~1"], "**No offline diff**: --head HEAD~1: not the checked-out commit"),
    ],
)
def test_unusable_refs_exit_2_with_the_reason_in_the_body(repo: Path, args: list[str], line: str) -> None:
    if "HEAD~1" in args and len(git(repo, "rev-list", "HEAD").split()) < 2:
        # The module's repository has one commit until another test adds one; under xdist this test may come
        # first on its worker, and HEAD~1 must exist for "not the checked-out commit" to be the reason.
        commit(repo, "a second commit")
    code, body = offline_step(repo, *args)
    assert code == 2
    assert body.splitlines()[0] == MARKER and any(x.startswith(line) for x in body.splitlines()), body


def test_error_lines_cannot_close_their_fence() -> None:
    text = fenced(["a ``` b", "`````", "\x1b[31mred"])
    fence = text.splitlines()[0].removesuffix("text")
    assert fence == "``````" and text.endswith("\n" + fence)
    assert "\\x1b[31mred" in text


def test_a_body_too_long_for_a_comment_is_cut() -> None:
    body = render("a" * 40, "b" * 40, [Section("prod", "x\n" * MAX_BODY)], [])
    assert len(body) < MAX_BODY + 300 and body.startswith(MARKER) and "…cut" in body


def test_a_pull_request_that_repairs_a_stack_passes(repo: Path) -> None:
    """The base revision refuses kubevirt's stack file, the pull request repairs it: the section says the base
    cannot be planned (with its lines), and the check passes."""
    root = git(repo, "rev-list", "--max-parents=0", "HEAD").strip()
    git(repo, "checkout", "-q", root, "--", ".")  # the project as copied: every stack valid
    for extra in ("Pulumi.lab.yaml", "Pulumi.bad name.yaml", "Pulumi.a`b\x1b.yaml"):
        (repo / extra).unlink(missing_ok=True)
    stack = repo / "Pulumi.kubevirt.yaml"
    good = stack.read_text()
    stack.write_text(good.replace("cores: ", "cores: -", 1))
    assert stack.read_text() != good
    base = commit(repo, "a broken kubevirt stack")
    stack.write_text(good)
    commit(repo, "repaired")
    code, body = offline_step(repo, "--base", base)
    assert code == 0, body
    part = section(body, "kubevirt")
    assert "The base revision cannot be planned" in part and "refused" not in part.splitlines()[0]
    assert f"--diff-base {base}: the base revision refuses its stack file" in part
