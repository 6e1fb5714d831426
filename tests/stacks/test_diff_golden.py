"""Golden tests of the offline plan diff on realistic pull requests against the prod stack (issue 26).

Each scenario is a pull request a reviewer would see: an edit of ``Pulumi.prod.yaml`` made as data (loaded with
yaml, changed, dumped) and planned by the CLI in-process against the file before the edit, as text, ``--json`` and
``--markdown``. The three outputs are compared with ``tests/stacks/golden/<scenario>.{txt,json,md}`` so that any
change of what a pull request comment says is reviewed as a diff of those files; ``PGC_UPDATE_GOLDEN=1`` rewrites
them. Golden files alone would freeze whatever the output happens to be, so beside each comparison a test states
what the issue demands of that pull request (old → new values, capacity before → after, the drain, the protected
removal, the Job replacement) independently of the exact wording around it.

A plan takes about a second: the plans are memoised by their inputs (``plan`` wrapped while a scenario runs), so
the unchanged prod file is planned once for all scenarios and each edited file once for its three formats. What
each scenario must say: test_diff_golden_checks.py.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxmox_gpu_cluster.stacks.plan import main
from proxmox_gpu_cluster.stacks.plan import run as plan_module
from proxmox_gpu_cluster.stacks.plan.compare import package_shim
from tests.stacks.git_scratch import commit, copy_project
from tests.support import ROOT

GOLDEN = Path(__file__).parent / "golden"
CLUSTER = "proxmox-gpu-cluster:cluster"
FORMATS = {"txt": [], "json": ["--json"], "md": ["--markdown"]}
Edit = Callable[[dict[str, Any]], None]
"""Changes the stack file's ``config`` mapping in place (most edits: its cluster spec, ``spec(config)``)."""


@dataclass(frozen=True)
class Scenario:
    """A pull request: ``edit`` changes the prod stack's config; ``base`` (if any) makes the state it starts from
    when the checked-in prod file is not it (e.g. a driver pinned before it is bumped)."""

    name: str
    edit: Edit
    base: Edit | None = None


def spec(config: dict[str, Any]) -> dict[str, Any]:
    cluster = config[CLUSTER]
    assert isinstance(cluster, dict)
    return cluster


def worker(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(w for w in spec(config)["workers"] if w["name"] == name)


def _driver_bump(config: dict[str, Any]) -> None:
    spec(config)["gpuOperator"]["driverVersion"] = "580.105.08"


def _pin_old_driver(config: dict[str, Any]) -> None:
    spec(config)["gpuOperator"]["driverVersion"] = "580.95.05"


def _branch(config: dict[str, Any]) -> None:
    spec(config)["gpuOperator"]["driverBranch"] = "595"


def _kubernetes_minor(config: dict[str, Any]) -> None:
    spec(config)["kubernetes"]["version"] = "1.35"


def _replicas(config: dict[str, Any]) -> None:
    for name in ("gpu-a10-a", "gpu-a10-b"):
        worker(config, name)["timeSlicing"]["replicas"] = 8


def _mig_geometry(config: dict[str, Any]) -> None:
    worker(config, "gpu-a100-b")["gpus"][0]["mig"] = {"3g.20gb": 2}
    # the research quota named the profiles the new geometry drops; the same PR moves it to what is advertised
    research = next(q for q in spec(config)["quotas"] if q["namespace"] == "ml-research" and "priorityClass" not in q)
    research["resources"] = {"nvidia.com/gpu": 4, "nvidia.com/mig-3g.20gb": 2}


def _add_worker(config: dict[str, Any]) -> None:
    # the spare A10 on pve-b: declared, prepared for passthrough and mapped already (see the stack file)
    new = {**worker(config, "gpu-a10-b"), "name": "gpu-a10-c", "vmid": 3203, "gpus": ["a10-1"]}
    new["network"] = {**new["network"], "ipv4": "10.20.1.23/24"}
    spec(config)["workers"].append(new)


def _remove_a10_b(config: dict[str, Any]) -> None:
    spec(config)["workers"].remove(worker(config, "gpu-a10-b"))


def _unprotect_a10_b(config: dict[str, Any]) -> None:
    worker(config, "gpu-a10-b")["protect"] = False


def _chart_bump(config: dict[str, Any]) -> None:
    spec(config)["gpuOperator"]["chartVersion"] = "v26.7.0"


def _old_chart(config: dict[str, Any]) -> None:
    spec(config)["gpuOperator"]["chartVersion"] = "v25.10.1"


def _monitoring(config: dict[str, Any]) -> None:
    alerts = spec(config)["gpuOperator"]["monitoring"]["alerts"]
    alerts.update(temperatureWarningCelsius=80, utilizationMinutes=60)


def _smoke_image(config: dict[str, Any]) -> None:
    spec(config)["gpuOperator"]["smokeTest"]["image"] = "nvcr.io/nvidia/cuda:12.9.1-base-ubuntu24.04"


def _renumber_host(config: dict[str, Any]) -> None:
    # pve-b moves to a new management address: every SSH connection to it (a secret input) changes
    spec(config)["proxmox"]["nodes"][1]["sshAddress"] = "10.20.0.22"


JOIN_TOKEN = "proxmox-gpu-cluster:kubeadmJoinToken"
CIPHERTEXTS = (
    "v1:c2FsdDEyMzQ=:b2xkLWpvaW4tdG9rZW4tY2lwaGVydGV4dA==",
    "v1:c2FsdDU2Nzg=:bmV3LWpvaW4tdG9rZW4tY2lwaGVydGV4dA==",
)
"""Two encrypted join tokens as ``pulumi config set --secret`` stores them (the plan cannot decrypt either)."""


def _old_token(config: dict[str, Any]) -> None:
    config[JOIN_TOKEN] = {"secure": CIPHERTEXTS[0]}


def _rotate_token(config: dict[str, Any]) -> None:
    config[JOIN_TOKEN] = {"secure": CIPHERTEXTS[1]}


def _drop_token(config: dict[str, Any]) -> None:
    # Each worker then gets its own token, made right before its join (GuestBootstrap's join-token step).
    config.pop(JOIN_TOKEN)


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("driver-version-bump", _driver_bump, base=_pin_old_driver),
        Scenario("driver-branch-change", _branch),
        Scenario("time-slicing-replicas", _replicas),
        Scenario("mig-geometry", _mig_geometry),
        Scenario("add-worker", _add_worker),
        Scenario("remove-worker", _remove_a10_b, base=_unprotect_a10_b),
        Scenario("remove-protected-worker", _remove_a10_b),
        Scenario("operator-chart-bump", _chart_bump, base=_old_chart),
        Scenario("monitoring-alerts", _monitoring),
        Scenario("smoke-test-image", _smoke_image),
        Scenario("rotate-join-token", _rotate_token, base=_old_token),
        Scenario("minted-join-tokens", _drop_token, base=_old_token),
        Scenario("renumber-host", _renumber_host),
        Scenario("kubernetes-minor-upgrade", _kubernetes_minor),
    )
}


def prod_document() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())
    assert isinstance(document, dict)
    return document


def write_stack(path: Path, *edits: Edit | None) -> Path:
    """The prod stack file with ``edits`` applied to its config, as a reviewer's branch would have it."""
    document = prod_document()
    for edit in edits:
        if edit is not None:
            edit(document["config"])
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def run_cli(args: list[str]) -> tuple[int, str, str]:
    """The plan CLI in-process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


@dataclass(frozen=True)
class Outputs:
    txt: str
    json: str
    md: str

    @property
    def document(self) -> dict[str, Any]:
        loaded = json.loads(self.json)
        assert isinstance(loaded, dict)
        return loaded


PLAN = plan_module.plan
_PLANS: dict[str, Any] = {}


def _memoised(*args: Any, **kwargs: Any) -> Any:
    """``plan`` answering the same inputs with the same (read-only) result: the before plan is shared by every
    scenario. The key is the inputs' repr: the stack document, program path, specs and flags."""
    key = repr((args, sorted(kwargs.items())))
    if key not in _PLANS:
        _PLANS[key] = PLAN(*args, **kwargs)
    return _PLANS[key]


class Planner:
    """Plans each scenario once (all three formats) in one temporary directory, for every module that asks."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.results: dict[str, Outputs] = {}

    def outputs(self, name: str) -> Outputs:
        if name not in self.results:
            scenario = SCENARIOS[name]
            base = write_stack(self.directory / f"{name}.base.yaml", scenario.base)
            new = write_stack(self.directory / f"{name}.yaml", scenario.base, scenario.edit)
            args = ["prod", "--main", str(ROOT), "--placeholder-secrets", "--config", str(base), "--diff-config"]
            printed = {}
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(plan_module, "plan", _memoised)
                for fmt, flags in FORMATS.items():
                    code, out, err = run_cli([*args, str(new), *flags])
                    assert code == 0, err
                    # what stderr may say: which secrets got placeholders (the prod file sets none, by design)
                    assert [line for line in err.splitlines() if not line.startswith("placeholders for")] == []
                    printed[fmt] = out
            self.results[name] = Outputs(**printed)
        return self.results[name]


_PLANNER: list[Planner] = []


@pytest.fixture
def planner(tmp_path_factory: pytest.TempPathFactory) -> Planner:
    """One planner for the session (this module and test_diff_golden_checks.py import it)."""
    if not _PLANNER:
        _PLANNER.append(Planner(tmp_path_factory.mktemp("golden-diff")))
    return _PLANNER[0]


CODE_CHANGES: dict[str, tuple[str, str]] = {
    # a node script: the driver step's bundle (guest_driver.sh) gains a command
    "code-only-node-script": ("scripts/guest_driver.sh", "\n: a reviewed edit\n"),
    # the node agent's Python: the capacity gate's module (agent/capacity.py)
    "code-only-node-agent": ("agent/capacity.py", "\nREVIEWED = True  # a reviewed edit\n"),
}
"""Pull requests that change only code (a file under ``components/``, its path there, and what is appended): the
stack file is the same on both sides, so only ``--diff-base`` planning the base revision's code can show them."""


class CodePlanner:
    """Plans each code-only pull request as CI would: a scratch repository holding the project (this checkout's
    files) with the edit committed on top, and the plan CLI of that repository's code (its package first on
    PYTHONPATH through the same shim ``--diff-base`` uses) diffing against ``HEAD~1``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.results: dict[str, Outputs] = {}

    def outputs(self, name: str) -> Outputs:
        if name not in self.results:
            relative, addition = CODE_CHANGES[name]
            repo = copy_project(self.directory / name)
            path = repo / "components" / relative
            path.write_text(path.read_text() + addition)
            commit(repo, f"edit {relative}")
            shim = self.directory / f"{name}-shim"
            assert package_shim(repo, shim)
            env = {**os.environ, "PYTHONPATH": str(shim), "PYTHONDONTWRITEBYTECODE": "1"}
            command = [sys.executable, "-m", "proxmox_gpu_cluster.plan", "prod", "--placeholder-secrets"]
            printed = {}
            for fmt, flags in FORMATS.items():
                run = [*command, "--diff-base", "HEAD~1", *flags]
                proc = subprocess.run(run, check=False, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
                assert proc.returncode == 0, proc.stderr
                printed[fmt] = proc.stdout
            self.results[name] = Outputs(**printed)
        return self.results[name]


_CODE_PLANNER: list[CodePlanner] = []


@pytest.fixture
def code_planner(tmp_path_factory: pytest.TempPathFactory) -> CodePlanner:
    """One code planner for the session (test_diff_golden_checks.py imports it too)."""
    if not _CODE_PLANNER:
        _CODE_PLANNER.append(CodePlanner(tmp_path_factory.mktemp("golden-code")))
    return _CODE_PLANNER[0]


def check_golden(name: str, suffix: str, actual: str) -> None:
    """``actual`` equals the checked-in golden file; ``PGC_UPDATE_GOLDEN=1`` rewrites the file instead."""
    path = GOLDEN / f"{name}.{suffix}"
    if os.environ.get("PGC_UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(actual)
        return
    assert path.exists(), f"{path} missing: run with PGC_UPDATE_GOLDEN=1, then review and commit it"
    expected = path.read_text()
    if actual != expected:
        delta = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True), str(path), "now"))
        pytest.fail(f"the diff output changed (PGC_UPDATE_GOLDEN=1 rewrites the file after review):\n{delta}")


@pytest.mark.parametrize("suffix", list(FORMATS))
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_golden(planner: Planner, name: str, suffix: str) -> None:
    actual = getattr(planner.outputs(name), suffix)
    # reproducible in any checkout: no temporary path, no absolute path of this checkout, no timestamp
    assert str(planner.directory) not in actual and str(ROOT) not in actual
    assert not re.search(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}", actual)
    assert "plan-placeholder" not in actual  # a secret's (placeholder) value is never printed
    check_golden(name, suffix, actual)


@pytest.mark.slow  # two plans (one in a git worktree) per format and scenario, about 15 s a scenario
@pytest.mark.parametrize("suffix", list(FORMATS))
@pytest.mark.parametrize("name", list(CODE_CHANGES))
def test_golden_code_only(code_planner: CodePlanner, name: str, suffix: str) -> None:
    actual = getattr(code_planner.outputs(name), suffix)
    assert str(code_planner.directory) not in actual and str(ROOT) not in actual and "pgc-" not in actual
    check_golden(name, suffix, actual)


def test_the_golden_directory_holds_exactly_the_scenarios() -> None:
    """A renamed or dropped scenario leaves no stale golden file behind."""
    expected = {f"{name}.{suffix}" for name in (*SCENARIOS, *CODE_CHANGES) for suffix in FORMATS}
    if os.environ.get("PGC_UPDATE_GOLDEN") == "1":
        for stale in {p.name for p in GOLDEN.glob("*.*")} - expected - {"README.md"}:
            (GOLDEN / stale).unlink()
    assert {p.name for p in GOLDEN.glob("*.*")} - {"README.md"} == expected


def test_an_unchanged_stack_file_changes_nothing(tmp_path: Path) -> None:
    """Two plans of the same file, not memoised: the mock engine is deterministic, so a golden diff is stable."""
    same = write_stack(tmp_path / "same.yaml")
    code, out, _ = run_cli(["prod", "--main", str(ROOT), "--placeholder-secrets", "--diff-config", str(same)])
    assert code == 0
    assert out.startswith("0 to add, 0 to update, 0 to replace, 0 to remove\n")
