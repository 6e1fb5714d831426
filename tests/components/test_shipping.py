"""Scripts as sent: without their comment lines, and parsed by bash into exactly the code of the file."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from proxmox_gpu_cluster.render.host_scripts import script
from proxmox_gpu_cluster.render.shipping import strip_comments, strip_python
from tests.components.scripts.fakeroot import SCRIPTS
from tests.support import external

SHELL = sorted(SCRIPTS.glob("*.sh"))


def parsed(text: str) -> str:
    """bash's own rendering of ``text`` as one function body: code and strings, no comments."""
    bash = external(Path("/bin/bash"), "bash", "install it with: apt-get install bash")
    body = text.replace('\nmain "$@" </dev/null\n', "\n")
    proc = subprocess.run(
        [str(bash), "-c", 'eval "__pgc() {\n$1\n}" && declare -f __pgc', "-", body],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("path", SHELL, ids=lambda p: p.name)
def test_the_sent_text_is_the_same_code(path: Path) -> None:
    original = path.read_text()
    sent = script(path.name)
    assert sent == strip_comments(original)
    assert parsed(sent) == parsed(original)
    assert len(sent) < len(original)


def test_strings_heredocs_and_directives_stay() -> None:
    text = (
        "#!/usr/bin/env bash\n# a comment\n\n"
        'put x "# Managed by us\n# still the string\nend"\n'
        "# shellcheck disable=SC2034\n"
        "cat <<EOF\n# heredoc line\nEOF\n"
        "echo 'a # not a comment' # a trailing comment stays with its line\n"
        "  # an indented comment\n"
    )
    assert strip_comments(text) == (
        "#!/usr/bin/env bash\n"
        'put x "# Managed by us\n# still the string\nend"\n'
        "# shellcheck disable=SC2034\n"
        "cat <<EOF\n# heredoc line\nEOF\n"
        "echo 'a # not a comment' # a trailing comment stays with its line\n"
    )


def test_the_check_would_catch_a_line_lost_from_a_string() -> None:
    text = 'put x "first\n# inside\nlast"\n'
    assert parsed(text) != parsed('put x "first\nlast"\n')


def _code(tree: ast.Module) -> str:
    """The module's code without its docstring, as the AST sees it."""
    body = tree.body[1:] if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(
        tree.body[0].value, ast.Constant) else tree.body  # fmt: skip
    return ast.dump(ast.Module(body=body, type_ignores=[]))


@pytest.mark.parametrize(
    "path", sorted(p for p in SCRIPTS.glob("*.py") if p.name != "__init__.py"), ids=lambda p: p.name
)
def test_python_as_sent_is_the_same_code_without_docstring_and_comments(path: Path) -> None:
    sent = script(path.name)
    assert _code(ast.parse(sent)) == _code(ast.parse(path.read_text()))
    assert '"""' not in sent.splitlines()[0] and not any(line.lstrip().startswith("#") for line in sent.splitlines())
    assert len(sent) < len(path.read_text())


def test_strip_python_keeps_code_that_looks_like_a_comment_inside_a_string() -> None:
    text = '"""Doc.\n\nMore doc.\n"""\n# a comment\nx = "# not a comment"\n\ny = 1  # trailing\n'
    assert strip_python(text) == 'x = "# not a comment"\ny = 1  # trailing\n'
    assert strip_python('"""One line."""\nz = 2\n') == "z = 2\n"
