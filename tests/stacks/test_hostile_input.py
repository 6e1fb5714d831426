"""Hostile or broken stack files never crash, hang or leak: one line per problem (``FILE:LINE:`` for YAML), exit 2,
no traceback, and the CLI returns in seconds (a subprocess with a timeout, so a hang fails instead of blocking)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from proxmox_gpu_cluster.core.input_safety import MAX_DEPTH
from proxmox_gpu_cluster.stacks import stack_yaml
from proxmox_gpu_cluster.stacks.plan import main
from proxmox_gpu_cluster.stacks.proxmox_access import main as access_main
from proxmox_gpu_cluster.stacks.stack_yaml import MAX_BYTES
from tests.support import ROOT, base_spec

KEY = "proxmox-gpu-cluster:cluster"
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def good_yaml() -> str:
    return yaml.safe_dump({"config": {KEY: base_spec()}}, sort_keys=False)


def plan_cli(tmp_path: Path, data: str | bytes, *args: str) -> tuple[int, list[str], str]:
    """Run the plan CLI as a process on a stack file holding ``data``: exit code, stderr lines, stack file path.
    The timeout is the hang detector: every refusal here takes well under a second besides interpreter start."""
    path = tmp_path / "Pulumi.t.yaml"
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    proc = subprocess.run(
        [sys.executable, "-m", "proxmox_gpu_cluster.plan", "--placeholder-secrets", "t", "--config", str(path), *args],
        cwd=ROOT,
        capture_output=True,
        timeout=20,
        check=False,
    )
    err = proc.stderr.decode()
    assert "Traceback" not in err
    assert proc.stdout == b""
    return proc.returncode, err.splitlines(), str(path)


def laughs(indent: str, levels: int = 9) -> str:
    """A billion-laughs alias bomb as YAML lines at ``indent``: 9**levels values from a few hundred bytes."""
    lines = [f"{indent}l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels + 1):
        lines.append(f"{indent}l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["top", "config", "spec"])
def test_alias_bomb_anywhere_is_refused_before_processing(tmp_path: Path, where: str) -> None:
    text = good_yaml()
    if where == "top":
        text = laughs("") + text
    elif where == "config":
        text = text.replace("config:\n", "config:\n" + laughs("  "), 1)
    else:
        text = text.replace(f"  {KEY}:\n", f"  {KEY}:\n" + laughs("    "), 1)
    code, lines, path = plan_cli(tmp_path, text)
    assert code == 2
    assert len(lines) == 1
    assert re.fullmatch(rf"{re.escape(path)}:\d+: expands to more than \d+ values .*", lines[0]), lines


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    text = good_yaml().replace("config:\n", "config:\n  loop: &me [1, *me]\n", 1)
    code, lines, path = plan_cli(tmp_path, text)
    assert (code, lines) == (2, [f"{path}:2: alias *me refers to a node that contains it (recursive)"])


@pytest.mark.parametrize(("where", "junk"), [("top", "[" * 50_000), ("spec", "{a: " * 50_000), ("config", "- " * 200)])
def test_deeply_nested_junk_anywhere_is_refused(tmp_path: Path, where: str, junk: str) -> None:
    closing = "]" * junk.count("[") + "}" * junk.count("{")
    if where == "top":
        text = f"junk: {junk}{closing}\n" + good_yaml()
    elif where == "spec":
        text = good_yaml().replace(f"  {KEY}:\n", f"  {KEY}:\n    junk: {junk}1{closing}\n", 1)
    else:
        text = good_yaml() + f"  junk:\n    {junk}x\n"
    code, lines, path = plan_cli(tmp_path, text)
    assert code == 2
    assert len(lines) == 1
    assert re.fullmatch(rf"{re.escape(path)}:\d+: nested more than {MAX_DEPTH} levels deep; .*", lines[0]), lines


@pytest.mark.parametrize("loader", ["CSafeLoader", "SafeLoader"])
@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 1001, 5000])
def test_depth_refusal_reads_the_same_whichever_yaml_scanner_refuses_first(
    monkeypatch: pytest.MonkeyPatch, loader: str, levels: int
) -> None:
    """libyaml (PyYAML >= 6.0.4) refuses a 1001st flow level in its scanner, which looks up to 1024 characters ahead,
    before the budget walk counts level MAX_DEPTH + 1; the user sees one refusal either way."""
    if not hasattr(yaml, loader):
        pytest.skip(f"this PyYAML has no {loader} (built without libyaml)")
    monkeypatch.setattr(stack_yaml, "_Loader", getattr(yaml, loader))
    text = "x: 1\ny: " + "[" * levels + "]" * levels + "\n"
    with pytest.raises(stack_yaml.StackYamlError) as err:
        stack_yaml.load_stack_yaml(text, "f.yaml")
    assert str(err.value) == f"f.yaml:2: nested more than {MAX_DEPTH} levels deep; refusing to read further"


def test_non_utf8_bytes_name_the_line(tmp_path: Path) -> None:
    data = good_yaml().encode().replace(b"name: mig-1", b"name: mig-\xff1")
    line = data[: data.index(b"\xff")].count(b"\n") + 1
    code, lines, path = plan_cli(tmp_path, data)
    assert (code, lines) == (2, [f"{path}:{line}: not UTF-8 text (byte 0xff at column 17); save the file as UTF-8"])


def test_tab_indentation_is_one_line(tmp_path: Path) -> None:
    code, lines, path = plan_cli(tmp_path, good_yaml().replace(f"  {KEY}:", f"\t{KEY}:", 1))
    assert (code, lines) == (2, [f"{path}:2: a tab character in the indentation; YAML indents with spaces only"])


@pytest.mark.parametrize(
    ("text", "line", "says"),
    [
        ("config:\n  a: [1, 2\n  b: 3\n", 3, "did not find expected ',' or ']'"),
        ("config:\n  a: b: c\n", 2, "mapping values are not allowed"),
        ("config:\n  - a\n  b: 1\n", 3, "did not find expected '-' indicator"),
        ("config: {}\n---\nconfig: {}\n", 2, "expected a single document"),
        ("config:\n  a: *nowhere\n", 2, "found undefined alias"),
        ("config:\n  a: 'bell \x07'\n", 2, "control character #x0007 is not allowed"),
        ("config:\n  a: !!python/object/apply:os.system [true]\n", 2, "could not determine a constructor"),
        (f"config:\n  a: {'9' * 5000}\n", 2, "a number with 5000 digits is beyond every bound"),
    ],
)
def test_yaml_syntax_errors_are_one_line_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int, says: str
) -> None:
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(text)
    assert main(["t", "--config", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{path}:{line}: ") and says in lines[0], lines


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("config:\n", "config:\n  other: 1\n  other: 2\n", ":3: duplicate key 'other' (first at line 2)"),
        ("      vmid: 2001\n", "      vmid: 2001\n      vmid: 2009\n", ":37: duplicate key 'vmid' (first at line 36)"),
    ],
)
def test_duplicate_keys_are_an_error_not_last_wins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, expected: str
) -> None:
    text = good_yaml()
    assert text.count(old) == 1
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(text.replace(old, new))
    assert main(["t", "--config", str(path)]) == 2
    column = new.splitlines()[-1].index(new.split()[-2].rstrip(":")) + 1
    assert capsys.readouterr().err.splitlines() == [
        f"{path}{expected}; YAML would silently keep only the last (column {column})"
    ]


def test_merge_keys_still_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``<<:`` merges are the one intended way to override a key; they are not duplicates."""
    from proxmox_gpu_cluster.stacks.stack_yaml import load_stack_yaml

    assert load_stack_yaml("base: &b {a: 1, c: 3}\nmine:\n  <<: *b\n  a: 2\n", "f")["mine"] == {"a": 2, "c": 3}


def test_control_characters_are_shown_escaped(tmp_path: Path) -> None:
    spec = base_spec()
    spec["workers"][0]["name"] = "evil\x1b[2J\x1b]0;pwned\x07"
    spec["workers"][0]["bad\u2028key\x9b"] = 1
    spec["proxmox"]["nodes"][0]["gpus"][0]["model"] = "A100\r\nfake: line"
    code, lines, _ = plan_cli(tmp_path, yaml.safe_dump({"config": {KEY: spec}}))
    assert code == 2
    assert not any(CONTROL.search(line) for line in lines), lines
    assert f"{KEY}.workers[0].bad\\u2028key\\x9b: unknown key (keys are camelCase; check the spelling)" in lines
    assert any("'A100\\r\\nfake: line'" in line for line in lines), lines
    assert len(lines) == 3


SECTIONS = ["proxmox", "workers", "kubernetes", "guest", "gpuOperator", "kubevirt", "quotas", "priorityClasses"]


def test_null_sections_are_worded_plainly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = base_spec()
    for section in SECTIONS:
        spec[section] = None
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(yaml.safe_dump({"config": {KEY: spec}}))
    assert main(["t", "--config", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    optional = ", or leave the key out for the default"
    assert lines == [
        f"{KEY}.gpuOperator: is empty (null); expected a mapping{optional}",
        f"{KEY}.guest: is empty (null); expected a mapping",
        f"{KEY}.kubernetes: is empty (null); expected a mapping",
        f"{KEY}.kubevirt: is empty (null); expected a mapping{optional}",
        f"{KEY}.priorityClasses: is empty (null); expected a list{optional}",
        f"{KEY}.proxmox: is empty (null); expected a mapping",
        f"{KEY}.quotas: is empty (null); expected a list{optional}",
        f"{KEY}.workers: is empty (null); expected a list",
    ]


def test_nested_null_sections_are_worded_plainly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = base_spec()
    spec["workers"][0].update(network=None, image=None, gpus=None)
    spec["kubernetes"]["drain"] = None
    spec["gpuOperator"].update(driverUpgrade=None, monitoring=None, smokeTest=None, dra=None)
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(yaml.safe_dump({"config": {KEY: spec}}))
    assert main(["t", "--config", str(path)]) == 2
    optional = ", or leave the key out for the default"
    assert capsys.readouterr().err.splitlines() == [
        f"{KEY}.gpuOperator.dra: is empty (null); expected a mapping{optional}",
        f"{KEY}.gpuOperator.driverUpgrade: is empty (null); expected a mapping{optional}",
        f"{KEY}.gpuOperator.monitoring: is empty (null); expected a mapping{optional}",
        f"{KEY}.gpuOperator.smokeTest: is empty (null); expected a mapping{optional}",
        f"{KEY}.kubernetes.drain: is empty (null); expected a mapping{optional}",
        f"{KEY}.workers[0].gpus: is empty (null); expected a list",
        f"{KEY}.workers[0].image: is empty (null); expected a mapping{optional}",
        f"{KEY}.workers[0].network: is empty (null); expected a mapping{optional}",
    ]


def test_proxmox_access_refuses_hostile_files_the_same_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "Pulumi.t.yaml"
    for text, says in [(laughs("") + good_yaml(), "expands to more than"), ("a: 1\na: 2\n", "duplicate key 'a'")]:
        path.write_text(text)
        assert access_main(["t", "--config", str(path)]) == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{path}:") and says in lines[0], lines


def test_endless_or_huge_files_are_refused_without_reading_them_whole(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "proxmox_gpu_cluster.plan", "--placeholder-secrets", "t", "--config", "/dev/zero"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert (proc.returncode, proc.stderr.splitlines()) == (
        2,
        [f"/dev/zero: larger than {MAX_BYTES} bytes; not a stack file"],
    )


def test_junk_pci_files_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, data in [("deep.json", b"[" * 100_000), ("latin1.json", b'[{"id": "\xe9"}]')]:
        (tmp_path / name).write_bytes(data)
        assert main(["dev", "--pci", f"pve1={tmp_path / name}"]) == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"--pci pve1={tmp_path / name}: "), lines
