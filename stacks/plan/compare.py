"""The two sides of a plan diff (``--diff-config``, ``--diff-base``) as plan documents.

``--diff-base REF`` plans the base revision whole, its code with its stack file: a pull request that only changes a
script or the program is a change too, and the old stack file planned with the new code would show a change nobody
made. The base revision is checked out into a temporary detached git worktree (always removed, on errors and Ctrl-C
too) and its own plan CLI runs there in a subprocess with ``--json``. ``import proxmox_gpu_cluster`` must find the
worktree's files, not the editable install of the current checkout: a shim directory first on ``PYTHONPATH`` lays
out the package the way pyproject.toml's ``[tool.setuptools] package-dir`` maps it (``components/`` is the package,
``stacks/`` its ``stacks`` subpackage) with symlinks into the worktree. A program outside the stack file's
repository (a stack file kept apart from the program) has no base revision of its code: the base stack file is
then planned with the current code, and stderr says so.

Both sides fingerprint secrets with one random key made per diff (``plan.values.new_digest_key``), handed to the
subprocess as ``PGC_SECRET_DIGEST_KEY`` and forgotten after: the diff can say a secret changed without either plan
showing anything reversible. An older base revision's ``--json`` may lack newer fields; ``normalised`` fills them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from proxmox_gpu_cluster.core.input_safety import escape_controls
from proxmox_gpu_cluster.stacks.plan.inputs import InputError, Program, read_inputs, stack_file_at
from proxmox_gpu_cluster.stacks.plan.specs import PlannedCluster
from proxmox_gpu_cluster.stacks.plan.values import SECRET_KEY_ENV

BASE_TIMEOUT = 900
"""Seconds the base revision's plan may take (a 1000-worker plan takes about a minute)."""
ERROR_LINES = 40
"""Most lines of the base plan's stderr repeated in an error (its last ones: where a traceback ends)."""

PlanInProcess = Callable[[Mapping[str, Any]], tuple[dict[str, Any], list[PlannedCluster]]]
"""Plans a stack file's document with the current code: its plan document and cluster specs."""


class BaseRevisionError(InputError):
    """The base revision cannot be planned; ``lines`` says why (the first names the revision)."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__(lines[0])
        self.lines = list(lines)


def git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``git -C repo args``, its output as text, never raising for git's exit code."""
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)


def git_said(proc: subprocess.CompletedProcess[str]) -> str:
    """The last line git wrote to stderr (what went wrong), or its exit code."""
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"git exited with {proc.returncode}"


def repository_of(ref: str, path: Path) -> tuple[Path, str]:
    """The top of the git repository holding ``path`` and the commit ``ref`` names in it (InputError otherwise:
    not a repository, not a commit)."""
    if ref.startswith("-"):
        raise InputError(f"--diff-base {ref}: expected a git revision")
    top = git(path.parent, "rev-parse", "--show-toplevel")
    if top.returncode:
        raise InputError(f"--diff-base {ref}: {path.parent} is not in a git repository ({git_said(top)})")
    commit = git(path.parent, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
    if commit.returncode:
        raise InputError(f"--diff-base {ref}: no such commit in {top.stdout.strip()}")
    return Path(top.stdout.strip()).resolve(), commit.stdout.strip()


def _terminated(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def worktree(repo: Path, commit: str) -> Iterator[Path]:
    """``commit`` checked out (detached) in a temporary directory; removed from disk and from git's list of
    worktrees whatever happens inside: an exception, Ctrl-C, or SIGTERM (a cancelled CI job), which exits through
    the cleanup meanwhile instead of leaving a worktree registered in the repository."""
    scratch = Path(tempfile.mkdtemp(prefix="pgc-diff-base-"))
    tree = scratch / "tree"
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set signal handlers
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        added = git(repo, "worktree", "add", "--detach", "--quiet", str(tree), commit)
        if added.returncode:
            raise InputError(f"--diff-base {commit[:12]}: git worktree add failed: {git_said(added)}")
        yield tree
    finally:
        git(repo, "worktree", "remove", "--force", str(tree))
        shutil.rmtree(scratch, ignore_errors=True)
        git(repo, "worktree", "prune")
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def package_shim(tree: Path, shim: Path) -> bool:
    """Lay out under ``shim`` the packages ``tree``'s pyproject.toml maps with ``package-dir`` (symlinks into
    ``tree``), so ``shim`` first on sys.path imports ``tree``'s code. False when ``tree`` maps none (a program
    that uses the installed library: nothing to shim)."""
    try:
        setuptools = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]
        mapping = {str(k): str(v) for k, v in setuptools["package-dir"].items() if k}
    except (OSError, ValueError, KeyError, AttributeError):
        return False
    mapped = False
    for package in sorted(mapping, key=lambda p: p.count(".")):  # a package before its mapped subpackages
        source, target = tree / mapping[package], shim.joinpath(*package.split("."))
        if not (source / "__init__.py").is_file():
            continue
        if target.is_symlink():
            target.unlink()
        target.mkdir(parents=True, exist_ok=True)
        for entry in source.iterdir():
            if entry.name != "__pycache__" and not (target / entry.name).exists():
                (target / entry.name).symlink_to(entry)
        mapped = True
    return mapped


def _child_env(shim: Path | None, key: bytes) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", SECRET_KEY_ENV)}
    if shim is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(shim), *filter(None, [env.get("PYTHONPATH")])])
    env[SECRET_KEY_ENV] = key.hex()
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing written into the worktree or the shim
    return env


def plan_at_revision(ref: str, commit: str, tree: Path, *, program: Path, stack_file: Path, stack: str,
                     options: Sequence[str], key: bytes) -> dict[str, Any]:  # fmt: skip
    """The base revision's plan document: its CLI run in ``tree`` on ``program`` (a file there) and
    ``stack_file`` (there too). BaseRevisionError with its own lines when it refuses the stack or fails."""
    with tempfile.TemporaryDirectory(prefix="pgc-shim-") as shim_dir:
        shim = Path(shim_dir)
        args = [sys.executable, "-m", "proxmox_gpu_cluster.plan", stack, "--json", "--config", str(stack_file)]
        if program.name != "__main__.py":
            args += ["--main", str(program)]
        env = _child_env(shim if package_shim(tree, shim) else None, key)
        try:
            proc = subprocess.run([*args, *options], cwd=program.parent, env=env, capture_output=True, text=True,
                                  timeout=BASE_TIMEOUT, check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise BaseRevisionError([f"--diff-base {ref}: its plan took over {BASE_TIMEOUT} s"]) from None
    said = proc.stderr.strip().splitlines()[-ERROR_LINES:]
    refused = next((line for line in said if "error: unrecognized arguments:" in line), None)
    if proc.returncode == 2 and refused is not None:  # argparse: an older CLI without an option this plan uses
        option = refused.split("error: unrecognized arguments:", 1)[1].strip()
        raise BaseRevisionError([f"--diff-base {ref}: the base revision's plan is older than {option} "
                                 f"({commit[:12]}); diff against a later revision"])  # fmt: skip
    if proc.returncode == 2:
        raise BaseRevisionError([f"--diff-base {ref}: the base revision refuses its stack file ({commit[:12]}):",
                                 *(f"  {line}" for line in said)])  # fmt: skip
    if proc.returncode:
        raise BaseRevisionError([f"--diff-base {ref}: the base revision's plan failed (exit {proc.returncode}):",
                                 *(f"  {line}" for line in said)])  # fmt: skip
    try:
        document = json.loads(proc.stdout)
    except ValueError as err:
        raise BaseRevisionError([f"--diff-base {ref}: the base revision's plan printed no JSON ({err})"]) from None
    if not isinstance(document, dict) or not isinstance(document.get("resources"), list):
        raise BaseRevisionError([f"--diff-base {ref}: the base revision's plan printed no plan document"])
    return normalised(document)


def normalised(document: Mapping[str, Any]) -> dict[str, Any]:
    """``document`` with every field the diff reads present: a base revision's older ``--json`` may lack fields
    added since (options, capacity, disruption); a missing one reads as empty, never as a change of its own."""
    out = {"resources": [], "outputs": {}, "capacity": [], "warnings": [], "rebootPoints": {}, **document}
    defaults: dict[str, Any] = {"parent": None, "provider": None, "dependencies": [], "inputs": {}, "options": {}}
    out["resources"] = [{**defaults, **r} for r in out["resources"] if isinstance(r, Mapping) and "urn" in r]
    return out


def empty_document(project: str, stack: str) -> dict[str, Any]:
    """The plan of a stack that does not exist yet: every resource of the other side is added."""
    return normalised({"project": project, "stack": stack})


def base_document(ref: str, stack: str, path: Path, program: Program, *, options: Sequence[str], key: bytes,
                  in_process: PlanInProcess) -> tuple[dict[str, Any], str | None]:  # fmt: skip
    """The plan document of stack ``stack`` (stack file ``path``) at ``ref`` and a note for stderr, or None.

    The stack file missing at ``ref``: a new stack (an empty plan). The program outside the stack file's
    repository: the base stack file with the current code (``in_process``)."""
    top, commit = repository_of(ref, path)
    try:
        relative = path.resolve().relative_to(top)
    except ValueError:
        raise InputError(f"--diff-base {ref}: {path} is not inside {top}") from None
    if git(top, "cat-file", "-e", f"{commit}:{relative.as_posix()}").returncode:
        return empty_document(program.project, stack), f"new stack: {relative} does not exist at {ref}"
    try:
        main = program.main.resolve().relative_to(top)
    except ValueError:
        note = f"{program.main} is outside {top}: the base stack file is planned with the current code"
        return in_process(stack_file_at(commit, path))[0], note
    with worktree(top, commit) as tree:
        document = plan_at_revision(ref, commit, tree, program=tree / main, stack_file=tree / relative, stack=stack,
                                    options=options, key=key)  # fmt: skip
        return document, None


def child_options(placeholder_secrets: bool, namespaces: Sequence[str] | None, pci: Sequence[str]) -> list[str]:
    """The plan options the base revision's CLI gets as the current plan got them (files made absolute: it runs
    in another directory)."""
    options = ["--placeholder-secrets"] if placeholder_secrets else []
    for namespace in namespaces or ():
        options += ["--namespace", namespace]
    for item in pci:
        node, _, file = item.partition("=")
        options += ["--pci", f"{node}={Path(file).resolve()}"]
    return options


Sides = tuple[dict[str, Any], dict[str, Any], list[PlannedCluster]]
"""A diff's plan document before, after, and the cluster specs after."""


def diff_sides(args: Any, program: Program, path: Path, now: dict[str, Any], specs: list[PlannedCluster], *,
               planned: PlanInProcess, key: bytes) -> Sides:  # fmt: skip
    """The plan documents before and after the change the plan CLI's ``args`` ask for (``--diff-config OTHER``:
    ``now`` then OTHER; ``--diff-base REF``: REF then ``now``) and the cluster specs of the side after it."""
    if args.diff_config:
        after, after_specs = planned(read_inputs(args.diff_config, [])[0])
        return now, after, after_specs
    options = child_options(args.placeholder_secrets, args.namespace, args.pci)
    before, note = base_document(args.diff_base, args.stack, path, program, options=options, key=key,
                                 in_process=planned)  # fmt: skip
    if note:
        print(escape_controls(note), file=sys.stderr)
    return before, now, specs
