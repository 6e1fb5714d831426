"""The package's shape: one import package, pure core and renderers that never import Pulumi, imports that point
down the layers only, and no module importing the repository's directory names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = {"proxmox_gpu_cluster": ROOT / "components", "proxmox_gpu_cluster.stacks": ROOT / "stacks"}
# Who may import whom: a package may import itself and the ones listed (transitively lower layers).
ALLOWED = {
    "core": {"core"},
    "render": {"core", "render"},
    "proxmox": {"core", "render", "proxmox", "<root>"},
    "guest": {"core", "render", "guest", "<root>"},
    "gpu": {"core", "render", "gpu", "<root>"},
    "cluster": {"core", "render", "proxmox", "guest", "gpu", "cluster", "<root>"},
    "stacks": {"core", "render", "proxmox", "gpu", "cluster", "stacks", "<root>"},
}


def modules() -> list[tuple[str, Path]]:
    out = []
    for name, base in PACKAGE.items():
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if name.endswith(".stacks") or parts[0] != "stacks":
                out.append((".".join((name, *parts)), path))
    return out


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in ALLOWED else "<root>"


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_imports_point_down_the_layers(module: str, path: Path) -> None:
    found = imports(path)
    assert not {i for i in found if i.split(".")[0] in {"components", "stacks"}}, "import proxmox_gpu_cluster.*"
    own = layer(module)
    if own in {"core", "render"}:
        assert not {i for i in found if i.split(".")[0].startswith("pulumi")}, f"{module} is pure"
    if own == "<root>":
        return
    used = {layer(i) for i in found if i.startswith("proxmox_gpu_cluster.")}
    assert used <= ALLOWED[own], f"{module} imports {used - ALLOWED[own]}"


def runtime_imports(path: Path) -> set[str]:
    """Modules imported when ``path`` runs: every import except those under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for n in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def test_no_import_cycles_at_run_time() -> None:
    graph = {m: {i for i in runtime_imports(p) if i.startswith("proxmox_gpu_cluster.")} for m, p in modules()}
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> None:
        if state.get(module) == 2:  # done
            return
        assert state.get(module) != 1, "import cycle: " + " -> ".join([*trail, module])
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            visit(target, [*trail, module])
        state[module] = 2

    for module in sorted(graph):
        visit(module, [])
    assert "proxmox_gpu_cluster.core.validation" in graph["proxmox_gpu_cluster.core.spec"]  # the former cycle
