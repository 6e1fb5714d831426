"""Bad command-line arguments of the plan CLI: one line per bad argument, exit 2, before any planning."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from proxmox_gpu_cluster.stacks.plan import main
from proxmox_gpu_cluster.stacks.plan.inputs import InputError, stack_file_at
from tests.support import base_spec


def stack(tmp_path: Path) -> Path:
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(yaml.safe_dump({"config": {"proxmox-gpu-cluster:cluster": base_spec()}}))
    return path


def errors(capsys: pytest.CaptureFixture[str]) -> list[str]:
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


def test_out_onto_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "plan.txt"
    file.write_text("keep me")
    assert main(["--placeholder-secrets", "t", "--config", str(stack(tmp_path)), "--out", str(file)]) == 2
    assert errors(capsys) == [f"--out {file}: is a file; give a folder (created if missing)"]
    assert main(["--placeholder-secrets", "t", "--config", str(stack(tmp_path)), "--out", str(file / "sub")]) == 2
    assert errors(capsys) == [f"--out {file / 'sub'}: {file} is a file; give a folder (created if missing)"]
    assert file.read_text() == "keep me"


@pytest.mark.parametrize("arg", ["pve1", "pve1:x.json", "=x.json", "pve1=", " = "])
def test_pci_without_node_equals_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], arg: str) -> None:
    assert main(["--placeholder-secrets", "t", "--config", str(stack(tmp_path)), "--pci", arg]) == 2
    assert errors(capsys) == [f"--pci {arg}: expected NODE=FILE (a Proxmox node name, '=', and its PCI device list)"]


@pytest.mark.parametrize(
    ("ref", "line"),
    [
        ("", "--diff-base: empty; expected a git revision such as origin/main or HEAD~1"),
        ("  ", "--diff-base: empty; expected a git revision such as origin/main or HEAD~1"),
        ("HEAD main", "--diff-base HEAD main: expected a git revision such as origin/main or HEAD~1"),
        ("--output=/tmp/x", "--diff-base --output=/tmp/x: expected a git revision such as origin/main or HEAD~1"),
        ("HEAD:Pulumi.yaml", "--diff-base HEAD:Pulumi.yaml: expected a git revision such as origin/main or HEAD~1"),
        ("a\x1b[2Jb", "--diff-base a\\x1b[2Jb: expected a git revision such as origin/main or HEAD~1"),
    ],
)
def test_bad_diff_base(tmp_path: Path, capsys: pytest.CaptureFixture[str], ref: str, line: str) -> None:
    assert main(["--placeholder-secrets", "t", "--config", str(stack(tmp_path)), f"--diff-base={ref}"]) == 2
    assert errors(capsys) == [line]


def test_no_git_on_path(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["--placeholder-secrets", "t", "--config", str(stack(tmp_path)), "--diff-base", "HEAD"]) == 2
    assert errors(capsys) == [
        "--diff-base HEAD: git is not on PATH (it reads the stack file as it was at that revision)"
    ]


def test_every_bad_argument_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "f"
    file.write_text("")
    args = ["t", "--config", str(stack(tmp_path)), "--out", str(file), "--pci", "x", "--pci", "y", "--diff-base="]
    assert main(args) == 2
    assert [line.split(":")[0] for line in errors(capsys)] == [f"--out {file}", "--pci x", "--pci y", "--diff-base"]


def test_stack_file_at_a_revision_is_checked_like_the_file(tmp_path: Path) -> None:
    """The --diff-base side goes through the same YAML checks: bytes that are not UTF-8, duplicate keys."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    path = tmp_path / "Pulumi.t.yaml"
    path.write_bytes(b"config:\n  a: \xff\n")
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@example.test", "-c", "user.name=t"]
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    with pytest.raises(InputError) as info:
        stack_file_at("HEAD", path)
    assert info.value.lines == ["HEAD:Pulumi.t.yaml:2: not UTF-8 text (byte 0xff at column 6); save the file as UTF-8"]
    with pytest.raises(InputError) as info:
        stack_file_at("nope", path)
    assert len(info.value.lines) == 1 and info.value.lines[0].startswith("--diff-base nope: Pulumi.t.yaml: fatal:")


@pytest.mark.parametrize(
    "argv", [["--bogus\x1b[2J"], [], ["t", "--pci"], ["t", "--diff-base", "a", "--diff-config", "b"]]
)
def test_usage_errors_are_one_escaped_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    lines = errors(capsys)
    assert len(lines) == 1 and lines[0].startswith("python -m proxmox_gpu_cluster.plan: "), lines
    assert lines[0].endswith(" (see --help)") and lines[0].isprintable()


def test_proxmox_access_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from proxmox_gpu_cluster.stacks.proxmox_access import main as access_main

    with pytest.raises(SystemExit) as info:
        access_main(["prod", "--user"])
    assert info.value.code == 2
    assert errors(capsys) == [
        "python -m proxmox_gpu_cluster.stacks.proxmox_access: argument --user: expected one argument (see --help)"
    ]
