"""docs/components.md is generated from the components' source and must be current; every component, argument and
output is in it as the classes themselves have them (checked here through ``inspect`` and the runtime, not through
the generator's own source reading)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import textwrap
from pathlib import Path

import pulumi
import pytest
from pydantic import BaseModel

import proxmox_gpu_cluster
from proxmox_gpu_cluster.stacks.component_reference import main, param_descriptions, render_components
from tests.support import ROOT

REGENERATE = "regenerate: python -m proxmox_gpu_cluster.stacks.component_reference --write docs/components.md"
CELL = re.compile(r"(?<!\\) \| ")  # a table cell boundary (not an escaped pipe inside a type)


@pytest.fixture(scope="module")
def rendered() -> str:
    return render_components()


def components() -> list[type]:
    found = []
    for info in pkgutil.walk_packages(proxmox_gpu_cluster.__path__, "proxmox_gpu_cluster."):
        module = importlib.import_module(info.name)
        found += [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == info.name
                  and issubclass(v, pulumi.ComponentResource)]  # fmt: skip
    return found


def section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def table(text: str, header: str) -> dict[str, list[str]]:
    """First-column name -> the row's other cells, for the table whose header starts with ``header``."""
    lines = text[text.index(f"\n| {header} |") :].splitlines()[3:]
    rows = [line for line in (lines[: lines.index("")] if "" in lines else lines) if line.startswith("| `")]
    cells = [[c.strip() for c in CELL.split(row[2:-2])] for row in rows]
    return {c[0].strip("`"): c[1:] for c in cells}


def code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"


def attribute_docstrings(cls: type) -> dict[str, str]:
    (node,) = ast.parse(textwrap.dedent(inspect.getsource(cls))).body
    assert isinstance(node, ast.ClassDef)
    docs = {}
    for item, after in zip(node.body, [*node.body[1:], None], strict=True):
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and isinstance(after, ast.Expr) \
                and isinstance(after.value, ast.Constant):  # fmt: skip
            docs[item.target.id] = " ".join(str(after.value.value).split())
    return docs


def test_docs_components_md_is_current(rendered: str) -> None:
    assert (ROOT / "docs" / "components.md").read_text() == rendered, REGENERATE


def test_every_component_argument_and_output_is_there_as_the_class_has_it(rendered: str) -> None:
    classes = components()
    assert len(classes) >= 18, [c.__name__ for c in classes]
    for cls in classes:
        text = section(rendered, f"## {cls.__name__}")
        assert f"`from {cls.__module__} import {cls.__name__}`" in text
        params = list(inspect.signature(cls).parameters.values())  # the constructor's, without self
        rows = table(text, "argument")
        assert list(rows) == [p.name for p in params], cls.__name__
        for p in params:
            assert isinstance(p.annotation, str), f"{cls.__name__}.{p.name}: annotations as text (__future__)"
            kind, default, _ = rows[p.name]
            assert kind.split(" → ")[0] == code(p.annotation), (cls.__name__, p.name)
            assert default == ("required" if p.default is p.empty else code(repr(p.default))), (cls.__name__, p.name)
        outputs = {n: t for n, t in vars(cls).get("__annotations__", {}).items() if not n.startswith("_")}
        docs = attribute_docstrings(cls)
        rows = table(text, "output") if outputs else {}
        assert list(rows) == list(outputs), cls.__name__
        for name, annotation in outputs.items():
            assert docs.get(name), f"{cls.__name__}.{name} has no docstring"
            assert rows[name] == [code(annotation), docs[name].replace("|", "\\|")], (cls.__name__, name)


def test_descriptions_come_from_the_init_docstring_and_none_are_invented(rendered: str) -> None:
    operator = table(section(rendered, "## GpuOperator"), "argument")
    assert operator["opts"][2].startswith("the Kubernetes provider in ``opts.provider`` (the children inherit it)")
    assert operator["args"][2] == operator["name"][2] == ""  # the docstring says nothing about them
    fields = table(section(rendered, "### GpuOperatorArgs"), "field")  # an args class: its fields' descriptions
    assert fields["vgpu_registry_password"][2].startswith("Password of the vGPU Manager's registry, required")
    retirement = table(section(rendered, "## WorkerRetirement"), "argument")
    assert retirement["opts"][2].startswith("the command provider in ``opts.provider``; ``opts.depends_on`` (the")
    assert retirement["args"][2] == retirement["name"][2] == ""  # named in no sentence of its own


def test_the_docstring_parser_takes_only_sentence_initial_parameter_markers() -> None:
    doc = """Builds things. ``a``: first; see ``b``: not a marker mid-sentence.
    ``c``/``a``: shared. ``zzz``: not a parameter, so text. ``b``:
    last."""
    notes, described = param_descriptions(doc, ["a", "b", "c"])
    assert notes == "Builds things."
    assert described == {
        "a": "first; see ``b``: not a marker mid-sentence. shared. ``zzz``: not a parameter, so text.",
        "c": "shared. ``zzz``: not a parameter, so text.",
        "b": "last.",
    }
    assert param_descriptions(None, ["a"]) == ("", {})


def test_argument_types_list_every_field_and_every_link_resolves(rendered: str) -> None:
    headings = {
        line.split(" ", 1)[1].lower().replace(" ", "-")  # GitHub's anchor of a heading
        for line in rendered.splitlines()
        if line.startswith(("## ", "### "))
    }
    links = re.findall(r"\]\(#([a-z0-9-]+)\)", rendered)
    assert links and set(links) <= headings
    types = rendered[rendered.index("\n## Argument types\n") :]
    listed = re.findall(r"`from (\S+) import (\w+)`", types)
    assert {"ClusterSpec", "GuestBootstrapSpec", "WorkerVmArgs", "GpuStack", "Secrets", "Quota"} <= {
        n for _, n in listed
    }
    for module, name in listed:
        model = getattr(importlib.import_module(module), name)
        if isinstance(model, type) and issubclass(model, BaseModel):
            rows = table(types[types.index(f"\n### {name}\n") :], "field")
            assert list(rows) == list(model.model_fields), name
            for field, info in model.model_fields.items():
                assert rows[field][2] == (info.description or "").replace("|", "\\|"), (name, field)


def test_the_cli_writes_and_checks(tmp_path: Path, rendered: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "components.md"
    assert main(["--check", str(out)]) == 1  # missing
    assert main(["--write", str(out)]) == 0
    assert out.read_text() == rendered
    assert main(["--check", str(out)]) == 0
    out.write_text(rendered.replace("GpuCluster", "GpuClusterX", 1))
    assert main(["--check", str(out)]) == 1
    assert "is stale" in capsys.readouterr().err
