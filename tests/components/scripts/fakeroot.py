"""A fake root for the remote scripts: files under a temporary ROOT, system commands stubbed on PATH.

Fault injection: ``fault(n, mode)`` makes the n-th stubbed command of the next run (counted over every stub, in
call order, from 1) fail (``fail``: exit 1 before doing anything, with a line on stderr), or kill the whole run
with SIGKILL of its process group, as a dropped SSH session or a Ctrl-C of ``pulumi up`` would (``kill``: before
the command does anything; ``kill-after``: once it has done its work). Every run starts in a new session, so the
process group is exactly the step and what it started.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from proxmox_gpu_cluster.render.agent_bundle import KINDS, REMOTE_DIR, bundle_files, installed_step, secrets_stdin

SCRIPTS = Path(__file__).resolve().parents[3] / "components" / "scripts"
AGENT = SCRIPTS.parent / "agent"
"""The node agent's Python modules; on a machine they sit next to the step's script (PGC_AGENT_DIR)."""
FAULT_MODES = ("fail", "kill", "kill-after")
_STEP_OF = {names[-1]: step for steps in KINDS.values() for step, names in steps.items() if names[-1].endswith(".sh")}
"""A step's own script -> the step (the last script of its bundle)."""
_HARNESS_FILES = {"fault.count", "fault.hit"}
_AGENT_COPY = REMOTE_DIR
"""The directory the agent's copy lives in (under a home directory; not machine state a test compares)."""
# The preamble of every stub: record the call, count it, and inject the fault when this is the chosen command.
_PREAMBLE = """#!/bin/sh
printf "%s\\n" "$(basename "$0") $*" >> "$PGC_ROOT/calls.log"
if [ -n "${PGC_FAULT_AT:-}" ]; then
  n=$(( $(cat "$PGC_ROOT/fault.count" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$PGC_ROOT/fault.count"
  if [ "$n" = "$PGC_FAULT_AT" ]; then
    echo "$(basename "$0") $*" > "$PGC_ROOT/fault.hit"
    case "$PGC_FAULT_MODE" in
      fail) echo "$(basename "$0"): injected failure" >&2; exit 1 ;;
      kill) kill -KILL 0 ;;
      kill-after) trap 'kill -KILL 0' EXIT ;;
    esac
  fi
fi
"""


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    calls: list[str]
    """Stubbed commands this run called, as ``name args...``."""


class FakeRoot:
    """``root`` holds the host's files; ``stub`` commands append their argv to ``root/calls.log``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "_stubs"
        self.bin.mkdir(parents=True)
        self.log = root / "calls.log"
        self.outputs: dict[str, str] = {}

    def write(self, path: str, content: str) -> Path:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        return target

    def read(self, path: str) -> str:
        return (self.root / path.lstrip("/")).read_text()

    def link(self, path: str, target: str) -> None:
        link = self.root / path.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target)

    def stub(self, name: str, stdout: str = "") -> None:
        """A command that records its call and prints ``stdout``."""
        (self.bin / f"{name}.out").write_text(stdout)
        script = self.bin / name
        script.write_text(_PREAMBLE + f'cat "{self.bin / (name + ".out")}"\n')
        script.chmod(0o755)

    def stub_script(self, name: str, body: str) -> None:
        """A command that records its call, then runs ``body`` (sh) with the same arguments. ``body`` must not
        ``exec`` another program: the shell has to live on for a ``kill-after`` fault's exit trap."""
        script = self.bin / name
        script.write_text(f"{_PREAMBLE}{body}\n")
        script.chmod(0o755)

    def fault(self, at: int | None, mode: str = "fail") -> None:
        """Inject a fault at the ``at``-th stubbed command of every later run (None: no more faults); the count
        starts again at each call."""
        if mode not in FAULT_MODES:
            raise ValueError(f"fault mode {mode!r}; modes: {', '.join(FAULT_MODES)}")
        self._fault = (at, mode) if at is not None else None
        (self.root / "fault.count").unlink(missing_ok=True)
        (self.root / "fault.hit").unlink(missing_ok=True)

    def fault_hit(self) -> str | None:
        """The command the injected fault hit (``name args``), or None if the run never reached it."""
        hit = self.root / "fault.hit"
        return hit.read_text().strip() if hit.exists() else None

    def run(self, script: str, *args: str) -> Result:
        """Run a step's script as a machine does (its agent bundle, ``run_bundle``), or any other script as it is."""
        step = _STEP_OF.get(script)
        if step is not None:
            return self.run_bundle(step, *args)
        return self._call(["bash", str(SCRIPTS / script), *args])

    def install_bundle(self, step: str, user: str = "ubuntu") -> Path:
        """Install ``step``'s agent bundle where the agent's copy puts it for SSH user ``user`` (``/home/<user>`` or
        ``/root``, then ``.proxmox-gpu-cluster/agent/<step>-<fp>``); returns its directory in the fake root."""
        bundle = self.root / installed_step(user, step).lstrip("/")
        bundle = bundle.parent
        if not bundle.is_dir():
            bundle.mkdir(parents=True)
            for name, content in bundle_files(step):
                (bundle / name).write_bytes(content)
        return bundle

    def run_bundle(self, step: str, *args: str, secrets: dict[str, str] | None = None) -> Result:
        """Run ``step`` as a machine does: its agent bundle installed (``install_bundle``), run as
        ``bash <bundle>/step.sh <args>`` with only ``secrets`` on stdin (render/agent_bundle.py ``step_command`` and
        ``secrets_stdin``)."""
        bundle = self.install_bundle(step)
        return self._call(["bash", str(bundle / "step.sh"), *args], stdin=secrets_stdin(secrets or {}))

    def run_stdin(self, text: str, *args: str) -> Result:
        """Run ``text`` the way the remote commands do: ``bash -s -- <args>`` with the script on stdin."""
        return self._call(["bash", "-s", "--", *args], stdin=text)

    def _call(self, argv: list[str], stdin: str | None = None) -> Result:
        before = self.log.read_text().splitlines() if self.log.exists() else []
        env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "PGC_ROOT": str(self.root),
            "LC_ALL": "C",
            "PGC_AGENT_DIR": str(AGENT),
        }
        fault = getattr(self, "_fault", None)
        if fault is not None:
            env |= {"PGC_FAULT_AT": str(fault[0]), "PGC_FAULT_MODE": fault[1]}
        # A new session: the process group is this run alone, so an injected kill takes exactly the step and what
        # it started, as losing the SSH session does.
        proc = subprocess.run(
            argv, input=stdin, env=env, capture_output=True, text=True, check=False, start_new_session=True
        )
        after = self.log.read_text().splitlines() if self.log.exists() else []
        return Result(proc.returncode, proc.stdout, proc.stderr, after[len(before) :])

    @property
    def killed(self) -> bool:
        """Whether the injected fault was a kill and it happened."""
        fault = getattr(self, "_fault", None)
        return fault is not None and fault[1] != "fail" and self.fault_hit() is not None

    def snapshot(self) -> dict[str, str]:
        """Every file under the root except the stubs and the call log, with its content."""
        return {
            str(p.relative_to(self.root)): p.read_text()
            for p in sorted(self.root.rglob("*"))
            if p.is_file()
            and not p.is_symlink()
            and self.bin not in p.parents
            and p != self.log
            and p.name not in _HARNESS_FILES
            and _AGENT_COPY not in p.relative_to(self.root).parts
        }
