"""The node agent's bundles: fingerprints name exactly what a step runs, the prologue on the machine checks them and
reads only secrets from stdin, the local copy is content-addressed, and the plan shows the hash, never the path."""

from __future__ import annotations

import base64
import multiprocessing
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pulumi
import pulumi_command as command
import pytest

from proxmox_gpu_cluster.node_agent import install_agent
from proxmox_gpu_cluster.render import agent_bundle
from proxmox_gpu_cluster.render.agent_bundle import (
    GUEST_STEPS,
    HOST_STEPS,
    bundle_files,
    bundle_name,
    fingerprint,
    materialize,
    secrets_stdin,
    step_command,
)
from proxmox_gpu_cluster.render.shipping import strip_comments
from proxmox_gpu_cluster.testing import run

ALL_STEPS = [*GUEST_STEPS, *HOST_STEPS]


def test_every_step_has_a_12_digit_fingerprint_and_a_bundle_named_after_it() -> None:
    for step in ALL_STEPS:
        assert re.fullmatch(r"[0-9a-f]{12}", fingerprint(step)), step
        assert bundle_name(step) == f"{step}-{fingerprint(step)}"
        names = [name for name, _ in bundle_files(step)]
        assert names == sorted(names) and "step.sh" in names
    assert len({fingerprint(s) for s in ALL_STEPS}) == len(ALL_STEPS)
    with pytest.raises(ValueError, match="unknown agent step 'nope'"):
        fingerprint("nope")


@pytest.mark.parametrize(
    ("script", "changed"),
    [
        ("guest_join.sh", {"join"}),
        ("guest_rollout.sh", {"driver", "join", "verify", "mig", "hold"}),
        ("guest_lib.sh", set(GUEST_STEPS)),
        ("host_prep.sh", {"host-prep"}),
        ("host_lib.sh", set(HOST_STEPS) - {"retire"}),
        ("agent_prologue.sh", set(ALL_STEPS)),
    ],
)
def test_a_script_change_changes_exactly_the_steps_that_run_it(
    monkeypatch: pytest.MonkeyPatch, script: str, changed: set[str]
) -> None:
    before = {step: fingerprint(step) for step in ALL_STEPS}
    original = agent_bundle._text
    monkeypatch.setattr(agent_bundle, "_text", lambda p, n: original(p, n) + ("\ntrue\n" if n == script else ""))
    bundle_files.cache_clear()
    try:
        after = {step: fingerprint(step) for step in ALL_STEPS}
    finally:
        monkeypatch.undo()
        bundle_files.cache_clear()
    assert {step for step in ALL_STEPS if before[step] != after[step]} == changed


def test_a_comment_change_changes_nothing() -> None:
    text = agent_bundle._text("scripts", "guest_join.sh")
    assert strip_comments(text) == strip_comments(text.replace("\n#", "\n# reworded:", 1))


def test_the_python_modules_ride_with_the_steps_that_call_them() -> None:
    scripts = Path(agent_bundle.__file__).parents[1] / "scripts"
    for step in (*GUEST_STEPS, *HOST_STEPS):
        text = dict(bundle_files(step))["step.sh"].decode()
        modules = [n for n, _ in bundle_files(step) if n.endswith(".py")]
        called = set(re.findall(r"\$PGC_AGENT_DIR/([a-z_]+\.py)", text))
        for module in sorted(called):  # and the agent modules those import from their own directory
            source = (scripts.parent / "agent" / module).read_text()
            imported = {f"{m}.py" for m in re.findall(r"^\s*from (\w+) import", source, re.MULTILINE)}
            called |= {m for m in imported if (scripts.parent / "agent" / m).exists()}
        assert modules == sorted(called), step  # exactly what its scripts need, so a module change re-runs only them
    assert [n for n, _ in bundle_files("capacity") if n.endswith(".py")] == ["capacity.py"]
    assert "cluster.py" not in dict(bundle_files("capacity"))
    assert [n for n, _ in bundle_files("drain") if n.endswith(".py")] == ["cluster.py", "kubeapi.py"]
    assert (scripts / "agent_prologue.sh").exists()


def test_the_command_names_the_bundle_and_quotes_every_argument() -> None:
    cmd = step_command("ubuntu", "join", ["--node-name", "w1", "--x", "a b;c"])
    path = f".proxmox-gpu-cluster/agent/{bundle_name('join')}/step.sh"
    assert cmd == f"sudo -n bash -c {shlex.quote(agent_bundle.LAUNCHER)} {path} --node-name w1 --x 'a b;c'"
    assert step_command("root", "host-prep", []).startswith("bash -c ")


def fake_bundle(tmp_path: Path, body: str) -> Path:
    """A bundle with the real prologue and ``body``, in a directory named after its real fingerprint."""
    prologue = strip_comments(agent_bundle._text("scripts", "agent_prologue.sh"))
    files = ((("step.sh", (prologue + "\n" + body).encode())),)
    directory = tmp_path / f"probe-{agent_bundle._digest(files)[:12]}"
    directory.mkdir()
    (directory / "step.sh").write_bytes(files[0][1])
    return directory


def run_step(bundle: Path, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(bundle / "step.sh")], input=stdin, capture_output=True, text=True, check=False, cwd=bundle.parent
    )


def test_the_prologue_decodes_exactly_the_secrets_it_is_given(tmp_path: Path) -> None:
    bundle = fake_bundle(tmp_path, 'printf "%s|%s" "$PGC_JOIN_TOKEN" "${PGC_CA_CERT_HASH:-unset}"\n')
    token = "abcdef.0123456789abcdef 'it''s' \"quoted\" $(not run) `nor this`\n"
    proc = run_step(bundle, secrets_stdin({"PGC_JOIN_TOKEN": token}))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == token.rstrip("\n") + "|unset"
    assert run_step(bundle, "").stdout == "|unset" or run_step(bundle, "").returncode != 0  # set -u: unset names fail


def test_the_prologue_refuses_an_admin_kubeconfig(tmp_path: Path) -> None:
    # No admin credential reaches a machine any more (the node steps act as the node): the name is refused, in the
    # renderer and on the machine, without echoing the value.
    bundle = fake_bundle(tmp_path, 'echo "ran ${PGC_KUBECONFIG:-unset}"\n')
    canary = "apiVersion: v1\nusers:\n- user: {token: SECRET-CANARY-KUBECONFIG}\n"
    stdin = f"PGC_KUBECONFIG={base64.b64encode(canary.encode()).decode()}\n"
    proc = run_step(bundle, stdin)
    assert proc.returncode == 2 and "ran" not in proc.stdout
    assert proc.stderr.startswith("agent: stdin: expected NAME=<base64> lines for PGC_JOIN_TOKEN or PGC_CA_CERT_HASH")
    assert "CANARY" not in proc.stdout + proc.stderr
    with pytest.raises(ValueError, match="not a secret a step reads: PGC_KUBECONFIG"):
        secrets_stdin({"PGC_KUBECONFIG": canary})


def test_the_prologue_refuses_other_lines_without_echoing_them(tmp_path: Path) -> None:
    bundle = fake_bundle(tmp_path, "echo ran\n")
    leaked = "SECRET-CANARY-VALUE"
    for stdin in (f"PATH={base64.b64encode(b'/tmp').decode()}\n", f"{leaked}\n", "PGC_JOIN_TOKEN=%%%not-base64\n"):
        proc = run_step(bundle, stdin)
        assert proc.returncode == 2 and "ran" not in proc.stdout, stdin
        assert proc.stderr.startswith("agent: stdin: expected ") and leaked not in proc.stderr
    with pytest.raises(ValueError, match="not a secret a step reads: PATH"):
        secrets_stdin({"PATH": "/tmp"})


def test_the_prologue_stops_a_bundle_that_is_not_what_its_name_says(tmp_path: Path) -> None:
    bundle = fake_bundle(tmp_path, "echo ran\n")
    assert run_step(bundle, "").stdout == "ran\n"
    step = bundle / "step.sh"
    step.write_bytes(step.read_bytes()[:-3])  # a copy cut short
    proc = run_step(bundle, "")
    assert proc.returncode == 1 and proc.stdout == ""
    assert f"expected fingerprint {bundle.name.rsplit('-', 1)[1]}, saw " in proc.stderr
    assert "pulumi up --replace" in proc.stderr


@pytest.mark.parametrize("step", [s for s in ALL_STEPS if any(n.endswith(".py") for n, _ in bundle_files(s))])
def test_running_the_agent_leaves_its_bundle_as_copied(tmp_path: Path, step: str) -> None:
    # A step runs its modules from its bundle (python3 <bundle>/cluster.py, which imports kubeapi.py beside it), as
    # root, so python3 may write byte code there; the next run of the same bundle checks its fingerprint over every
    # name in the directory: anything the run left behind stops every later run of that step on the machine.
    bundle = tmp_path / bundle_name(step)
    bundle.mkdir()
    for name, content in bundle_files(step):
        (bundle / name).write_bytes(content)
    machine = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}  # a step's environment: no PYTHONDONTWRITEBYTECODE
    text = (bundle / "step.sh").read_text()
    flags = ["-B"] if re.search(r"python3 -B|PYTHONDONTWRITEBYTECODE=1", text) else []  # as the step runs python3
    for module in sorted(n for n, _ in bundle_files(step) if n.endswith(".py")):
        argv = ["python3", *flags, str(bundle / module)]
        subprocess.run(argv, capture_output=True, check=False, cwd=tmp_path, env=machine)
    assert sorted(p.name for p in bundle.iterdir()) == [n for n, _ in bundle_files(step)]
    proc = run_step(bundle, "")  # the prologue's check passes; the step then refuses its missing arguments
    assert "sha256sum" not in proc.stderr and "expected fingerprint" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("step", ALL_STEPS)
def test_each_bundle_parses_and_passes_shellcheck_as_installed(tmp_path: Path, step: str) -> None:
    text = dict(bundle_files(step))["step.sh"].decode()
    path = tmp_path / "step.sh"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True, check=False).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck; .ci/run installs it)")
    proc = subprocess.run(["shellcheck", "-s", "bash", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_materialize_writes_each_content_once_and_repairs_a_damaged_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(agent_bundle.CACHE_ENV, str(tmp_path))
    materialize.cache_clear()
    first = Path(materialize("guest"))
    assert first.name == "agent" and first.parent.parent == tmp_path
    assert sorted(p.name for p in first.iterdir()) == sorted(bundle_name(s) for s in GUEST_STEPS)
    (first / bundle_name("join") / "step.sh").write_text("tampered")
    materialize.cache_clear()
    again = Path(materialize("guest"))
    assert (
        again == first
        and (again / bundle_name("join") / "step.sh").read_bytes() == dict(bundle_files("join"))["step.sh"]
    )
    materialize.cache_clear()


def _materialize_in(cache: str) -> str:
    import os

    os.environ[agent_bundle.CACHE_ENV] = cache
    return agent_bundle.materialize("host")


def test_parallel_plans_share_one_copy(tmp_path: Path) -> None:
    with multiprocessing.get_context("fork").Pool(4) as pool:
        paths = pool.map(_materialize_in, [str(tmp_path)] * 8)
    assert len(set(paths)) == 1
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == [Path(paths[0]).parent.name]


def test_another_checkout_path_is_no_diff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def program() -> None:
        connection = command.remote.ConnectionArgs(host="h", user="root", private_key="k")
        install_agent("m-agent", "guest", connection=connection, provider=command.Provider("p"), parent=None)  # type: ignore[arg-type]

    sources = []
    for checkout in ("a", "b"):
        monkeypatch.setenv(agent_bundle.CACHE_ENV, str(tmp_path / checkout))
        materialize.cache_clear()
        sources.append(run(program).named("m-agent").plain_inputs["source"])
    materialize.cache_clear()
    assert sources[0] == sources[1] and set(sources[0]) == {"archive"}
    assert str(tmp_path) not in repr(sources[0])


def test_a_step_change_is_a_new_archive(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(agent_bundle.CACHE_ENV, str(tmp_path))
    materialize.cache_clear()
    before = Path(materialize("guest"))
    original = agent_bundle._text
    monkeypatch.setattr(agent_bundle, "_text", lambda p, n: original(p, n) + ("\n:\n" if n == "guest_join.sh" else ""))
    bundle_files.cache_clear()
    materialize.cache_clear()
    try:
        after = Path(materialize("guest"))
    finally:
        monkeypatch.undo()
        bundle_files.cache_clear()
        materialize.cache_clear()
    assert before != after
    assert {p.name for p in before.iterdir()} ^ {p.name for p in after.iterdir()} == {
        bundle_name("join"),
        next(p.name for p in after.iterdir() if p.name.startswith("join-")),
    }
    assert pulumi.FileArchive(str(after)).path == str(after)


def test_the_plan_names_the_agent_and_every_steps_fingerprint() -> None:
    from proxmox_gpu_cluster.render.agent_bundle import agent_lines, agent_summary, agent_version

    summary = agent_summary()
    assert set(summary) == {"guest", "host"}
    assert summary["guest"]["steps"] == {step: fingerprint(step) for step in GUEST_STEPS}
    lines = agent_lines()
    assert lines[0].startswith(f"guest {agent_version('guest')}: cloud-init {fingerprint('cloud-init')}, driver ")
    assert lines[1].startswith(f"host {agent_version('host')}: host-prep {fingerprint('host-prep')}")


def test_without_a_writable_cache_the_copy_goes_to_a_private_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv(agent_bundle.CACHE_ENV, str(blocked / "cache"))
    materialize.cache_clear()
    try:
        path = Path(materialize("host"))
    finally:
        materialize.cache_clear()
    assert path.is_dir() and not str(path).startswith(str(blocked))
    assert (path.parent.parent.stat().st_mode & 0o777) == 0o700  # mkdtemp: nobody else can plant a bundle there


def test_the_declared_pulumi_command_copies_into_an_existing_directory() -> None:
    # The agent is copied again into ~/.proxmox-gpu-cluster/agent whenever it changes; pulumi-command 1.0.0's
    # CopyToRemote created the directory unconditionally and failed the second time (fixed in 1.0.1, #496).
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    spec = next(d for d in pyproject["project"]["dependencies"] if d.startswith("pulumi-command"))
    floor = re.search(r">=([0-9.]+)", spec)
    assert floor is not None and tuple(int(p) for p in floor[1].split(".")) >= (1, 0, 1), spec
