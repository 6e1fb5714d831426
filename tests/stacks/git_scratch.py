"""A scratch git repository holding a copy of this project (the program, its package and its stack files), for
tests of what compares git revisions: ``--diff-base`` and the pull-request workflow's offline step."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.support import ROOT, external

PROJECT_FILES = ("__main__.py", "Pulumi.yaml", "Pulumi.dev.yaml", "Pulumi.prod.yaml", "Pulumi.kubevirt.yaml",
                 "pyproject.toml")  # fmt: skip
PROJECT_DIRS = ("components", "stacks")


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` (a fixed identity, no user config) and return its stdout; a failure raises."""
    binary = external(Path(shutil.which("git") or "/usr/bin/git"), "git", "install it with: apt-get install git")
    command = [str(binary), "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def copy_project(repo: Path) -> Path:
    """``repo`` initialised with this checkout's working files (what the tests run, edits included), committed."""
    repo.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        shutil.copy2(ROOT / name, repo / name)
    for name in PROJECT_DIRS:
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    git(repo, "init", "-q", "-b", "main")
    commit(repo, "the project as it is")
    return repo


def commit(repo: Path, message: str) -> str:
    """Commit everything in ``repo``'s working tree; the new commit's id."""
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


def edit_script(repo: Path, name: str = "guest_join.sh") -> None:
    """A harmless edit of a node script the agent bundle carries (its fingerprint changes, nothing else)."""
    path = repo / "components" / "scripts" / name
    path.write_text(path.read_text() + "\n: a reviewed edit\n")  # a command: comments are stripped
