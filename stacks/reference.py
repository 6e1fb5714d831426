"""The field reference of the cluster spec (``docs/spec.md``), generated from the models' field descriptions.

    python -m proxmox_gpu_cluster.stacks.reference > docs/spec.md

A test fails when the committed file is not what this prints, so the reference never drifts from the code.
"""

from __future__ import annotations

import sys
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from proxmox_gpu_cluster.core.nodes import ExistingGpuNode
from proxmox_gpu_cluster.core.spec import ClusterSpec


def _models(annotation: Any) -> list[type[BaseModel]]:
    """Spec models inside a field's type (through Optional, tuples, dicts, unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _type_name(annotation: Any) -> str:  # noqa: PLR0911 (one return per kind of type reads best)
    """A reader's name for a field type: Annotated constraints dropped, unions as ``a or b``, models linked."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(dict.fromkeys(names)) + (" (optional)" if type(None) in args else "")
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is tuple:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map {_type_name(args[0])} -> {_type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    if isinstance(annotation, type):
        return {"str": "text", "int": "integer", "bool": "boolean", "float": "number"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation)


def _default(field: FieldInfo) -> str:
    if field.default is PydanticUndefined:
        return "required" if field.default_factory is None else "(computed)"
    value = field.default
    if isinstance(value, BaseModel) or value in ((), {}, None):
        return "" if value is None else "(empty)"
    return f"`{value}`"


def cell(text: str) -> str:
    """``text`` as one Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def spec_models() -> list[type[BaseModel]]:
    """Every model reachable from ``ClusterSpec`` (and ``ExistingGpuNode``) through its fields, in first-seen order:
    the models this reference documents."""
    seen: list[type[BaseModel]] = []
    todo: list[type[BaseModel]] = [ClusterSpec, ExistingGpuNode]
    while todo:
        model = todo.pop(0)
        if model in seen:
            continue
        seen.append(model)
        todo += [m for field in model.model_fields.values() for m in _models(field.annotation) if m not in seen]
    return seen


def render_reference() -> str:
    """Markdown: one table per model, reachable from ``ClusterSpec`` (and ``ExistingGpuNode``), in first-seen order."""
    lines = [
        "# Spec reference",
        "",
        "Generated from the models' field descriptions by `python -m proxmox_gpu_cluster.stacks.reference`; do",
        "not edit by hand. Keys are camelCase in stack files (`proxmox-gpu-cluster:cluster`).",
    ]
    for model in spec_models():
        doc = (model.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        lines += ["", f"## {model.__name__}", "", doc, "", "| key | type | default | description |"]
        lines.append("|---|---|---|---|")
        for name, field in model.model_fields.items():
            key = field.alias or name
            lines.append(
                f"| `{key}` | {_type_name(field.annotation)} | {cell(_default(field))} "
                f"| {cell(field.description or '')} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_reference())
