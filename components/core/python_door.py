"""Spec models built from Python: problems named after the objects they are in, and every problem of a block of
constructors at once (``collect_problems``). Pure.

Python evaluates ``ClusterSpec(workers=(Worker(...), Worker(...)))`` inside out, so the first bad constructor
would raise before the others ran and a program with six mistakes would learn of them one run at a time. Inside
``with collect_problems():`` a bad constructor records its problems and hands back a *stand-in* (the model,
unvalidated, marked with its problems) instead of raising; a model given a stand-in reports the stand-in's problems
under its own path and becomes a stand-in itself; leaving the block raises every problem recorded and not reported
through another model, as one ``InvalidSpecModel`` (a ``pulumi.RunError`` too under Pulumi).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic.alias_generators import to_camel

from proxmox_gpu_cluster.core.errors import Problem, invalid_spec_model

STAND_IN = "__pgc_problems__"
"""The attribute a stand-in carries its problems in (paths below the stand-in, in field names)."""

_NAMEABLE = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_]{0,62}")
"""A name shown in a path: one short token (a DNS label or similar); anything else (a hostile value, a dotted
name that would read as a path) is left out rather than echoed."""


@dataclass
class _Block:
    recorded: list[tuple[str, object, tuple[Problem, ...]]] = field(default_factory=list)
    """(model name, stand-in, problems) per bad constructor, in order."""
    reported: set[int] = field(default_factory=set)
    """ids of stand-ins another model reported (their problems are in that model's)."""


_BLOCK: ContextVar[_Block | None] = ContextVar("proxmox_gpu_cluster_collect_problems", default=None)


@contextmanager
def collect_problems() -> Iterator[None]:
    """Build spec models (and component args) inside this block to learn of every mistake at once: a bad
    constructor does not raise but records its problems; leaving the block raises them all, each line naming the
    object (``ClusterSpec.workers[2] (gpu-a10-c).memory_mib: ...``), as one ``InvalidSpecModel``. Build no
    component (``pulumi.ComponentResource``) inside it: a stand-in holds unvalidated values."""
    block = _Block()
    token = _BLOCK.set(block)
    try:
        yield
    finally:
        _BLOCK.reset(token)
    outermost = [(model, problems) for model, obj, problems in block.recorded if id(obj) not in block.reported]
    if outermost:
        model = outermost[0][0] if len({m for m, _ in outermost}) == 1 else ""
        problems = [p if model else Problem(f"{m}.{p.path}" if p.path else m, p.message)
                    for m, ps in outermost for p in ps]  # fmt: skip
        raise invalid_spec_model(model, problems)


def record_stand_in(obj: object, model: str, problems: Sequence[Problem], data: Mapping[str, Any]) -> bool:
    """Inside ``collect_problems``: make ``obj`` (a model whose validation failed) a stand-in holding ``data``
    and ``problems`` and record it; False outside a block (the constructor raises then)."""
    block = _BLOCK.get()
    if block is None:
        return False
    object.__setattr__(obj, "__dict__", dict(data))
    object.__setattr__(obj, "__pydantic_fields_set__", set(data))
    object.__setattr__(obj, "__pydantic_extra__", None)
    object.__setattr__(obj, "__pydantic_private__", None)
    object.__setattr__(obj, STAND_IN, tuple(problems))
    block.recorded.append((model, obj, tuple(problems)))
    return True


def stand_in_problems(value: object) -> tuple[Problem, ...] | None:
    """The problems of a stand-in given to another model (then reported there, not again at the block's end)."""
    problems: tuple[Problem, ...] | None = getattr(value, STAND_IN, None)
    if problems is None:
        return None
    block = _BLOCK.get()
    if block is not None:
        block.reported.add(id(value))
    return problems


def object_name(value: object) -> str | None:
    """The ``name`` of an item (a mapping's ``name`` key or a model's ``name`` attribute), when it is one short
    token worth showing."""
    name = value.get("name") if isinstance(value, Mapping) else getattr(value, "name", None)
    return name if isinstance(name, str) and _NAMEABLE.fullmatch(name) else None


def _child(value: object, key: str) -> object:
    if isinstance(value, Mapping):
        return value.get(key, value.get(to_camel(key)))
    return getattr(value, "__dict__", {}).get(key)


def named_path(path: str, data: object) -> str:
    """``path`` (field names) with each item that has a name followed by it, read from the ``data`` the model was
    given: ``workers[2].memory_mib`` -> ``workers[2] (gpu-a10-c).memory_mib``. Parts ``data`` lacks stay as
    they are."""
    out = ""
    current: object = data
    for token in re.findall(r"\[[^\]]*\]|[^.\[]+", path):
        if token.startswith("["):
            out += token
            index = token[1:-1]
            if index.isdigit() and isinstance(current, Sequence) and not isinstance(current, str):
                current = current[int(index)] if int(index) < len(current) else None
                name = object_name(current)
                out += f" ({name})" if name else ""
            elif isinstance(current, Mapping):
                current = current.get(index.strip("'\""))
            else:
                current = None
            continue
        out += f".{token}" if out else token
        current = _child(current, token) if current is not None else None
    return out
