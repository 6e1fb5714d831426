"""The node agent: what is installed once per machine, and how a step names what it runs. Pure (no Pulumi).

Every step of a machine (a worker's guest, a Proxmox node) is a bundle: a directory ``<step>-<fingerprint>/``
holding ``step.sh`` (the prologue, the shared helpers and the step's script, comment lines stripped) and the
agent's Python modules where the step uses them. The fingerprint is the first 12 hex digits of the sha256 of the
bundle's ``sha256sum`` listing (C locale order), so the prologue on the machine can check it, and it changes
exactly when what the step runs changes. All bundles of one kind of machine form one directory ``agent/``, copied
to ``~/.proxmox-gpu-cluster/agent`` by one ``CopyToRemote`` per machine (``node_agent.py``); a step's command is
``bash -c LAUNCHER .proxmox-gpu-cluster/agent/<step>-<fp>/step.sh <args>`` (relative to the login directory, kept
by sudo), its stdin only its secrets. CopyToRemote writes files in place, so the copy is never what a step runs
from: the prologue installs each bundle into ``~/.proxmox-gpu-cluster/bundles/<step>-<fp>/`` (a checked copy
renamed into place, never written again) and runs it from there (agent_prologue.sh). So a change of one script
re-runs only the steps whose bundle it is part of, and the state holds a command line per step instead of every
script's text.

Why a directory of bundles rather than one file: pulumi-command's CopyToRemote (v1.2.1, copyController.go
``Update``) copies again only when the source's hash or ``remotePath`` changes, and the engine compares assets by
hash alone (pulumi sdk/go/common/resource/properties_diff.go), so another checkout path is no diff; a directory
archive is hashed as a tar of relative names with fixed modes (archive.go ``EnsureHashWithWD``), never mtimes.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import re
import shlex
import tempfile
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from proxmox_gpu_cluster.render.shipping import strip_comments

REMOTE_DIR = ".proxmox-gpu-cluster"
"""Where the agent lands, relative to the SSH user's login directory (SFTP's and the command's starting point)."""
AGENT = "agent"
"""The name of the copied directory (CopyToRemote puts a directory source at ``remotePath/<its name>``)."""
CACHE_ENV = "PGC_AGENT_CACHE"
"""Where the bundles are written for the copy (default: the user's cache directory)."""

_CLUSTER = ("agent/cluster.py", "agent/kubeapi.py")  # cluster.py imports kubeapi.py from its directory
GUEST_STEPS: dict[str, tuple[str, ...]] = {
    "cloud-init": ("guest_lib.sh", "guest_cloud_init.sh"),
    "driver": (
        "guest_lib.sh",
        "guest_rollout.sh",
        "guest_mig_mode.sh",
        "guest_driver_apt.sh",
        "guest_driver.sh",
        *_CLUSTER,
    ),
    "runtime": ("guest_lib.sh", "guest_runtime.sh"),
    "join": ("guest_lib.sh", "guest_rollout.sh", "guest_join.sh", *_CLUSTER, "agent/upgrade.py"),
    "verify": ("guest_lib.sh", "guest_rollout.sh", "guest_verify.sh", *_CLUSTER),
    "mig": ("guest_lib.sh", "guest_rollout.sh", "guest_mig_mode.sh", "guest_mig.sh", *_CLUSTER, "agent/mig_manager.py"),
    "capacity": ("guest_lib.sh", "guest_capacity.sh", "agent/capacity.py"),
    "drain": ("guest_lib.sh", "guest_drain.sh", *_CLUSTER),
    "hold": ("guest_lib.sh", "guest_rollout.sh", "guest_hold.sh", *_CLUSTER),
}
"""The steps that run on a worker's guest: the scripts each is made of, in order (``scripts/``), then the agent's
Python modules it calls (``agent/``, installed beside ``step.sh``)."""
HOST_STEPS: dict[str, tuple[str, ...]] = {
    "host-prep": ("host_lib.sh", "host_compose.sh", "host_prep.sh"),
    "host-verify": ("host_lib.sh", "host_verify.sh"),
    "large-bar": ("host_lib.sh", "large_bar.sh"),
    "retire": ("host_qm.sh", "retire_vm.sh"),
    "mig-restart": ("host_lib.sh", "host_qm.sh", "mig_restart.sh"),
    "vm-restart": ("host_lib.sh", "host_qm.sh", "vm_restart.sh"),
}
"""The steps that run on a Proxmox node."""
KINDS = {"guest": GUEST_STEPS, "host": HOST_STEPS}
GUEST_EXEC_STEPS = ("retire", "mig-restart", "vm-restart")
"""Host steps that run a guest's installed step (``qm guest exec``): their step.sh has ``PGC_LAUNCHER``."""
SECRET_NAMES = ("PGC_JOIN_TOKEN", "PGC_CA_CERT_HASH")
"""The only names a step accepts on stdin (agent_prologue.sh)."""


def _text(package: str, name: str) -> str:
    return resources.files("proxmox_gpu_cluster").joinpath(package, name).read_text()


@functools.cache
def bundle_files(step: str) -> tuple[tuple[str, bytes], ...]:
    """The files of ``step``'s bundle (name, content), sorted by name."""
    kind = next((k for k, steps in KINDS.items() if step in steps), None)
    if kind is None:
        known = ", ".join(s for steps in KINDS.values() for s in steps)
        raise ValueError(f"unknown agent step {step!r}; steps: {known}")
    scripts = [name for name in KINDS[kind][step] if not name.startswith("agent/")]
    text = "\n".join(strip_comments(_text("scripts", name)) for name in ["agent_prologue.sh", *scripts])
    if step in GUEST_EXEC_STEPS:  # they start a guest's step through the QEMU guest agent: as step_command does
        text = text.replace("\n", f"\n# shellcheck disable=SC2016,SC2034\nPGC_LAUNCHER={shlex.quote(LAUNCHER)}\n", 1)
    files: dict[str, bytes] = {"step.sh": whole(text).encode()}
    for module in (name for name in KINDS[kind][step] if name.startswith("agent/")):
        files[module.removeprefix("agent/")] = _text("agent", module.removeprefix("agent/")).encode()
    return tuple(sorted(files.items()))


def whole(text: str) -> str:
    """``text`` as one brace group: bash parses a compound command completely before it runs any of it, so a
    step.sh cut short (a copy rewriting it while bash reads it) ends in a syntax error (exit 2) before anything
    ran, never at a command boundary with the exit code of what ran so far (bash reads a script as it goes: a
    file that ends before ``main "$@"`` is a success that did nothing)."""
    return "{\n" + text.rstrip("\n") + "\n}\n"


def _digest(files: tuple[tuple[str, bytes], ...]) -> str:
    listing = "".join(f"{hashlib.sha256(content).hexdigest()}  {name}\n" for name, content in files)
    return hashlib.sha256(listing.encode()).hexdigest()


def fingerprint(step: str) -> str:
    """12 hex digits naming exactly what ``step`` runs (what agent_prologue.sh recomputes on the machine)."""
    return _digest(bundle_files(step))[:12]


def bundle_name(step: str) -> str:
    """``<step>-<fingerprint>``: the bundle's directory on the machine."""
    return f"{step}-{fingerprint(step)}"


def fingerprints(kind: str) -> dict[str, str]:
    """Step -> fingerprint for every step of a kind of machine (``guest`` or ``host``)."""
    return {step: fingerprint(step) for step in KINDS[kind]}


def agent_version(kind: str) -> str:
    """12 hex digits naming the whole agent of a kind of machine (every bundle)."""
    listing = "".join(f"{step} {fp}\n" for step, fp in sorted(fingerprints(kind).items()))
    return hashlib.sha256(listing.encode()).hexdigest()[:12]


LAUNCHER = (
    'b="${0%/agent/*}/bundles/${0##*/agent/}"; s="${0%/step.sh}"; s="${s##*/}"; s="${s%-*}"; '
    'if [[ -f $b ]] && bash -n "$b" 2>/dev/null; then exec bash "$b" "$@"; fi; '
    'if [[ ! -f $0 ]]; then echo "$s: agent: expected $0, saw nothing (the node agent copy is gone: replace this '
    'machine -agent resource with pulumi up --replace <its URN>)" >&2; exit 1; fi; '
    't="$(mktemp)"; cat -- "$0" >"$t"; '
    'if [[ ! -s $t ]] || ! bash -n "$t" 2>/dev/null; then rm -f "$t"; echo "$s: agent: expected a complete $0, '
    'saw one cut short (another copy of the agent is writing it; run again)" >&2; exit 1; fi; '
    'PGC_AGENT_COPY="${0%/step.sh}" exec bash "$t" "$@"'
)
"""What a step's command runs (``bash -c LAUNCHER <the copy's step.sh> <args>``): the store's bundle when it is
there and parses (nothing writes into it once it is there), else a private snapshot of the copy's step.sh, read
whole and checked to be neither empty nor cut short (bash would run an empty file as a success), whose prologue
installs the bundle from the copy into the store and runs it from there (agent_prologue.sh); else one line naming
the step instead of bash's "No such file or directory" (the agent's directory was removed)."""


def step_command(user: str, step: str, args: list[str]) -> str:
    """The remote command of ``step``: its bundle (``LAUNCHER``) with ``args`` (each quoted), through passwordless
    sudo unless the SSH user is root (sudo keeps the login directory, which the path is relative to)."""
    sudo = "" if user == "root" else "sudo -n "
    return f"{sudo}bash -c {shlex.join([LAUNCHER, _step_path(step), *args])}"


def _step_path(step: str) -> str:
    """``step``'s installed script, relative to the SSH user's home directory."""
    return f"{REMOTE_DIR}/{AGENT}/{bundle_name(step)}/step.sh"


STEP_PATH = re.compile(rf"{re.escape(REMOTE_DIR)}/{AGENT}/([a-z0-9-]+)-([0-9a-f]{{12}})/step\.sh")
"""An installed step's script in a command: the step and its fingerprint."""


def installed_step(user: str, step: str) -> str:
    """The absolute path of ``step``'s installed script on a machine whose SSH user is ``user`` (for a step that
    another machine starts: the Proxmox node runs the guest's ``drain`` through the QEMU guest agent, as root and
    outside the user's login directory). Home directories as cloud-init creates them: ``/root``, ``/home/<user>``."""
    home = "/root" if user == "root" else f"/home/{user}"
    return f"{home}/{_step_path(step)}"


def secrets_stdin(values: Mapping[str, str]) -> str:
    """A step's stdin: one ``NAME=<base64>`` line per secret (the prologue decodes them into shell variables).
    Call it inside a secret Output: the result holds the credentials."""
    unknown = sorted(set(values) - set(SECRET_NAMES))
    if unknown:
        raise ValueError(f"not a secret a step reads: {', '.join(unknown)}")
    return "".join(f"{name}={base64.b64encode(value.encode()).decode()}\n" for name, value in values.items())


def cache_root() -> Path:
    """Where bundles are written: $PGC_AGENT_CACHE, else $XDG_CACHE_HOME or ~/.cache, under proxmox-gpu-cluster."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "proxmox-gpu-cluster"


@functools.cache
def materialize(kind: str) -> str:
    """The local ``agent/`` directory of a kind of machine, written once per content (``agent-<kind>-<version>``
    under ``cache_root()``, built in a temporary directory and renamed into place, so parallel plans never see
    half of one) and checked again when it already exists. Returns its path, for a ``FileArchive``."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind of machine {kind!r}; kinds: {', '.join(KINDS)}")
    wanted = {bundle_name(step): bundle_files(step) for step in KINDS[kind]}
    root = cache_root()
    final = root / f"agent-{kind}-{agent_version(kind)}"
    if _intact(final / AGENT, wanted):
        return str(final / AGENT)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable cache (a read-only HOME in a CI container): a private directory of this run's
        root = Path(tempfile.mkdtemp(prefix="proxmox-gpu-cluster-agent-"))
        final = root / final.name
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    for bundle, files in wanted.items():
        (staging / AGENT / bundle).mkdir(parents=True)
        for name, content in files:
            (staging / AGENT / bundle / name).write_bytes(content)
    try:
        os.rename(staging, final)
    except OSError:  # another process won the race, or a damaged copy is in the way: replace it
        if not _intact(final / AGENT, wanted):
            damaged = Path(tempfile.mkdtemp(prefix=".damaged-", dir=root))
            os.rename(final, damaged / "old")
            os.rename(staging, final)
    return str(final / AGENT)


def _intact(agent: Path, wanted: Mapping[str, tuple[tuple[str, bytes], ...]]) -> bool:
    """Whether ``agent`` holds exactly the wanted bundles, byte for byte."""
    if not agent.is_dir() or {p.name for p in agent.iterdir()} != set(wanted):
        return False
    for bundle, files in wanted.items():
        directory = agent / bundle
        if {p.name for p in directory.iterdir()} != {name for name, _ in files}:
            return False
        if any((directory / name).read_bytes() != content for name, content in files):
            return False
    return True


def agent_summary() -> dict[str, dict[str, object]]:
    """Per kind of machine: the agent's version and each step's fingerprint (what the plan shows)."""
    return {kind: {"version": agent_version(kind), "steps": fingerprints(kind)} for kind in KINDS}


def agent_lines() -> list[str]:
    """The plan's text lines for ``agent_summary``."""
    return [
        f"{kind} {agent_version(kind)}: " + ", ".join(f"{step} {fp}" for step, fp in fingerprints(kind).items())
        for kind in KINDS
    ]
