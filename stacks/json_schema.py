"""JSON Schemas generated from the spec models, for editors (completion, hover text, errors as you type):

- ``schemas/cluster-spec.schema.json``: the cluster spec, the value of ``<project>:cluster``;
- ``schemas/stack.schema.json``: a whole ``Pulumi.<stack>.yaml`` of a program that loads the spec with ``load()``
  (any project name): the spec under ``<project>:cluster``, every secret key only as an encrypted ``secure:`` value.

    python -m proxmox_gpu_cluster.stacks.json_schema --write stacks/schemas   # (no --write: print the stack's)

A test fails when the committed files are not what this writes, so the schemas never drift from the models. The
models stay the authority: a schema cannot express the rules that relate several parts of the spec (vmids in
use, GPUs claimed twice, MIG support per model), which the loader still reports with their config paths.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from proxmox_gpu_cluster.core.spec import ClusterSpec
from proxmox_gpu_cluster.stacks.config import ALL_SECRETS, SPEC_KEY

DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_DIR = Path(__file__).parent / "schemas"
"""Where the installed package carries both files (package data), for a program that points its editor at them."""
SPEC_FILE = "cluster-spec.schema.json"
STACK_FILE = "stack.schema.json"
NAMESPACE = r"([A-Za-z0-9_.-]+:)?"
"""An optional config namespace: a Pulumi project name (letters, digits, ``-``, ``_``, ``.``) and a colon."""

# pydantic writes bounds it applies after a BeforeValidator (our Int refuses booleans first) under their Python
# names; JSON Schema spells them differently, and a validator ignores keywords it does not know.
_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}
_NAME_MAPS = {"properties", "patternProperties", "$defs"}
"""Keywords whose values map names (of properties, patterns, definitions) to schemas, not keywords to values."""
_DATA = {"default", "enum", "const", "examples"}
"""Keywords whose values are instance data, copied as they are."""


def _normalise(node: Any, names: bool = False) -> Any:
    """Bounds under their JSON Schema names; pydantic's generated ``title``s (the field name again) dropped."""
    if isinstance(node, list):
        return [_normalise(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    if names:
        return {name: _normalise(schema) for name, schema in node.items()}
    return {
        _BOUNDS.get(key, key): value if key in _DATA else _normalise(value, names=key in _NAME_MAPS)
        for key, value in node.items()
        if key != "title"
    }


def spec_schema() -> dict[str, Any]:
    """The cluster spec's JSON Schema (draft 2020-12): camelCase keys, the string shorthands, no unknown keys."""
    schema = _normalise(ClusterSpec.model_json_schema(by_alias=True, mode="validation"))
    return {"$schema": DIALECT, "title": "proxmox-gpu-cluster cluster spec", **schema}


def _secure(purpose: str, key: str) -> dict[str, Any]:
    return {
        "description": f"Secret: {purpose}. Set it with `pulumi config set --secret <project>:{key} ...`; a plain "
        "value is refused.",
        "type": "object",
        "properties": {"secure": {"type": "string", "minLength": 1, "description": "The encrypted value."}},
        "required": ["secure"],
        "additionalProperties": False,
    }


def stack_schema(spec_ref: str = SPEC_FILE) -> dict[str, Any]:
    """The JSON Schema of a ``Pulumi.<stack>.yaml``; ``spec_ref`` is where the spec's schema is, relative to it."""
    config: dict[str, Any] = {f"^{NAMESPACE}{SPEC_KEY}$": {"$ref": spec_ref}}
    config.update({f"^{NAMESPACE}{s.key}$": _secure(s.purpose, s.key) for s in ALL_SECRETS})
    return {
        "$schema": DIALECT,
        "title": "Pulumi stack file of a proxmox-gpu-cluster program",
        "description": "Pulumi.<stack>.yaml: the cluster spec under <project>:cluster and the secrets, encrypted.",
        "type": "object",
        "properties": {
            "config": {
                "description": "The stack's config. Keys of other namespaces and other keys are left to their owners.",
                "type": "object",
                "patternProperties": config,
            },
            "secretsprovider": {"type": "string", "description": "The stack's secrets provider."},
            "encryptedkey": {"type": "string", "description": "The data key, encrypted by the secrets provider."},
            "encryptionsalt": {"type": "string", "description": "The passphrase secrets provider's salt."},
        },
    }


def rendered() -> dict[str, str]:
    """File name -> the exact text to commit (sorted nowhere: the models' field order is the reading order)."""
    return {
        name: json.dumps(schema, indent=2, ensure_ascii=False) + "\n"
        for name, schema in ((SPEC_FILE, spec_schema()), (STACK_FILE, stack_schema()))
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proxmox_gpu_cluster.stacks.json_schema", description=__doc__)
    parser.add_argument("--write", metavar="DIR", help="write both files into DIR (this repository: stacks/schemas)")
    args = parser.parse_args(argv)
    files = rendered()
    if args.write is None:
        sys.stdout.write(files[STACK_FILE])
        return 0
    target = Path(args.write)
    target.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (target / name).write_text(text, encoding="utf-8")
        print(target / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
