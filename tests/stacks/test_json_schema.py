"""The committed JSON Schemas (stacks/schemas/) are current, valid, accept every stack file and every spec the loader
accepts, and flag the field-level mistakes an editor should show. Checked twice: with Python's jsonschema and with
Ajv (JavaScript, the regular-expression dialect editors use; .ci/run installs it under .tools/)."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from referencing import Registry, Resource

from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.stacks.json_schema import SPEC_FILE, STACK_FILE, rendered, spec_schema, stack_schema
from tests.support import ROOT, base_spec, external, make_vm_worker, replace_at_random

SCHEMAS = ROOT / "stacks" / "schemas"
STACK_FILES = [*sorted(ROOT.glob("Pulumi.*.yaml")), ROOT / "examples" / "cluster-with-app" / "Pulumi.dev.yaml"]
AJV = ROOT / ".tools" / "ajv" / "node_modules" / "ajv"
AJV_SCRIPT = ROOT / "tests" / "tools" / "ajv_validate.mjs"
AJV_INSTALL = "install it with: npm install --prefix .tools/ajv ajv@8.17.1 (as .ci/run does)"
MODELINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)$", re.MULTILINE)


def stack_validator() -> jsonschema.Draft202012Validator:
    registry = Registry().with_resource(SPEC_FILE, Resource.from_contents(spec_schema()))
    return jsonschema.Draft202012Validator(stack_schema(), registry=registry)


def errors(validator: jsonschema.Draft202012Validator, document: Any) -> list[str]:
    """The paths of every error, and of the errors inside an anyOf/oneOf that failed (what an editor points at)."""

    def paths(error: jsonschema.ValidationError) -> set[str]:
        return {"/".join(map(str, error.absolute_path))}.union(*(paths(e) for e in error.context or ()))

    return sorted(set().union(*(paths(e) for e in validator.iter_errors(document))))


def test_the_committed_schemas_are_current() -> None:
    for name, text in rendered().items():
        committed = (SCHEMAS / name).read_text(encoding="utf-8")
        assert committed == text, "regenerate: python -m proxmox_gpu_cluster.stacks.json_schema --write stacks/schemas"


def test_the_schemas_are_valid_draft_2020_12() -> None:
    for schema in (spec_schema(), stack_schema()):
        jsonschema.Draft202012Validator.check_schema(schema)


def test_every_stack_file_names_the_schema_and_passes_it() -> None:
    validator = stack_validator()
    for path in STACK_FILES:
        text = path.read_text()
        targets = MODELINE.findall(text)
        assert len(targets) == 1, f"{path}: expected one yaml-language-server modeline"
        assert (path.parent / targets[0]).resolve() == SCHEMAS / STACK_FILE, path
        assert errors(validator, yaml.safe_load(text)) == [], path


def test_the_shorthands_are_in_the_schema() -> None:
    # Written the long way or the short way, as the loader takes them.
    validator = jsonschema.Draft202012Validator(spec_schema())
    spec = base_spec()
    spec["workers"][2]["gpus"] = ["a10-0", {"ref": "a10-1"}]
    full = {"field": "DCGM_FI_DEV_SM_CLOCK", "type": "gauge", "help": "SM clock frequency (in MHz)"}
    spec["gpuOperator"]["monitoring"] = {"metrics": ["DCGM_FI_DEV_GPU_TEMP", full]}
    assert errors(validator, spec) == []
    load_spec(spec)


BAD_FIELDS = [  # what an editor should underline, with the path it underlines
    ("misspelt key", lambda s: s["workers"][0].update(memoryMib=4096), "workers/0"),
    ("snake_case key", lambda s: s["workers"][0].update(memory_mib=4096), "workers/0"),
    ("text for a number", lambda s: s["workers"][0].update(vmid="two"), "workers/0/vmid"),
    ("boolean for a number", lambda s: s["workers"][0].update(cores=True), "workers/0/cores"),
    ("vmid out of range", lambda s: s["workers"][0].update(vmid=99), "workers/0/vmid"),
    ("unknown sharing mode", lambda s: s["workers"][2].update(sharing="timeslicing"), "workers/2/sharing"),
    ("unknown GPU model", lambda s: s["proxmox"]["nodes"][0]["gpus"][0].update(model="A100"),
     "proxmox/nodes/0/gpus/0/model"),
    ("upper-case name", lambda s: s["workers"][0].update(name="Mig-1"), "workers/0/name"),
    ("bad GPU shorthand", lambda s: s["workers"][2].update(gpus=["A10_0"]), "workers/2/gpus/0"),
    ("unknown metric shorthand", lambda s: s["gpuOperator"].update(monitoring={"metrics": ["DCGM_FI_NOPE"]}),
     "gpuOperator/monitoring/metrics/0"),
    ("MIG count out of range", lambda s: s["workers"][1]["gpus"][0].update(mig={"1g.5gb": 99}),
     "workers/1/gpus/0/mig/1g.5gb"),
    ("a list where a mapping goes", lambda s: s.update(kubernetes=["v1.34"]), "kubernetes"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "mutate", "path"), BAD_FIELDS, ids=[b[0] for b in BAD_FIELDS])
def test_the_schema_flags_field_mistakes_the_loader_refuses(case: str, mutate: Any, path: str) -> None:
    spec = base_spec()
    mutate(spec)
    with pytest.raises(SpecError):
        load_spec(spec)
    found = errors(jsonschema.Draft202012Validator(spec_schema()), spec)
    assert path in found, (case, found)


def test_a_plain_text_secret_is_flagged_in_the_stack_file() -> None:
    document = {"config": {"proxmox-gpu-cluster:cluster": base_spec(), "team:kubeconfig": "apiVersion: v1"}}
    assert errors(stack_validator(), document) == ["config/team:kubeconfig"]
    document["config"]["team:kubeconfig"] = {"secure": "v1:abc"}
    assert errors(stack_validator(), document) == []


# --- no false alarms: whatever the loader accepts, written the canonical way, passes -----------------------------

_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70_000), st.text(max_size=12),
    st.sampled_from(["all-1g.5gb", "A10", "pve1", "a10-0", "mig", "0000:41:00", "10de:20f1", "1.34", "dhcp"]),
    st.lists(st.integers(0, 3), max_size=3), st.dictionaries(st.text(max_size=6), st.integers(0, 9), max_size=2),
)  # fmt: skip


def _accepted_specs() -> list[dict[str, Any]]:
    specs = [base_spec(), make_vm_worker(base_spec(), 2, "vm-passthrough"), make_vm_worker(base_spec(), 2, "vm-vgpu")]
    specs += [yaml.safe_load(p.read_text())["config"]["proxmox-gpu-cluster:cluster"] for p in STACK_FILES[:3]]
    return specs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_spec_the_loader_accepts_passes_the_schema(data: st.DataObject) -> None:
    # The loader is lenient where the schema is not (it strips whitespace and coerces "5" to 5), so what is compared
    # is the accepted spec as the loader normalises it: the schema never calls a valid spec wrong.
    spec = copy.deepcopy(data.draw(st.sampled_from(_accepted_specs())))
    replace_at_random(spec, data, _LEAVES, (0, 3))
    try:
        accepted = load_spec(spec)
    except SpecError:
        return
    canonical = accepted.model_dump(by_alias=True, mode="json")
    assert errors(jsonschema.Draft202012Validator(spec_schema()), canonical) == []


# --- the same with Ajv, as a JavaScript editor runs the schema ------------------------------------------------


def ajv(schema: str, documents: dict[str, Any]) -> dict[str, list[str]]:
    node = shutil.which("node")
    if node is None:
        external(Path("/nonexistent/node"), "node", "install Node.js")
    package = external(AJV, "Ajv (npm)", AJV_INSTALL)
    files = [str(SCHEMAS / SPEC_FILE), str(SCHEMAS / STACK_FILE)]
    result = subprocess.run(
        [str(node), str(AJV_SCRIPT), str(package), *files],
        input=json.dumps({"schema": schema, "documents": documents}),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    parsed: dict[str, list[str]] = json.loads(result.stdout)
    return parsed


def test_ajv_compiles_the_schemas_strictly_and_accepts_every_stack_file() -> None:
    documents = {p.relative_to(ROOT).as_posix(): yaml.safe_load(p.read_text()) for p in STACK_FILES}
    documents["plain secret"] = {"config": {"proxmox-gpu-cluster:sshPrivateKey": "-----BEGIN"}}
    found = ajv(STACK_FILE, documents)
    assert found.pop("plain secret") == ["/config/proxmox-gpu-cluster:sshPrivateKey: must be object"]
    assert {name: problems for name, problems in found.items() if problems} == {}
    bad = base_spec()
    bad["workers"][0]["vmid"] = "2001"
    assert ajv(SPEC_FILE, {"bad": bad}) == {"bad": ["/workers/0/vmid: must be integer"]}


def test_ajv_would_refuse_a_keyword_it_does_not_know(tmp_path: Path) -> None:
    # Strict mode is what makes the compile check worth having: pydantic's "ge" instead of "minimum" is refused.
    for name, text in rendered().items():
        (tmp_path / name).write_text(text)
    spec = json.loads((tmp_path / SPEC_FILE).read_text())
    spec["$defs"]["Network"]["properties"]["vlan"]["anyOf"][0]["ge"] = 1
    (tmp_path / SPEC_FILE).write_text(json.dumps(spec))
    node, package = shutil.which("node"), external(AJV, "Ajv (npm)", AJV_INSTALL)
    result = subprocess.run(
        [str(node), str(AJV_SCRIPT), str(package), str(tmp_path / SPEC_FILE), str(tmp_path / STACK_FILE)],
        input=json.dumps({"schema": SPEC_FILE, "documents": {}}),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1 and 'unknown keyword: "ge"' in result.stderr, result.stderr
