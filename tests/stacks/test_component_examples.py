"""The examples of docs/components.md run as written: each component's program under the offline plan's engine
(``testing.run``) and under ``pulumi.runtime.set_mocks`` with mocks as Pulumi's testing guide writes them (inputs
echoed back, every call answered ``{}``), preview on and off; the unit-test example passes as written."""

from __future__ import annotations

import json
import re
from typing import Any

import pulumi
import pytest

from proxmox_gpu_cluster.stacks.component_examples import EXAMPLES, SECRETS
from proxmox_gpu_cluster.testing import run
from tests.support import ROOT, base_spec

DOC = (ROOT / "docs" / "components.md").read_text()
BLOCK = re.compile(r"Example, a complete program:\n\n```python\n(.*?)\n```", re.DOTALL)


def documented_examples() -> dict[str, str]:
    """Component -> the example program as docs/components.md prints it."""
    found: dict[str, str] = {}
    for section in re.split(r"\n## ", DOC)[1:]:
        heading, _, body = section.partition("\n")
        match = BLOCK.search(body)
        if match:
            found[heading.strip()] = match[1] + "\n"
    return found


def unit_test_example() -> str:
    section = DOC.split("\n## Unit tests with Pulumi mocks\n", 1)[1]
    match = re.search(r"```python\n(.*?)\n```", section, re.DOTALL)
    assert match is not None
    return match[1] + "\n"


class EchoMocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.types: list[str] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.types.append(args.typ)
        return args.name + "_id", args.inputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        return {}


def config(project: str, component: str = "") -> dict[str, str]:
    values = {f"{project}:{key}": f"placeholder-{key}" for key in SECRETS}
    if component == "GpuCluster":  # its example loads the spec from the stack's config
        values[f"{project}:cluster"] = json.dumps(base_spec())
    return values


def under_guide_mocks(source: str, component: str, *, preview: bool) -> list[str]:
    """Run ``source`` as a program under Pulumi's own mock monitor; the resource types it registered. Raises what
    the program, or any callback of its outputs, raised."""
    mocks = EchoMocks()
    pulumi.runtime.set_mocks(mocks, project="example", stack="dev", preview=preview)
    secret_keys = [k for k in config("example", component) if not k.endswith(":cluster")]
    pulumi.runtime.set_all_config(config("example", component), secret_keys=secret_keys)

    @pulumi.runtime.test  # type: ignore[untyped-decorator]
    def program() -> None:
        exec(compile(source, "<docs/components.md>", "exec"), {"__name__": "__main__"})

    program()
    return mocks.types


def test_every_example_is_in_the_rendered_reference() -> None:
    assert documented_examples() == EXAMPLES  # printed as written; regenerate docs/components.md otherwise


@pytest.mark.parametrize(
    "component",
    [pytest.param(c, marks=[pytest.mark.slow] if c == "GpuCluster" else []) for c in sorted(EXAMPLES)],  # ~7 s
)
def test_each_example_plans_and_runs_under_pulumis_mocks(component: str) -> None:
    source = documented_examples()[component]
    rec = run(lambda: exec(compile(source, component, "exec"), {"__name__": "__main__"}),
              project="example", config=config("example", component),
              secret_keys=[k for k in config("example", component) if not k.endswith(":cluster")])  # fmt: skip
    assert any(r.type.endswith(f":{component}") for r in rec.resources)
    for preview in (True, False):
        types = under_guide_mocks(source, component, preview=preview)
        assert any(t.endswith(f":{component}") for t in types), (component, preview)


@pytest.mark.parametrize("preview", [False, True])
def test_the_unit_test_example_passes_as_written(preview: bool) -> None:
    source = unit_test_example()
    assert "preview=False" in source
    namespace: dict[str, Any] = {"__name__": "test_my_program"}
    exec(compile(source.replace("preview=False", f"preview={preview}"), "test_my_program", "exec"), namespace)
    tests = [f for name, f in namespace.items() if name.startswith("test_") and callable(f)]
    assert tests
    for test in tests:
        test()


def test_expected_gpu_vendor_device_says_where_the_id_comes_from() -> None:
    row = next(line for line in DOC.splitlines() if line.startswith("| `vendor_device` | `str` | required | PCI"))
    assert "CATALOG[<model>].vendor_device" in row and "lspci -nn" in row
