"""The node agent on the machine: a step runs from a bundle nothing writes into again, so a second copy of the agent
(another stack, or a standalone component, copying to the same node while a step runs) can never make a step
succeed without running; a step.sh cut short fails before anything ran; a removed agent directory fails in one
line naming the step. Run with real bash, as ``step_command`` renders the command, in a temporary home directory."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from proxmox_gpu_cluster.render import agent_bundle
from proxmox_gpu_cluster.render.agent_bundle import STEP_PATH, bundle_files, bundle_name, step_command
from proxmox_gpu_cluster.render.shipping import strip_comments

PADDING = (": " + "x" * 1000 + "\n") * 120
"""120 KB: beyond what bash has read of a script when the step reaches the line above it (in few lines: bash's
parser recurses per command of a list and overflows its stack at some 30 000 in one brace group)."""


def step_text(body: str) -> str:
    """A step.sh as bundle_files makes one: the real prologue, then ``body``."""
    text = strip_comments(agent_bundle._text("scripts", "agent_prologue.sh")) + "\n" + body
    whole = getattr(agent_bundle, "whole", None)
    return whole(text) if whole else text


def copy_bundle(home: Path, body: str) -> Path:
    """The agent's copy of a one-file bundle with ``body``, where CopyToRemote puts it: ~/.proxmox-gpu-cluster/agent/."""
    files = (("step.sh", step_text(body).encode()),)
    bundle = home / ".proxmox-gpu-cluster" / "agent" / f"probe-{agent_bundle._digest(files)[:12]}"
    bundle.mkdir(parents=True)
    (bundle / "step.sh").write_bytes(files[0][1])
    return bundle


def command(bundle: Path, *args: str) -> list[str]:
    """``step_command``'s argv for root, with the probe's bundle in place of a real step's."""
    words = shlex.split(step_command("root", "drain", list(args)))
    return [f".proxmox-gpu-cluster/agent/{bundle.name}/step.sh" if STEP_PATH.fullmatch(w) else w for w in words]


def run(argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=home, capture_output=True, text=True, check=False)


def rewrite_in_place(path: Path, keep: int) -> None:
    """What a second CopyToRemote does to a file (SFTP open with O_TRUNC, then write): here cut at ``keep`` bytes,
    as it is while that copy is still writing."""
    content = path.read_bytes()
    with path.open("r+b") as f:
        f.truncate(0)
        f.write(content[:keep])


def test_a_second_copy_racing_a_running_step_cannot_make_it_succeed_without_running(tmp_path: Path) -> None:
    # The step stops at a FIFO after the prologue checked the bundle; meanwhile another copy rewrites the agent's
    # step.sh in place (cut right after that line, as a copy still writing leaves it) and a second install runs.
    # Run from the file as it is read, bash would reach end-of-file there and exit 0 without its last line.
    home = tmp_path / "home"
    fifo = tmp_path / "go"
    os.mkfifo(fifo)
    head = 'if [[ "${2:-}" == wait ]]; then printf started > "$1.started"; read -r _ < "$3"; fi\n'
    bundle = copy_bundle(home, head + PADDING + 'touch "$1"\n')
    ran = tmp_path / "ran"
    step = subprocess.Popen(command(bundle, str(ran), "wait", str(fifo)), cwd=home, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not Path(f"{ran}.started").exists():
        assert step.poll() is None and time.monotonic() < deadline, step.stderr.read() if step.stderr else ""
        time.sleep(0.02)
    text = (bundle / "step.sh").read_text()
    store = home / ".proxmox-gpu-cluster" / "bundles" / bundle.name
    before = {p.name: p.stat().st_ino for p in store.iterdir()} if store.is_dir() else {}
    rewrite_in_place(bundle / "step.sh", text.index(head) + len(head))
    second = subprocess.run(command(bundle, f"{ran}-2"), cwd=home, capture_output=True, text=True, check=False)
    fifo.write_text("go\n")
    _, err = step.communicate(timeout=60)
    assert step.returncode != 0 or ran.exists(), "the step exited 0 without running its last line"
    assert step.returncode == 0 and ran.exists(), err  # and it did run: it reads from the store, not the copy
    assert second.returncode == 0 and Path(f"{ran}-2").exists(), second.stderr  # the store's bundle, complete
    assert {p.name: p.stat().st_ino for p in store.iterdir()} == before  # the second install left it alone


@pytest.mark.parametrize("keep", [0, 200, 2000, 6000])
def test_a_copy_cut_short_runs_nothing_and_installs_nothing(tmp_path: Path, keep: int) -> None:
    home = tmp_path / "home"
    bundle = copy_bundle(home, 'main() { touch "$1"; }\n' + PADDING + 'main "$@"\n')
    text = (bundle / "step.sh").read_bytes()
    rewrite_in_place(bundle / "step.sh", len(text) - len(b'main "$@"\n}\n') if keep == 6000 else keep)
    ran = tmp_path / "ran"
    proc = subprocess.run(command(bundle, str(ran)), cwd=home, capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and not ran.exists(), proc.stderr
    assert not (home / ".proxmox-gpu-cluster" / "bundles" / bundle.name).exists()
    (bundle / "step.sh").write_bytes(text)  # the copy completes: the next run installs and runs it
    proc = subprocess.run(command(bundle, str(ran)), cwd=home, capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and ran.exists(), proc.stderr


def test_every_bundle_cut_at_any_line_fails_to_parse(tmp_path: Path) -> None:
    # bash parses a whole brace group before running any of it: a step.sh that ends early is a syntax error.
    for step in ("host-prep", "drain", "retire"):
        text = dict(bundle_files(step))["step.sh"]
        cuts = [i + 1 for i, c in enumerate(text) if c == ord("\n")][:-1]
        script = tmp_path / "cut.sh"
        bad = []
        for cut in cuts[:: max(1, len(cuts) // 120)]:
            script.write_bytes(text[:cut])
            if subprocess.run(["bash", "-n", str(script)], capture_output=True, check=False).returncode == 0:
                bad.append(cut)
        assert not bad, f"{step}: cut after byte(s) {bad[:5]} still parses (bash would run the part it read)"


def test_a_complete_store_bundle_is_left_alone_and_a_damaged_one_is_replaced_beside_its_readers(tmp_path: Path) -> None:
    home = tmp_path / "home"
    bundle = copy_bundle(home, 'echo "ran $1"\n')
    assert run(command(bundle, "one"), home).stdout == "ran one\n"
    store = home / ".proxmox-gpu-cluster" / "bundles" / bundle.name
    inode = (store / "step.sh").stat().st_ino
    assert run(command(bundle, "two"), home).stdout == "ran two\n"
    assert (store / "step.sh").stat().st_ino == inode  # complete: never written again
    with (store / "step.sh").open("ab") as f:  # damaged by hand, still parses: its fingerprint is wrong
        f.write(b"\n# edited\n")
    proc = run(command(bundle, "three"), home)
    assert proc.returncode == 0 and proc.stdout == "ran three\n", proc.stderr
    assert (store / "step.sh").read_bytes() == (bundle / "step.sh").read_bytes()
    aside = [p for p in store.parent.iterdir() if p.name.startswith(f".old-{bundle.name}.")]
    assert len(aside) == 1 and (aside[0] / "step.sh").stat().st_ino == inode  # a reader of it keeps its file
    assert not [p for p in store.parent.iterdir() if p.name.startswith(".new-")]


def test_a_removed_agent_directory_fails_in_one_line_naming_the_step(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    for user, step in (("root", "host-verify"), ("ubuntu", "join")):
        argv = ["bash", "-c", step_command(user, step, ["--x", "1"]).removeprefix("sudo -n ")]
        proc = subprocess.run(argv, cwd=home, capture_output=True, text=True, check=False)
        path = f".proxmox-gpu-cluster/agent/{bundle_name(step)}/step.sh"
        assert proc.returncode == 1 and proc.stderr.splitlines() == [
            f"{step}: agent: expected {path}, saw nothing (the node agent copy is gone: replace this machine -agent "
            "resource with pulumi up --replace <its URN>)"
        ], proc.stderr


def test_runs_starting_together_on_a_new_bundle_all_run_from_the_store(tmp_path: Path) -> None:
    # Several steps (two stacks, or host prep and a worker's large-BAR step) start at once before the bundle is in
    # the store: each installs it, the first rename wins, and no run may move a complete bundle aside while another
    # is about to exec it ("step.sh: No such file or directory", seen in CI).
    for round_ in range(4):
        home = tmp_path / f"home{round_}"
        bundle = copy_bundle(home, 'echo "ran $1"\n')
        runs = [
            subprocess.Popen(
                command(bundle, str(i)), cwd=home, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            for i in range(8)
        ]
        outs = [run.communicate(timeout=60) for run in runs]
        assert [(run.returncode, out) for run, (out, _) in zip(runs, outs, strict=True)] == [
            (0, f"ran {i}\n") for i in range(8)
        ], outs
        store = home / ".proxmox-gpu-cluster" / "bundles"
        assert sorted(p.name for p in store.iterdir()) == [bundle.name]  # nothing aside, no .new- left
