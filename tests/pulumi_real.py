"""The real Pulumi CLI (built by ``make tools``, tools/recipes/pulumi.sh) running a Python program file.

The CLI normally starts the program through the Python language host, pulumi-language-python, which the module
proxy here does not serve (tools/recipes/pulumi.sh). So the program runs under the Python SDK's own language server
instead: the automation API's inline program (pulumi/automation/_server.py), to which the CLI connects
(``--client``) exactly as it would to the language host. The engine, the state, the config and secrets handling and
the program's registrations are the real ones; what the language host alone does (finding the virtualenv, running
``python -m pulumi``) is not exercised.

Each run is a subprocess (``python -m tests.pulumi_real <project> <stack> <op>``), so the SDK's process-wide runtime
state never meets the mocks other tests set. Scratch home, local file backend, passphrase secrets, no update check,
no plugin download."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support import ROOT, built_tool

PASSPHRASE = "pgc-test-passphrase"  # the scratch stacks' passphrase, not a credential


@dataclass(frozen=True)
class Cli:
    """One scratch Pulumi home and backend."""

    env: dict[str, str]

    def pulumi(self, project: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """The CLI itself (``pulumi <args>``) in ``project``."""
        return subprocess.run(
            [self.env["PGC_PULUMI"], *args, "--non-interactive"],
            cwd=project, env=self.env, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def program(self, project: Path, stack: str, op: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``op`` (preview, up, destroy) of ``project``'s __main__.py on ``stack`` (created when missing)."""
        return subprocess.run(
            [sys.executable, "-m", "tests.pulumi_real", str(project), stack, op],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip


def cli(tmp: Path) -> Cli:
    """A CLI environment under ``tmp`` (skipped where the CLI is not built; required in CI)."""
    pulumi = built_tool("pulumi")
    home, backend = tmp / "pulumi-home", tmp / "backend"
    home.mkdir(parents=True, exist_ok=True)
    backend.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": f"{pulumi.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(tmp),
        "PULUMI_HOME": str(home),
        "PULUMI_BACKEND_URL": f"file://{backend}",
        "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        # Never fetch a plugin: a program that needs one it does not have fails instead.
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PGC_PULUMI": str(pulumi),
        "LC_ALL": "C.UTF-8",
    }
    for name in ("PGC_AGENT_CACHE", "PYTHONPATH"):
        if name in os.environ:
            env[name] = os.environ[name]
    return Cli(env)


def project(folder: Path, program: str, name: str = "pgc-probe") -> Path:
    """A Python project in ``folder`` whose __main__.py is ``program``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Pulumi.yaml").write_text(f"name: {name}\nruntime: python\n")
    (folder / "__main__.py").write_text(program)
    return folder


def _main(project_dir: str, stack_name: str, op: str) -> int:
    from pulumi import automation as auto

    folder = Path(project_dir)
    name = next(
        line.split(":", 1)[1].strip() for line in (folder / "Pulumi.yaml").read_text().splitlines()
        if line.startswith("name:")
    )  # fmt: skip

    def program() -> None:
        os.chdir(folder)
        runpy.run_path(str(folder / "__main__.py"), run_name="__main__")

    command = auto.PulumiCommand(root=str(Path(os.environ["PGC_PULUMI"]).parent.parent))
    opts = auto.LocalWorkspaceOptions(work_dir=str(folder), pulumi_command=command, env_vars=dict(os.environ))
    stack = auto.create_or_select_stack(stack_name, project_name=name, program=program, opts=opts)
    try:
        if op == "preview":
            stack.preview(on_output=print)
        elif op == "up":
            stack.up(on_output=print)
        elif op == "destroy":
            stack.destroy(on_output=print)
        else:
            print(f"unknown operation {op}", file=sys.stderr)
            return 2
    except auto.CommandError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(*sys.argv[1:4]))
