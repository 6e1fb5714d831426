"""The reference of every component (``docs/components.md``): arguments, defaults, descriptions and outputs.

    python -m proxmox_gpu_cluster.stacks.component_reference --write docs/components.md
    python -m proxmox_gpu_cluster.stacks.component_reference --check docs/components.md   # exit 1 when stale

Read from the source, not from runtime type hints (forward references and ``TYPE_CHECKING`` imports would break
those): each ``pulumi.ComponentResource`` subclass of the package with its ``__init__`` parameters (the annotation
and default as the source writes them), the descriptions its ``__init__`` docstring gives in the project's
``name``: description sentences (a parameter the docstring does not describe has no description), its annotated
attributes with their attribute docstrings, and the fields of every spec model or dataclass an argument's type
names (pydantic field descriptions, or attribute docstrings). A test fails when the committed file is not what this
renders, and checks every component, parameter and output against the classes themselves.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import importlib
import inspect
import pkgutil
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

import proxmox_gpu_cluster
from proxmox_gpu_cluster.stacks.component_examples import EXAMPLES, UNIT_TEST
from proxmox_gpu_cluster.stacks.reference import cell, spec_models

PACKAGE = "proxmox_gpu_cluster"
LAYERS = ("proxmox", "guest", "gpu", "cluster")
"""Sections in the order a cluster is built (README, "How the pieces fit"); other modules come after, by name."""
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
MARKER = re.compile(rf"(?:^|(?<=\. ))((?:``{IDENT}``/)*``{IDENT}``): ")
"""Where a parameter's description starts: ``name``: (or ``a``/``b``:) at the start of a sentence."""


@dataclass(frozen=True)
class Param:
    name: str
    annotation: str
    default: str | None  # None: required
    keyword_only: bool
    description: str
    names: tuple[str, ...]  # identifiers the annotation uses (to link the models it names)


@dataclass(frozen=True)
class Output:
    name: str
    annotation: str
    description: str


@dataclass(frozen=True)
class Component:
    cls: type
    type_token: str
    doc: str
    notes: str
    params: tuple[Param, ...]
    outputs: tuple[Output, ...]


def component_classes() -> list[type]:
    """Every ComponentResource subclass the package defines, in layer order, then module name and source line."""
    found: list[type] = []
    for info in sorted(pkgutil.walk_packages(proxmox_gpu_cluster.__path__, f"{PACKAGE}."), key=lambda i: i.name):
        module = importlib.import_module(info.name)
        found += [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == info.name
                  and issubclass(v, pulumi.ComponentResource)]  # fmt: skip

    def order(cls: type) -> tuple[int, str, int]:
        layer = cls.__module__.split(".")[1]
        rank = LAYERS.index(layer) if layer in LAYERS else len(LAYERS)
        return rank, cls.__module__, _class_node(cls).lineno

    return sorted(found, key=order)


@functools.cache
def _module_tree(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text())


def _class_node(cls: type) -> ast.ClassDef:
    tree = _module_tree(inspect.getfile(cls))
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    return node


def _text(doc: str | None) -> str:
    """A docstring as one line of Markdown (whitespace collapsed; the project's ``code`` renders as code)."""
    return " ".join(inspect.cleandoc(doc).split()) if doc else ""


def _paragraphs(doc: str | None) -> list[str]:
    return [" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n")] if doc else []


def _names(node: ast.expr | None) -> tuple[str, ...]:
    if node is None:
        return ()
    found = [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]
    found += [n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)]
    return tuple(dict.fromkeys(found))


def param_descriptions(doc: str | None, params: list[str]) -> tuple[str, dict[str, str]]:
    """Split an ``__init__`` docstring into general notes and one description per parameter it names.

    A description runs from ``name``: at the start of a sentence to the next such marker; ``a``/``b``: describes
    both. Text before the first marker is the notes. Markers naming anything but parameters are ordinary text.
    """
    text = _text(doc)
    marks = [m for m in MARKER.finditer(text) if all(n.strip("`") in params for n in m.group(1).split("/"))]
    notes = text[: marks[0].start()].strip() if marks else text
    described: dict[str, str] = {}
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        for name in (n.strip("`") for n in mark.group(1).split("/")):
            described[name] = f"{described[name]} {text[mark.end() : end].strip()}".strip() if name in described \
                else text[mark.end() : end].strip()  # fmt: skip
    return notes, described


def _type_token(init: ast.FunctionDef) -> str:
    """The resource type ``super().__init__(...)`` registers (its first argument)."""
    for node in ast.walk(init):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                return first.value
    return ""


def _attributes(body: list[ast.stmt]) -> list[tuple[ast.AnnAssign, str, str]]:
    """Annotated public attributes of a class body: (node, name, the docstring right below it as one line)."""
    found = []
    for i, item in enumerate(body):
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and not item.target.id.startswith("_"):
            after = body[i + 1] if i + 1 < len(body) else None
            doc = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else None
            found.append((item, item.target.id, _text(doc) if isinstance(doc, str) else ""))
    return found


def read_component(cls: type) -> Component:
    node = _class_node(cls)
    (init,) = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    args = init.args
    positional = [*args.posonlyargs, *args.args][1:]  # without self
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    pairs = [(a, d, False) for a, d in zip(positional, defaults, strict=True)]
    pairs += [(a, d, True) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    notes, described = param_descriptions(ast.get_docstring(init), [a.arg for a, _, _ in pairs])
    params = tuple(
        Param(a.arg, ast.unparse(a.annotation) if a.annotation else "", None if d is None else ast.unparse(d), kw,
              described.get(a.arg, ""), _names(a.annotation))
        for a, d, kw in pairs
    )  # fmt: skip
    outputs = tuple(Output(name, ast.unparse(item.annotation), doc) for item, name, doc in _attributes(node.body))
    # The class docstring line by line: its numbered lists stay lists (continuation lines indent 3, never 4).
    doc = "\n".join(line.rstrip() for line in inspect.cleandoc(ast.get_docstring(node) or "").splitlines())
    return Component(cls, _type_token(init), doc, notes, params, outputs)


# --- argument types: spec models and dataclasses --------------------------------------------------------------


def _documented(value: Any) -> bool:
    return (isinstance(value, type) and value.__module__.startswith(f"{PACKAGE}.")
            and (issubclass(value, BaseModel) or dataclasses.is_dataclass(value)))  # fmt: skip


def _resolve(names: tuple[str, ...], module: str) -> list[type]:
    namespace = vars(sys.modules[module])
    return [namespace[n] for n in names if _documented(namespace.get(n))]


def _strip_annotated(node: ast.expr) -> ast.expr:
    """``Annotated[X, ...]`` -> ``X`` anywhere in a field's type: constraints belong to validation, not the type."""

    class Strip(ast.NodeTransformer):
        def visit_Subscript(self, sub: ast.Subscript) -> ast.AST:
            if isinstance(sub.value, ast.Name) and sub.value.id == "Annotated" and isinstance(sub.slice, ast.Tuple):
                inner: ast.AST = self.visit(sub.slice.elts[0])
                return inner
            self.generic_visit(sub)
            return sub

    stripped = Strip().visit(ast.parse(ast.unparse(node), mode="eval").body)  # a copy: the cached tree stays intact
    assert isinstance(stripped, ast.expr)
    return stripped


def _field_nodes(cls: type) -> dict[str, tuple[ast.expr, str, str]]:
    """Field name -> (annotation, attribute docstring, defining module), the nearest class of the MRO first."""
    found: dict[str, tuple[ast.expr, str, str]] = {}
    for base in cls.__mro__:
        if not base.__module__.startswith(f"{PACKAGE}."):
            continue
        for item, name, doc in _attributes(_class_node(base).body):
            found.setdefault(name, (item.annotation, doc, base.__module__))
    return found


def _factory(factory: Any) -> str:
    if factory in (dict, list, tuple):
        return f"`{factory()!r}`"
    return f"`{factory.__name__}()`" if isinstance(factory, type) else "(computed)"


def model_rows(cls: type) -> list[tuple[str, str, str, str, list[type]]]:
    """(field, type, default, description, models the type names) for a spec model's or dataclass's fields."""
    nodes = _field_nodes(cls)
    rows = []
    if issubclass(cls, BaseModel):
        for name, info in cls.model_fields.items():
            annotation, doc, module = nodes[name]
            if info.default is not PydanticUndefined:
                default = f"`{info.default!r}`"
            else:
                default = "required" if info.default_factory is None else _factory(info.default_factory)
            stripped = _strip_annotated(annotation)
            rows.append((name, ast.unparse(stripped), default, info.description or doc,
                         _resolve(_names(stripped), module)))  # fmt: skip
    elif dataclasses.is_dataclass(cls):
        for field in dataclasses.fields(cls):
            if not field.init:
                continue
            annotation, doc, module = nodes[field.name]
            if field.default is not dataclasses.MISSING:
                default = f"`{field.default!r}`"
            else:
                default = (
                    "required" if field.default_factory is dataclasses.MISSING else _factory(field.default_factory)
                )
            rows.append((field.name, ast.unparse(annotation), default, doc, _resolve(_names(annotation), module)))
    return rows


# --- Markdown -------------------------------------------------------------------------------------------------


def _code(text: str) -> str:
    return f"`{cell(text)}`" if text else ""


def _links(models: list[type]) -> str:
    return "".join(f" → [{m.__name__}](#{m.__name__.lower()})" for m in dict.fromkeys(models))


def _signature(component: Component) -> str:
    parts, star = [], False
    for p in component.params:
        if p.keyword_only and not star:
            parts.append("*")
            star = True
        parts.append(p.name if p.default is None else f"{p.name}={p.default}")
    return f"{component.cls.__name__}({', '.join(parts)})"


UNIT_TEST_INTRO = (
    "The components work under `pulumi.runtime.set_mocks` as Pulumi's testing guide writes mocks (inputs echoed"
    " back, every call answered `{}`), with preview on and off: the IOMMU preflight then checks each node as its"
    " spec describes it. `proxmox_gpu_cluster.testing.run` records a whole program instead, and"
    " `proxmox_gpu_cluster.testing_pci.pci_invokes` answers the PCI lookup from a host's real device list (the"
    " provider's field names or the Proxmox API's, `iommugroup` and all). A test module of one's own:"
)


def render_components() -> str:
    components = [read_component(cls) for cls in component_classes()]
    models: list[type] = []
    todo = [m for c in components for p in c.params for m in _resolve(p.names, c.cls.__module__)]
    while todo:
        model = todo.pop(0)
        if model not in models:
            models.append(model)
            todo += [m for row in model_rows(model) for m in row[4]]
    models.sort(key=lambda m: (m.__name__, m.__module__))
    anchors = [c.cls.__name__.lower() for c in components] + [m.__name__.lower() for m in models]
    if len(set(anchors)) != len(anchors):
        raise ValueError(f"two headings share an anchor: {sorted(a for a in anchors if anchors.count(a) > 1)}")
    in_spec = set(spec_models())
    lines = [
        "# Component reference",
        "",
        "Generated from the components' source by `python -m proxmox_gpu_cluster.stacks.component_reference",
        "--write docs/components.md`; do not edit by hand (a test fails when it is stale). Types and defaults are",
        "as the source writes them; a description comes from the `__init__` docstring, and an argument it does not",
        "describe has none here. `name` is the component's Pulumi resource name and `opts` its resource options.",
        "Outputs are the component's annotated attributes. Argument types the package defines (spec models,",
        "dataclasses) are listed under [Argument types](#argument-types).",
        "",
        "A component's example is a complete program: `python -m proxmox_gpu_cluster.plan <stack>` plans it",
        "offline, and a test runs each as written here (under the plan's mock engine and under",
        "`pulumi.runtime.set_mocks`). Specs and args built in Python are checked as the stack file is: inside",
        "`with collect_problems():` (`proxmox_gpu_cluster.core.python_door`) every mistake of the block comes at",
        "once, each line naming its object (`ClusterSpec.workers[2] (gpu-a10-c).memory_mib: ...`).",
        "",
    ]
    lines += [f"- [{c.cls.__name__}](#{c.cls.__name__.lower()}) (`{c.cls.__module__}`)" for c in components]
    lines += ["- [Unit tests with Pulumi mocks](#unit-tests-with-pulumi-mocks)"]
    for c in components:
        lines += ["", f"## {c.cls.__name__}", "", f"`from {c.cls.__module__} import {c.cls.__name__}`"]
        if c.type_token:
            lines[-1] += f" · Pulumi type `{c.type_token}`"
        lines += ["", "```python", _signature(c), "```"]
        lines += [line for paragraph in c.doc.split("\n\n") if paragraph for line in ("", paragraph)]
        if c.notes:
            lines += ["", c.notes]
        lines += ["", "| argument | type | default | description |", "|---|---|---|---|"]
        for p in c.params:
            links = _links(_resolve(p.names, c.cls.__module__))
            default = "required" if p.default is None else _code(p.default)
            lines.append(f"| `{p.name}` | {_code(p.annotation)}{links} | {default} | {cell(p.description)} |")
        if c.outputs:
            lines += ["", "| output | type | description |", "|---|---|---|"]
            lines += [f"| `{o.name}` | {_code(o.annotation)} | {cell(o.description)} |" for o in c.outputs]
        example = EXAMPLES.get(c.cls.__name__)
        if example:
            lines += ["", "Example, a complete program:", "", "```python", example.rstrip("\n"), "```"]
    lines += [
        "",
        "## Unit tests with Pulumi mocks",
        "",
        UNIT_TEST_INTRO,
        "",
        "```python",
        UNIT_TEST.rstrip("\n"),
        "```",
    ]
    lines += ["", "## Argument types", "", "The package's own types that the arguments above name, with their"
              " fields as Python sees them (spec models take field names in Python; stack files use the camelCase"
              " keys of [the spec reference](spec.md))."]  # fmt: skip
    for model in models:
        kind = "spec model" if issubclass(model, BaseModel) else "dataclass"
        lines += ["", f"### {model.__name__}", "", f"`from {model.__module__} import {model.__name__}` ({kind})"]
        if model in in_spec:
            lines[-1] += f" · stack-file keys: [spec reference](spec.md#{model.__name__.lower()})"
        summary = _paragraphs(model.__doc__)
        if summary and not summary[0].startswith(f"{model.__name__}("):  # a dataclass's generated signature
            lines += ["", summary[0]]
        lines += ["", "| field | type | default | description |", "|---|---|---|---|"]
        for name, annotation, default, description, named in model_rows(model):
            lines.append(f"| `{name}` | {_code(annotation)}{_links(named)} | {cell(default)} | {cell(description)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--write", metavar="FILE", type=Path, help="write the reference to FILE")
    target.add_argument("--check", metavar="FILE", type=Path, help="exit 1 when FILE is not the current reference")
    args = parser.parse_args(argv)
    text = render_components()
    if args.write:
        args.write.write_text(text)
    elif args.check:
        current = args.check.is_file() and args.check.read_text() == text
        if not current:
            sys.stderr.write(f"{args.check} is stale: python -m {__spec__.name} --write {args.check}\n")
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
