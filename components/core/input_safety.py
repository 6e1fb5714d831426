"""Limits on raw input and how problems about it are written, whatever door the input came through. Pure.

A stack file, a Pulumi config value or a dict built in Python can be hostile or broken: nested thousands of levels
deep, expanded by YAML aliases into billions of nodes, or holding control characters that rewrite a terminal when a
message echoes them. These limits are checked before any validation walks the data, and every message line is
escaped before anyone prints it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from proxmox_gpu_cluster.core.errors import Problem, error_loc, format_loc, problems_from_validation_error

MAX_DEPTH = 64
"""Nesting levels of mappings and lists in one input. The deepest spec path needs about ten (config, the spec,
``workers``, a worker, ``gpus``, a GPU, ``mig``...); anything far beyond that is junk, and Python's recursion limit
(which parsers and validators hit at about a thousand levels) is never approached."""
MAX_NODES = 2_000_000
"""Values (scalars, mappings and lists, each counted once per place it appears, aliases expanded) in one input:
ten thousand workers with every option set need about a tenth of this."""


def escape_controls(text: str) -> str:
    """``text`` with every non-printable character (C0/C1 controls, DEL, line and paragraph separators, bidi and
    other format characters) written as a Python escape (``\\x1b``, ``\\u2028``), so a message stays one line and
    a terminal shows what the input held instead of obeying it."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def escape_lines(lines: Iterable[str]) -> list[str]:
    """Each line escaped (``escape_controls``)."""
    return [escape_controls(line) for line in lines]


def budget_problem(data: Any) -> str | None:
    """Why ``data`` (parsed YAML or JSON, or built in Python) is too deep or too large to validate, or None.

    Iterative, and it stops at the first breach: a bomb costs at most ``MAX_NODES`` steps. A structure that
    contains itself (a recursive YAML alias, a list appended to itself) is refused as too deep."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            return f"more than {MAX_NODES} values (YAML aliases count once per use); refusing to read further"
        if isinstance(value, Mapping):
            children = list(value.values())
        elif isinstance(value, (list, tuple)):
            children = list(value)
        else:
            continue
        if depth >= MAX_DEPTH and children:
            return f"nested more than {MAX_DEPTH} levels deep; refusing to read further"
        stack.extend((child, depth + 1) for child in children)
    return None


_NULL_EXPECTS = {
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
    "tuple_type": "a list",
    "list_type": "a list",
    "string_type": "text",
    "int_type": "a whole number",
    "float_type": "a number",
    "bool_type": "true or false",
}


def spec_problems(err: ValidationError, model: type[BaseModel] | None = None) -> list[Problem]:
    """``problems_from_validation_error``, but a key set to ``null`` (YAML's empty value) says so plainly instead
    of naming the Python type pydantic wanted ("Input should be a valid dictionary or instance of GuestSpec"), and,
    given the validated ``model``, whether leaving the key out would do."""
    nulls: dict[str, tuple[set[str], bool | None]] = {}
    for e in err.errors(include_url=False):
        if e.get("input", ...) is None and e["type"] in _NULL_EXPECTS:
            loc = error_loc(e)
            expects, _ = nulls.setdefault(format_loc(loc), (set(), _required(model, loc)))
            expects.add(_NULL_EXPECTS[e["type"]])
    out: list[Problem] = []
    for problem in problems_from_validation_error(err):
        expects, required = nulls.get(problem.path, (set(), None))
        if expects and problem.message.startswith("Input should be"):
            wanted = " or ".join(sorted(expects))
            advice = ", or leave the key out for the default" if required is False else ""
            out.append(Problem(problem.path, f"is empty (null); expected {wanted}{advice}"))
        else:
            out.append(problem)
    return out


def _required(model: type[BaseModel] | None, loc: list[str | int]) -> bool | None:
    """Whether the field at ``loc`` (keys are aliases) of ``model`` is required; None when that cannot be told."""
    current: Any = model
    for i, part in enumerate(loc):
        if isinstance(part, int):
            args = get_args(current)
            current = args[0] if args else None
        else:
            owner = _model_in(current)
            if owner is None:
                return None
            field = next((f for name, f in owner.model_fields.items() if (f.alias or name) == part), None)
            if field is None:
                return None
            if i == len(loc) - 1:
                return field.is_required()
            current = field.annotation
    return None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds (itself, or inside ``X | None`` / ``Annotated``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for arg in get_args(annotation) if (m := _model_in(arg)) is not None), None)
