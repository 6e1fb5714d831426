"""What a shell script looks like on the wire: its code without its comment lines. Pure.

Every step sends its script on stdin, and Pulumi keeps each step's stdin in the stack's state; the comments (a third
of the scripts' text) stay in the repository, where they are read. A line goes only when bash would ignore it
anyway: a full-line comment or a blank line outside a quoted string or a here-document. Kept: the ``#!`` line and
``# shellcheck`` directives (the text as sent is linted too). tests/components/test_shipping.py checks, script by
script, that bash parses the sent text into exactly the code of the file (``declare -f`` of both).
"""

from __future__ import annotations

import re

_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")


def strip_comments(text: str) -> str:
    """``text`` without the full-line comments and blank lines bash ignores."""
    out: list[str] = []
    quote: str | None = None
    heredoc: str | None = None
    for line in text.splitlines():
        if heredoc is not None:
            out.append(line)
            if line.strip() == heredoc:
                heredoc = None
            continue
        bare = line.strip()
        if quote is None and (not bare or (bare.startswith("#") and not bare.startswith(("#!", "# shellcheck")))):
            continue
        out.append(line)
        quote, code = _scan(line, quote)
        match = _HEREDOC.search(code.replace("<<<", "   "))
        if quote is None and match:
            heredoc = match.group(2)
    return "\n".join(out) + "\n"


def _scan(line: str, quote: str | None) -> tuple[str | None, str]:
    """The quote still open at the end of ``line`` (given the one open at its start), and the line's code outside
    quotes and comments."""
    code: list[str] = []
    i = 0
    while i < len(line):
        c = line[i]
        if quote == "'":
            quote = None if c == "'" else quote
        elif quote == '"':
            if c == "\\":
                i += 1
            elif c == '"':
                quote = None
        elif c == "\\":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t;|&("):
            break
        else:
            code.append(c)
        i += 1
    return quote, "".join(code)


def strip_python(text: str) -> str:
    """A Python script without its module docstring, full-line comments and blank lines (a plain text transform,
    the same on every Python version, so two machines planning the same code send the same text). For scripts
    whose only triple-quoted string is the module docstring; tests/components/test_shipping.py checks that the
    result compiles to the same code."""
    lines = text.splitlines()
    if lines and lines[0].startswith('"""'):
        end = next(i for i, line in enumerate(lines) if line.rstrip().endswith('"""') and (i or line.count('"""') == 2))
        lines = lines[end + 1 :]
    return "\n".join(line for line in lines if line.strip() and not line.lstrip().startswith("#")) + "\n"
