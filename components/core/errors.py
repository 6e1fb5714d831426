"""Spec problems: collected all at once, each as ``cluster.<path>: message``. Pure."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from proxmox_gpu_cluster.core.quoting import MAX_MESSAGE, MAX_PATH, bounded, shown


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong with a spec."""

    path: str
    """Dotted path below the spec root, e.g. ``workers[1].gpus[0].mig``; empty for the root itself."""
    message: str
    """What is wrong and, where possible, what would be right."""

    def __post_init__(self) -> None:
        # However a rule quoted its input, a line never grows with it (quoting.py).
        object.__setattr__(self, "path", bounded(self.path, MAX_PATH))
        object.__setattr__(self, "message", bounded(self.message, MAX_MESSAGE))

    def render(self, root: str = "cluster") -> str:
        """``root.path: message`` (``path: message`` when the root is empty: the path names its object itself)."""
        where = f"{root}.{self.path}" if self.path and root else self.path or root
        return f"{where}: {self.message}"


class SpecViolations(ValueError):
    """Raised inside pydantic validators to carry several cross-field problems out intact."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(p.render() for p in self.problems))


class SpecError(Exception):
    """The spec is invalid. ``problems`` lists every problem found; str() has one line per problem."""

    def __init__(self, problems: Iterable[Problem], root: str = "cluster") -> None:
        self.problems = tuple(sorted(set(problems), key=_sort_key))
        self.root = root
        super().__init__("\n".join(p.render(root) for p in self.problems))

    @property
    def lines(self) -> list[str]:
        """One rendered line per problem."""
        return [p.render(self.root) for p in self.problems]


def _sort_key(p: Problem) -> tuple[list[tuple[int, str | int]], str]:
    # Natural order, so workers[2] sorts before workers[10] (also when named: ``workers[2] (gpu-a).memory_mib``).
    parts: list[tuple[int, str | int]] = []
    for token in p.path.replace("[", ".[").split("."):
        index = re.match(r"\[([0-9]+)\]", token)
        if index is not None:
            parts.append((0, int(index[1])))
        elif token:
            parts.append((1, token))
    return parts, p.message


def format_loc(loc: Iterable[str | int]) -> str:
    """Render a pydantic location tuple as a config path: ``('workers', 1, 'gpus')`` -> ``workers[1].gpus``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _join(prefix: str, path: str) -> str:
    if not prefix:
        return path
    if not path:
        return prefix
    return f"{prefix}{path}" if path.startswith("[") else f"{prefix}.{path}"


# Pydantic adds the type it tried to the location of union members and tagged values; users never see those
# names in their YAML, so they are dropped from paths.
_INTERNAL_LOC = {"str", "dict[str,int]", "int", "function-after[known_model(), str]", "named", "geometry"}


def error_loc(error: Mapping[str, Any]) -> list[str | int]:
    """The path of one of pydantic's errors without its names for union members and tagged values."""
    return [p for p in error["loc"] if not (isinstance(p, str) and p in _INTERNAL_LOC)]


def problems_from_validation_error(err: ValidationError, *, python: bool = False) -> list[Problem]:
    """Turn a pydantic ValidationError into problems, unpacking carried cross-field problems. ``python``: the
    values came from Python code (field names), not from a stack file (camelCase keys)."""
    problems: list[Problem] = []
    errors = err.errors(include_url=False)
    for e in errors:
        loc = error_loc(e)
        if e["type"] == "too_short" and any(o["loc"][: len(e["loc"])] == e["loc"] and o is not e for o in errors):
            continue  # items that failed themselves make the list look short; their own errors say more
        prefix = format_loc(loc)
        carried = (e.get("ctx") or {}).get("error")
        if isinstance(carried, SpecViolations):
            problems.extend(Problem(_join(prefix, p.path), p.message) for p in carried.problems)
            continue
        message = str(e["msg"]).removeprefix("Value error, ")
        if "[key]" in loc:
            prefix = format_loc(p for p in loc if p != "[key]")
            message = f"key {shown(e['input'])}: {message}"
        if e["type"] == "extra_forbidden":
            message = (
                "unknown field (check the spelling)"
                if python
                else "unknown key (keys are camelCase; check the spelling)"
            )
        elif e["type"] == "missing":
            message = "required field is missing" if python else "required key is missing"
        problems.append(Problem(prefix, message))
    return problems


class InvalidSpecModel(SpecError, ValueError):
    """A spec model built from Python with unusable values: one ``<Model>.<path>: message`` line per problem, paths
    in field names. A ``ValueError`` too, so a model built inside another model's validator reports through it."""


def invalid_spec_model(model: str, problems: Iterable[Problem]) -> InvalidSpecModel:
    """The error to raise for ``model``'s ``problems``: under ``pulumi up`` (the language host imported Pulumi
    before the program) also a ``pulumi.errors.RunError``, which the CLI prints without a traceback. Found without
    importing Pulumi: this layer is pure."""
    pulumi_errors = sys.modules.get("pulumi.errors")
    run_error = getattr(pulumi_errors, "RunError", None)
    if isinstance(run_error, type) and issubclass(run_error, Exception):
        return _with_run_error(run_error)(problems, root=model)
    return InvalidSpecModel(problems, root=model)


_RUN_ERROR_CLASSES: dict[type[Exception], type[InvalidSpecModel]] = {}


def _with_run_error(run_error: type[Exception]) -> type[InvalidSpecModel]:
    # Created once per RunError class, so `except` clauses and identity checks see one class.
    if run_error not in _RUN_ERROR_CLASSES:
        _RUN_ERROR_CLASSES[run_error] = type(
            "InvalidSpecModelRunError", (InvalidSpecModel, run_error), {"__module__": __name__}
        )
    return _RUN_ERROR_CLASSES[run_error]
