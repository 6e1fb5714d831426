"""Command-line arguments of the offline plan checked before anything runs: every bad one is one line, exit 2."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from proxmox_gpu_cluster.core.input_safety import escape_controls, escape_lines
from proxmox_gpu_cluster.stacks.plan.inputs import InputError

GIT_REVISION = re.compile(r"[^\s\x00-\x1f\x7f~^:?*\[\\-][^\s\x00-\x1f\x7f:?*\[\\]*")
"""What ``git show`` can take as a revision here: no whitespace or control characters, none of ``: ? * [ \\``
(git check-ref-format), not an option (no leading ``-``); ``~N`` and ``^N`` suffixes are fine."""


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one escaped line (and a pointer to --help), exit 2."""

    def error(self, message: str) -> NoReturn:
        print(escape_controls(f"{self.prog}: {message} (see --help)"), file=sys.stderr)
        raise SystemExit(2)


class ArgumentProblems(InputError):
    """Every bad command-line argument, one line each."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(lines[0])
        self.lines = lines


def out_problem(out: Path) -> str | None:
    """Why ``--out`` cannot be a folder to write into, or None: it (or a folder above it) is a file."""
    if not str(out).strip():
        return "--out: empty path; give a folder (created if missing)"
    for path in (out, *out.parents):
        if path.exists():
            if path.is_dir():
                return None
            what = "is a file" if path == out else f"{path} is a file"
            return f"--out {out}: {what}; give a folder (created if missing)"
    return None


def pci_problem(item: str) -> str | None:
    """Why a ``--pci`` argument is not ``NODE=FILE``, or None."""
    node, eq, file = item.partition("=")
    if not eq or not node.strip() or not file.strip():
        return f"--pci {item}: expected NODE=FILE (a Proxmox node name, '=', and its PCI device list)"
    return None


def diff_base_problem(ref: str) -> str | None:
    """Why ``--diff-base`` cannot be read with git, or None."""
    if not ref.strip():
        return "--diff-base: empty; expected a git revision such as origin/main or HEAD~1"
    if not GIT_REVISION.fullmatch(ref):
        return f"--diff-base {ref}: expected a git revision such as origin/main or HEAD~1"
    if shutil.which("git") is None:
        return f"--diff-base {ref}: git is not on PATH (it reads the stack file as it was at that revision)"
    return None


def check_plan_arguments(out: Path | None, pci: Sequence[str], diff_base: str | None) -> None:
    """ArgumentProblems listing every bad argument, or nothing."""
    problems = [out_problem(out) if out is not None else None, *(pci_problem(item) for item in pci)]
    problems.append(diff_base_problem(diff_base) if diff_base is not None else None)
    lines = [escape_controls(p) for p in problems if p is not None]
    if lines:
        raise ArgumentProblems(lines)


def printable(lines: Sequence[str]) -> str:
    """Problem lines as a CLI prints them: control characters escaped, one problem per line."""
    return "\n".join(escape_lines(lines))
