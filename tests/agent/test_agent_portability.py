"""The node agent runs on the machine with its own python3: Ubuntu 22.04 has 3.10, Debian 12 has 3.11. Every
components/agent/*.py must parse as Python 3.10, import only the standard library and, of this package, only the
sibling modules its bundle ships beside it (SIBLINGS: cluster.py and upgrade.py import kubeapi.py, mig_manager.py
both, relatively inside the package, by name from its bundle directory on the machine), and use no library name
added after 3.10."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parents[2] / "components" / "agent"
MODULES = sorted(AGENT.glob("*.py"))
NEWER = {("datetime", "UTC"), ("typing", "Self"), ("typing", "LiteralString"), ("typing", "Never"),
         ("typing", "assert_never"), ("typing", "reveal_type"), ("enum", "StrEnum"), ("asyncio", "TaskGroup"),
         ("asyncio", "timeout"), ("hashlib", "file_digest"), ("operator", "call")}  # fmt: skip
"""Names the standard library gained in 3.11 (What's New in Python 3.11) that a module could reach for."""
NEWER_MODULES = {"tomllib", "wsgiref.types"}
SIBLINGS = {"cluster.py": {"kubeapi"}, "upgrade.py": {"kubeapi"}, "mig_manager.py": {"cluster", "kubeapi"}}
"""Agent modules another one imports; agent_bundle ships them together (tests/components/test_agent_bundle.py)."""


def test_there_are_agent_modules() -> None:
    assert {p.name for p in MODULES} >= {"__init__.py", "cluster.py", "capacity.py"}


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_parses_as_python_310_and_imports_only_the_standard_library(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            allowed = SIBLINGS.get(path.name, set())
            if node.level:  # only the sibling, as part of the package
                assert node.level == 1 and node.module in allowed, f"{path.name}: a relative import of {node.module}"
                continue
            assert node.module, path.name
            if node.module in allowed:  # the same sibling, from the bundle directory on the machine
                continue
            imported.add(node.module)
            used = {(node.module, a.name) for a in node.names}
            assert not used & NEWER, f"{path.name}: {used & NEWER} is Python 3.11+"
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            assert (node.value.id, node.attr) not in NEWER, f"{path.name}: {node.value.id}.{node.attr} is 3.11+"
    top = {name.split(".")[0] for name in imported}
    assert top <= set(sys.stdlib_module_names) | {"__future__"}, (
        f"{path.name} imports {top - set(sys.stdlib_module_names)}"
    )
    assert not imported & NEWER_MODULES, f"{path.name}: {imported & NEWER_MODULES} is Python 3.11+"
    siblings = {p.stem for p in MODULES}
    assert not top & (siblings | {"proxmox_gpu_cluster", "components", "tests"}), f"{path.name} imports the package"


def test_the_checks_catch_newer_syntax_and_names() -> None:
    # The checks above would fail on these: except* (3.11) does not parse as 3.10, datetime.UTC is listed.
    with pytest.raises(SyntaxError):
        ast.parse("try:\n    pass\nexcept* ValueError:\n    pass\n", feature_version=(3, 10))
    assert ("datetime", "UTC") in NEWER and "tomllib" in NEWER_MODULES
