"""Scripts as sent: without their comment lines, and parsed by bash into exactly the code of the file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from proxmox_gpu_cluster.render.host_scripts import script
from proxmox_gpu_cluster.render.shipping import strip_comments
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
