"""Every component asks the engine for the minimum CLI before it registers anything (the real engine's answer is
tested in tests/engine/test_real_cli.py); without a real engine nothing is asked."""

from __future__ import annotations

import ast
from pathlib import Path

import pulumi

from proxmox_gpu_cluster import engine_version

COMPONENTS = Path(__file__).resolve().parents[2] / "components"


def _component_inits() -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for path in sorted(COMPONENTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("ComponentResource") for b in node.bases):
                init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
                found.append((f"{path.relative_to(COMPONENTS)}:{node.name}", init))
    return found


def test_every_component_checks_the_cli_before_it_registers() -> None:
    inits = _component_inits()
    assert len(inits) >= 15
    for where, init in inits:
        calls = [ast.unparse(n.func) for n in ast.walk(init) if isinstance(n, ast.Call)]
        assert "require_cli" in calls, f"{where}: no require_cli()"
        assert calls.index("require_cli") < calls.index("super().__init__"), f"{where}: registers before the check"


def test_without_an_engine_or_under_pulumis_mocks_nothing_is_asked() -> None:
    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, object]]:
            return args.name, dict(args.inputs)

        def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, object], list[tuple[str, str]]]:
            return {}, []

    engine_version.require_cli()  # plain Python: no engine at all
    pulumi.runtime.set_mocks(Mocks(), preview=True)
    engine_version.require_cli()  # the mock engine has no version to ask
