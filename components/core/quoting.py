"""How a message quotes input: never whole when it is huge. Pure; imports nothing of the project.

A value can be any length (a stack file of megabytes, a string built in Python); a message that echoes it whole
floods a terminal, a CI log or a pull-request comment with one line. Messages quote with ``shown``, and every
problem's path and message are ``bounded`` (``errors.Problem``), so no line grows with its input.
"""

from __future__ import annotations

LINE_BREAKERS = "\x00-\x1f\x7f-\x9f\u2028\u2029"
"""A regex character-class body: C0 and C1 control characters, DEL, and the Unicode line and paragraph separators
that YAML and terminals treat as line breaks (U+0085 NEL is C1). One-line text never holds them."""

MAX_SHOWN = 80
"""Characters of a value a message quotes; the longest legitimate values quoted (a PCI path, an address, a model
key, a MIG config name) are far shorter."""
MAX_MESSAGE = 2000
"""Characters of a problem's message: the longest messages list known values (the GPU catalog, about 600)."""
MAX_PATH = 400
"""Characters of a problem's path: ten levels of names and indices need about a hundred."""


def shown(value: object, limit: int = MAX_SHOWN) -> str:
    """``repr(value)`` as a message quotes it: at most ``limit`` characters of a string, then how long it was."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def bounded(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"
