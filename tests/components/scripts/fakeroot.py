"""A fake root for the remote scripts: files under a temporary ROOT, system commands stubbed on PATH."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[3] / "components" / "scripts"


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
        script.write_text(
            '#!/bin/sh\nprintf "%s\\n" "$(basename "$0") $*" >> "$PGC_ROOT/calls.log"\n'
            f'cat "{self.bin / (name + ".out")}"\n'
        )
        script.chmod(0o755)

    def stub_script(self, name: str, body: str) -> None:
        """A command that records its call, then runs ``body`` (sh) with the same arguments."""
        script = self.bin / name
        script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$(basename "$0") $*" >> "$PGC_ROOT/calls.log"\n{body}\n')
        script.chmod(0o755)

    def run(self, script: str, *args: str) -> Result:
        return self._call(["bash", str(SCRIPTS / script), *args])

    def run_stdin(self, text: str, *args: str) -> Result:
        """Run ``text`` the way the remote commands do: ``bash -s -- <args>`` with the script on stdin."""
        return self._call(["bash", "-s", "--", *args], stdin=text)

    def _call(self, argv: list[str], stdin: str | None = None) -> Result:
        before = self.log.read_text().splitlines() if self.log.exists() else []
        env = {"PATH": f"{self.bin}:/usr/bin:/bin", "PGC_ROOT": str(self.root), "LC_ALL": "C"}
        proc = subprocess.run(argv, input=stdin, env=env, capture_output=True, text=True, check=False)
        after = self.log.read_text().splitlines() if self.log.exists() else []
        return Result(proc.returncode, proc.stdout, proc.stderr, after[len(before) :])

    def snapshot(self) -> dict[str, str]:
        """Every file under the root except the stubs and the call log, with its content."""
        return {
            str(p.relative_to(self.root)): p.read_text()
            for p in sorted(self.root.rglob("*"))
            if p.is_file() and not p.is_symlink() and self.bin not in p.parents and p != self.log
        }
