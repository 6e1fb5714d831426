"""The pull-request workflow's offline step: one comment body with the offline plan diff of every stack.

    python -m proxmox_gpu_cluster.stacks.pr_comment --base BASE_SHA --out comment.md

Run in a checkout of the pull request (HEAD). Every stack of the project (``Pulumi.<stack>.yaml`` beside
``Pulumi.yaml``, at HEAD or at BASE) gets a section: the markdown of ``plan STACK --diff-base BASE`` (the base
revision's code and stack file against the checkout's, stacks/plan/compare.py), a new stack, a removed stack
file, or the lines of a stack the plan refuses. Every stack is diffed whenever the pull request changes anything
but documentation and tests: a code-only change (a node script, the program) changes what ``pulumi up`` does too.

The body's first line is ``MARKER``, an HTML comment the workflow finds its own comment by, to update it in place.
The checkout's own package code plans the head side, whatever is installed: the plan runs with the checkout's
package directories first on ``PYTHONPATH`` (the shim of plan/compare.py). Stack names come from file names, which
a pull request controls: only plain names are planned, and anything a plan prints that is not its markdown (error
lines) is shown inside a code fence longer than any run of backticks in it.

Exit codes: 0 every stack planned; 1 a stack refused or its plan failed (the body says which; the workflow posts
it, then fails the check); 2 the refs or the checkout cannot be used (the body says why too).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from proxmox_gpu_cluster.core.input_safety import escape_lines
from proxmox_gpu_cluster.stacks.cli_checks import GIT_REVISION, OneLineParser
from proxmox_gpu_cluster.stacks.plan.compare import git, git_said, package_shim
from proxmox_gpu_cluster.stacks.plan.report import code_block

MARKER = "<!-- proxmox-gpu-cluster:offline-diff -->"
"""First line of the comment: how the workflow finds the comment it posted before (and only that one)."""
STACK_FILE = re.compile(r"Pulumi\.([A-Za-z0-9][A-Za-z0-9_.-]{0,99})\.yaml")
"""A stack file whose name is a plain stack name (Pulumi's own rule is looser; a file outside it is listed, not
planned)."""
NOT_THE_PROGRAM = ("docs/", "tests/", ".github/", "benchmarks/", "LICENSE")
"""Paths whose change alone changes nothing ``pulumi up`` does (with every ``*.md``)."""
MAX_BODY = 60_000
"""GitHub refuses a comment over 65,536 characters; the rest of a longer body is cut with a note."""
PLAN_TIMEOUT = 1800


class CheckoutError(Exception):
    """The refs or the checkout cannot be used; the message says why in one line."""


@dataclass(frozen=True)
class Section:
    """One stack's part of the comment and whether it fails the check."""

    stack: str
    text: str
    failed: bool = False


def _git(repo: Path, *args: str) -> str:
    proc = git(repo, *args)
    if proc.returncode:
        raise CheckoutError(f"git {args[0]}: {git_said(proc)}")
    return proc.stdout


def resolve(repo: Path, ref: str, what: str) -> str:
    """The commit id ``ref`` names (CheckoutError when it names none)."""
    if not GIT_REVISION.fullmatch(ref):
        raise CheckoutError(f"--{what} {ref!r}: expected a git revision")
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}").strip()
    except CheckoutError:
        raise CheckoutError(f"--{what} {ref}: no such commit") from None


def stack_files(repo: Path, project: Path, base: str) -> tuple[list[str], list[str], list[str]]:
    """Stack names at HEAD (the checkout), those only at ``base`` (removed), and file names that look like stack
    files but are no plain stack name."""
    prefix = project.relative_to(repo).as_posix()
    prefix = "" if prefix == "." else prefix + "/"
    at_base = _git(repo, "ls-tree", "-z", "--name-only", base, "--", prefix or ".").split("\0")  # names unquoted
    names = {p.name for p in project.glob("Pulumi.*.yaml")} | {Path(p).name for p in at_base}
    names = {n for n in names if n.startswith("Pulumi.") and n.endswith(".yaml") and n != "Pulumi.yaml"}
    head, removed, odd = [], [], []
    for name in sorted(names):
        match = STACK_FILE.fullmatch(name)
        if match is None:
            odd.append(name)
        elif (project / name).is_file():
            head.append(match[1])
        else:
            removed.append(match[1])
    return head, removed, odd


def program_changed(repo: Path, base: str) -> list[str]:
    """The files the pull request changes that can change what ``pulumi up`` does."""
    changed = _git(repo, "diff", "-z", "--name-only", "--no-renames", base, "HEAD", "--").split("\0")
    changed = [p for p in changed if p]
    return [p for p in changed if not p.endswith(".md") and not p.startswith(NOT_THE_PROGRAM)]


def fenced(lines: Sequence[str]) -> str:
    """``lines`` (escaped) as a code block no line of them can close."""
    return code_block(escape_lines(lines), "text")


def plan_stack(project: Path, stack: str, base: str, env: dict[str, str]) -> Section:
    """One stack's section: the plan CLI's markdown diff against ``base``, or why there is none."""
    command = [sys.executable, "-m", "proxmox_gpu_cluster.plan", stack, "--placeholder-secrets", "--diff-base", base]
    try:
        proc = subprocess.run([*command, "--markdown"], cwd=project, env=env, capture_output=True, text=True,
                              timeout=PLAN_TIMEOUT, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return Section(stack, f"The plan took over {PLAN_TIMEOUT} s.", failed=True)
    said = [line for line in proc.stderr.splitlines() if not line.startswith("placeholders for secrets")]
    if proc.returncode == 0:
        notes = [line for line in said if line.startswith("new stack:")]
        lead = "New stack: every resource is added.\n\n" if notes else ""
        # The plan's own title repeats under each stack's heading: the comment has it once, at the top.
        return Section(stack, lead + proc.stdout.strip().removeprefix("### Offline plan diff").strip())
    if proc.returncode == 2 and said[:1] and said[0].startswith("--diff-base "):
        # The head side planned (the plan CLI plans it first); only the base revision is refused: a pull request
        # that repairs a stack must not fail for what it repairs.
        return Section(stack, "The base revision cannot be planned, so there is nothing to compare with; the pull "
                       "request's stack plans:\n\n" + fenced(said))  # fmt: skip
    if proc.returncode == 2:
        return Section(stack, "**The plan refuses this stack** (fix it before `pulumi up`):\n\n" + fenced(said), True)
    lines = [*said[-40:]] or [f"exit {proc.returncode}"]
    return Section(stack, f"**The offline plan failed** (exit {proc.returncode}):\n\n" + fenced(lines), True)


def render(base: str, head: str, sections: Sequence[Section], notes: Sequence[str]) -> str:
    """The comment body: the marker, a heading, a section per stack, cut to ``MAX_BODY``."""
    parts = [MARKER, "## Offline plan diff", "",
             f"What `pulumi up` would do, from the offline plan (no credentials; secrets as placeholders), "
             f"base `{base[:12]}` → head `{head[:12]}`.", ""]  # fmt: skip
    parts += [*notes, ""] if notes else []
    for section in sections:
        parts += [f"### Stack `{section.stack}`" + (" — refused" if section.failed else ""), "", section.text, ""]
    body = "\n".join(parts).rstrip() + "\n"
    if len(body) > MAX_BODY:
        body = body[:MAX_BODY].rsplit("\n", 1)[0] + "\n\n…cut: the diff is longer than a comment may be; run "
        body += f"`python -m proxmox_gpu_cluster.plan STACK --diff-base {base[:12]}` for all of it.\n"
    return body


def comment(repo: Path, project: Path, base_ref: str, head_ref: str) -> tuple[str, int]:
    """The comment body and the exit code (see the module's docstring)."""
    try:
        base, head = resolve(repo, base_ref, "base"), resolve(repo, head_ref, "head")
        if head != _git(repo, "rev-parse", "HEAD").strip():
            raise CheckoutError(f"--head {head_ref}: not the checked-out commit (the plans run on the checkout)")
        heads, removed, odd = stack_files(repo, project, base)
        changed = program_changed(repo, base)
    except CheckoutError as err:
        return render(base_ref, head_ref, [], [f"**No offline diff**: {escape_lines([str(err)])[0]}"]), 2
    shown = [f"`{n}`" for n in escape_lines([n.replace("`", "'") for n in odd])]  # a name can hold anything
    notes = [f"Not planned (no plain stack name): {', '.join(shown)}"] if odd else []
    if not changed:
        notes.append("This pull request changes nothing `pulumi up` runs (documentation, tests, workflows only).")
        return render(base, head, [], notes), 0
    sections = [Section(s, "The stack file is removed: `pulumi up` no longer runs for it; its resources stay "
                        f"until `pulumi destroy --stack {s}`.") for s in removed]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pgc-pr-shim-") as shim_dir:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PGC_SECRET_DIGEST_KEY")}
        if package_shim(repo, Path(shim_dir)):
            env["PYTHONPATH"] = os.pathsep.join([shim_dir, *filter(None, [env.get("PYTHONPATH")])])
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        sections += [plan_stack(project, s, base, env) for s in heads]
    sections.sort(key=lambda s: s.stack)
    return render(base, head, sections, notes), int(any(s.failed for s in sections))


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: writes the body to ``--out`` (or stdout) and returns the exit code."""
    parser = OneLineParser(prog="python -m proxmox_gpu_cluster.stacks.pr_comment", description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the pull request's base commit (github.event...base.sha)")
    parser.add_argument("--head", default="HEAD", help="the checked-out commit the plans run on (default: HEAD)")
    parser.add_argument("--project", type=Path, default=Path(), help="directory of Pulumi.yaml (default: .)")
    parser.add_argument("--out", type=Path, help="write the comment body here (default: stdout)")
    args = parser.parse_args(argv)
    project = args.project.resolve()
    try:
        repo = Path(_git(project, "rev-parse", "--show-toplevel").strip()).resolve()
    except (CheckoutError, OSError) as err:
        print(f"{project}: not a git checkout ({err})", file=sys.stderr)
        return 2
    body, code = comment(repo, project, args.base, args.head)
    if args.out:
        args.out.write_text(body, encoding="utf-8")
    else:
        sys.stdout.write(body)
    return code


if __name__ == "__main__":
    sys.exit(main())
