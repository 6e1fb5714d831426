"""How a plan diff shows a changed input: ``path: old → new``, long or multi-line text as a bounded unified diff of
its lines, and a secret only as whether it changed. Pure (plain values in, lines of text out).

A reviewer reads these lines in a terminal and in a pull-request comment, and a stack value can hold anything: every
control, format (bidirectional overrides) and line-separator character is shown escaped, so a value can neither
fake another line of the diff nor hide text.

Secrets: the plan document shows a secret as ``[secret]``, or, when the plans of one diff were made with a shared
random key (``PGC_SECRET_DIGEST_KEY``, see ``digest_key_from_env``), as ``[secret:<hex>]``: a keyed fingerprint
(``recording.redact``) that says whether the value changed and nothing else. A diff never claims an unfingerprinted
secret unchanged.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import secrets
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from proxmox_gpu_cluster.core.input_safety import escape_controls
from proxmox_gpu_cluster.render.agent_bundle import LAUNCHER

SECRET_KEY_ENV = "PGC_SECRET_DIGEST_KEY"  # noqa: S105 (the variable's name, not a key)
"""Environment variable with the hex key both plans of a diff fingerprint their secrets with."""

MISSING: Any = type("Missing", (), {"__repr__": lambda self: "(none)"})()
"""An input absent on one side of a change (shown ``(none)``; distinct from a JSON null)."""

INLINE = 120
"""Longest value shown inline; a longer one (or any multi-line text) is shown as a diff of its lines."""
DIFF_LINES = 40
"""Most lines of one value's unified diff; the rest is counted, not shown."""
_FINGERPRINT = re.compile(r"\[secret:[0-9a-f]+\]")


def digest_key_from_env(environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The diff's secret-fingerprint key from ``PGC_SECRET_DIGEST_KEY`` (hex), or None when unset. A value that is
    not hex or shorter than 16 bytes raises ValueError (naming the variable, never echoing its value)."""
    raw = environ.get(SECRET_KEY_ENV, "").strip()
    if not raw:
        return None
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        raise ValueError(f"{SECRET_KEY_ENV} must be hex (e.g. from `openssl rand -hex 32`)") from None
    if len(key) < 16:
        raise ValueError(f"{SECRET_KEY_ENV} must hold at least 16 bytes (32 hex digits)")
    return key


def new_digest_key() -> bytes:
    """A random key for one diff: used for both plans, then forgotten."""
    return secrets.token_bytes(32)


def is_secret(value: Any) -> bool:
    """Whether a redacted plan value is a secret (``[secret]`` or its fingerprint)."""
    return isinstance(value, str) and (value == "[secret]" or _FINGERPRINT.fullmatch(value) is not None)


def show(value: Any) -> str:
    """One value on one line: JSON scalars, a mapping or list as compact JSON, escaped, cut after ``INLINE``."""
    if value is MISSING:
        return "(none)"
    if value == "[unknown]":  # an output of another resource the mock engine cannot know (pulumi preview: output<…>)
        return "(known after apply)"
    text = escape_controls(json.dumps(value, sort_keys=True, separators=(", ", ": "), ensure_ascii=False, default=str))
    return text if len(text) <= INLINE else f"{text[:INLINE]}… ({len(text) - INLINE} more chars)"


def _lines(value: Any) -> list[str]:
    if value is MISSING:
        return []
    if isinstance(value, str):  # only "\n" breaks a line: any other separator is shown escaped
        return value.removesuffix("\n").split("\n")
    return json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False, default=str).splitlines()


def _long(value: Any) -> bool:
    if isinstance(value, str):
        return "\n" in value.rstrip("\n") or len(value) > INLINE
    return isinstance(value, (Mapping, list)) and len(show(value)) > INLINE


def secret_line(path: str, old: Any, new: Any) -> str | None:
    """The line for a secret input, or None when neither side is one. Only two fingerprints made under one key
    tell whether it changed; with ``[secret]`` (a plan without a key, e.g. an older revision's) it may have."""
    if not (is_secret(old) or is_secret(new)):
        return None
    if old is MISSING or new is MISSING:
        return f"{path}: {'added' if old is MISSING else 'removed'} (secret)"
    if _FINGERPRINT.fullmatch(str(old)) and _FINGERPRINT.fullmatch(str(new)):
        return f"{path}: changed (secret)"
    return f"{path}: may have changed (secret; not fingerprinted)"


_QUOTED_LAUNCHER = shlex.quote(LAUNCHER)
LAUNCHER_SHOWN = "<agent launcher>"
"""How a step command's launcher (``agent_bundle.LAUNCHER``, about 700 characters of shell) reads in a diff."""


def _abbreviated(value: Any) -> Any:
    """``value`` with this revision's agent launcher shown as ``LAUNCHER_SHOWN``; another revision's launcher stays
    whole, so a changed launcher still shows as a change."""
    return value.replace(_QUOTED_LAUNCHER, LAUNCHER_SHOWN) if isinstance(value, str) else value


def value_lines(path: str, old: Any, new: Any) -> list[str]:
    """What changed at ``path``: ``path: old → new`` on one line, or for long or multi-line values ``path:``
    followed by a unified diff of their lines (at most ``DIFF_LINES``, the rest counted). A secret: ``secret_line``."""
    secret = secret_line(path, old, new)
    if secret is not None:
        return [secret]
    old, new = _abbreviated(old), _abbreviated(new)
    if not (_long(old) or _long(new)):
        return [f"{path}: {show(old)} → {show(new)}"]
    before, after = _lines(old), _lines(new)
    diff = list(difflib.unified_diff(before, after, lineterm="", n=1))[2:]  # no ---/+++ header
    if len(before) <= 1 and len(after) <= 1:
        diff = diff[1:]  # one line each: the @@ hunk header says nothing
    shown = [f"  {escape_controls(line)}" for line in diff[:DIFF_LINES]]
    cut = len(diff) - len(shown)
    return [f"{path}:", *shown, *([f"  … {cut} more diff lines cut"] if cut else [])]


def reason_note(paths: Sequence[str], secret_paths: Sequence[str], bundle: str) -> str:
    """Why a resource's secret input changed, in non-secret terms: its node-agent bundle, or its other changed
    inputs (empty when nothing else changed)."""
    if bundle:
        return f"with the node agent's {bundle}"
    others = [p for p in paths if p not in secret_paths]
    return f"with {', '.join(others)}" if others else ""
