"""Stack files as YAML, read defensively: every problem is one line ``FILE:LINE: what`` and nothing hangs.

``yaml.safe_load`` happily builds a billion-node structure from a few lines of aliases (the "billion laughs"),
recurses into deeply nested junk until Python's recursion limit, lets a repeated key silently win, and reports a
syntax error over four lines. Here the document is first streamed as parser events (libyaml when installed) under
a budget on nesting depth, aliases and the values they expand to, before anything is built; then it is built with a
loader that refuses duplicate keys and absurdly long numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode

from proxmox_gpu_cluster.core.input_safety import MAX_DEPTH, MAX_NODES, escape_controls

MAX_BYTES = 8 * 1024 * 1024
"""A stack file of ten thousand workers is a few MiB; more is not a stack file."""
MAX_ALIASES = 10_000
"""Alias uses (``*name``) in one document."""
MAX_INT_DIGITS = 40
"""Digits of one YAML integer: every bound in the spec has fewer than ten; Python refuses to parse over 4300."""

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StackYamlError(ValueError):
    """The text is not a usable YAML document; ``line`` is the one-line message."""

    def __init__(self, line: str) -> None:
        self.line = escape_controls(line)
        super().__init__(self.line)


class _StrictLoader(_Loader):  # type: ignore[valid-type,misc]
    """SafeLoader (libyaml's when available) that refuses duplicate keys and over-long integers."""

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # merge keys (<<) are meant to be overridden; complex keys fail on their own
                key = self.construct_object(key_node)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first at line {first + 1}); YAML would silently keep only the last",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


def _construct_int(loader: yaml.SafeLoader, node: ScalarNode) -> Any:
    digits = sum(ch.isdigit() for ch in str(node.value))
    if digits > MAX_INT_DIGITS:
        raise yaml.constructor.ConstructorError(
            None, None, f"a number with {digits} digits is beyond every bound", node.start_mark
        )
    return yaml.SafeLoader.construct_yaml_int(loader, node)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def read_capped(path: Path) -> bytes:
    """The first ``MAX_BYTES + 1`` bytes of ``path``: enough for ``load_stack_yaml`` to refuse a larger file, and
    ``/dev/zero`` or a runaway file never fills memory. OSError as ``open`` raises it."""
    with path.open("rb") as file:
        return file.read(MAX_BYTES + 1)


def load_stack_yaml(data: bytes | str, origin: str) -> Any:
    """The one YAML document in ``data`` (bytes must be UTF-8), or StackYamlError ``origin:LINE: problem``."""
    if len(data) > MAX_BYTES:
        raise StackYamlError(f"{origin}: larger than {MAX_BYTES} bytes; not a stack file")
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            line = data[: err.start].count(b"\n") + 1
            column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
            raise StackYamlError(
                f"{origin}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x} at column {column}); "
                "save the file as UTF-8"
            ) from None
    else:
        text = data
    try:
        _check_budget(text, origin)
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as err:
        raise StackYamlError(_marked(err, origin, text)) from None
    except yaml.reader.ReaderError as err:
        line = text[: err.position].count("\n") + 1
        code = err.character if isinstance(err.character, int) else ord(err.character)
        raise StackYamlError(f"{origin}:{line}: control character #x{code:04x} is not allowed in YAML text") from None
    except yaml.YAMLError as err:
        raise StackYamlError(f"{origin}: {' '.join(str(err).split())}") from None


def _marked(err: yaml.MarkedYAMLError, origin: str, text: str) -> str:
    """One line from PyYAML's four: where, and the problem (with its context when that says more)."""
    mark = err.problem_mark or err.context_mark
    where = f"{origin}:{mark.line + 1}" if mark is not None else origin
    problem = err.problem or "invalid YAML"
    if mark is not None and _tab_at(text, mark.line, mark.column):
        return f"{where}: a tab character in the indentation; YAML indents with spaces only"
    context = f"{err.context} (line {err.context_mark.line + 1}), " if err.context and err.context_mark else ""
    column = f" (column {mark.column + 1})" if mark is not None else ""
    return f"{where}: {context}{problem}{column}"


def _tab_at(text: str, line: int, column: int) -> bool:
    """Whether the error at ``line``/``column`` is a tab: the character itself, or in the line's indentation."""
    lines = text.splitlines()
    if line >= len(lines):
        return False
    row = lines[line]
    indent = row[: len(row) - len(row.lstrip(" \t"))]
    return row[column : column + 1] == "\t" or (column <= len(indent) and "\t" in indent)


def _check_budget(text: str, origin: str) -> None:
    """Stream the parser events and stop at the first breach of the depth, alias or expanded-size budget."""

    def fail(event: Any, what: str) -> StackYamlError:
        return StackYamlError(f"{origin}:{event.start_mark.line + 1}: {what}")

    try:
        _walk_budget(yaml.parse(text, Loader=_Loader), fail)
    except yaml.MarkedYAMLError as err:
        # The libyaml bundled with PyYAML 6.0.4 refuses more than 1000 nested flow levels in its scanner ("while
        # increasing flow level ... exceeded maximum nesting depth"; measured: 1000 parse, 1001 fail). The scanner reads
        # up to 1024 characters ahead for a possible simple key, so "[[[[..." fails there before this walk sees level
        # MAX_DEPTH + 1: the same refusal, so it gets the same words whichever PyYAML is installed.
        if "nesting depth" not in (err.problem or "") or err.problem_mark is None:
            raise
        line = err.problem_mark.line + 1
        raise StackYamlError(
            f"{origin}:{line}: nested more than {MAX_DEPTH} levels deep; refusing to read further"
        ) from None


def _walk_budget(events: Any, fail: Any) -> None:
    """Count depth, aliases and expanded values over the parser events; ``fail`` builds the error to raise."""
    depth = nodes = aliases = 0
    expanded: dict[str, int] = {}  # anchor -> values its node expands to
    open_nodes: list[tuple[str | None, int]] = []  # (anchor, value count at its start) of open collections
    for event in events:
        if isinstance(event, AliasEvent):
            aliases += 1
            if any(anchor == event.anchor for anchor, _ in open_nodes):
                raise fail(event, f"alias *{event.anchor} refers to a node that contains it (recursive)")
            nodes += expanded.get(event.anchor or "", 1)
            if aliases > MAX_ALIASES:
                raise fail(event, f"more than {MAX_ALIASES} aliases; refusing to read further")
        elif isinstance(event, ScalarEvent):
            nodes += 1
            if event.anchor is not None:
                expanded[event.anchor] = 1
        elif isinstance(event, CollectionStartEvent):
            depth += 1
            nodes += 1
            if depth > MAX_DEPTH:
                raise fail(event, f"nested more than {MAX_DEPTH} levels deep; refusing to read further")
            open_nodes.append((event.anchor, nodes))
        elif isinstance(event, CollectionEndEvent):
            depth -= 1
            anchor, start = open_nodes.pop()
            if anchor is not None:
                expanded[anchor] = nodes - start + 1
        if nodes > MAX_NODES:
            raise fail(event, f"expands to more than {MAX_NODES} values (aliases count once per use); refusing")
