"""0/1 flags never reach bash arithmetic unchecked: ``((flag))`` evaluates its operand, and an array subscript in
it runs command substitutions (bash manual, "Shell Arithmetic": a variable's value is evaluated as an arithmetic
expression), so ``PATH[$(cmd)]`` would run ``cmd``. Each step refuses such a value in its one failure line before
any ``((…))`` sees it; the steps run as installed (their agent bundles, real bash)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakehost import FakeHost
from tests.components.scripts.fakeroot import SCRIPTS, FakeRoot


def evil(tmp_path: Path) -> tuple[str, Path]:
    canary = tmp_path / "canary"
    return f"PATH[$(touch {canary})]", canary


@pytest.mark.parametrize("flag", ["--vfio", "--kvm", "--nvidia-smi", "--containerd-nvidia"])
def test_guest_verify_refuses_a_flag_that_is_not_0_or_1(tmp_path: Path, flag: str) -> None:
    value, canary = evil(tmp_path)
    guest = FakeGuest(tmp_path / "guest")
    r = guest.run_bundle("verify", "--gpu", "10de:2236=NVIDIA-A10", flag, value)
    assert r.returncode == 1 and not canary.exists()
    assert r.stderr.splitlines() == [
        "verify: arguments: expected 0 or 1 for --vfio, --kvm, --nvidia-smi and --containerd-nvidia, saw "
        + " ".join(
            f"'{value}'" if f == flag else "'0'" for f in ("--vfio", "--kvm", "--nvidia-smi", "--containerd-nvidia")
        )
    ]


def test_host_verify_refuses_a_nested_flag_that_is_not_0_or_1(tmp_path: Path) -> None:
    value, canary = evil(tmp_path)
    host = FakeHost(tmp_path / "host")
    r = host.run_bundle("host-verify", "--gpu", "0000:41:00", "--nested", value)
    assert r.returncode == 1 and not canary.exists()
    assert r.stderr.splitlines() == [f"host-verify: arguments: expected --nested 0 or 1, saw '{value}'"]


def test_retire_refuses_a_check_flag_that_is_not_0_or_1(tmp_path: Path) -> None:
    value, canary = evil(tmp_path)
    host = FakeRoot(tmp_path / "host")
    args = ["--vmid", "3201", "--node-name", "w", "--timeout", "60", "--guest-step", "/root/x/step.sh"]
    r = host.run_bundle("retire", *args, "--check", value, "--", "--node-name", "w")
    assert r.returncode == 1 and not canary.exists()
    assert r.stderr.splitlines() == [f"retire: --check: expected 0 or 1, saw '{value}'"]


def test_every_flag_an_argument_sets_is_checked_before_arithmetic() -> None:
    # A variable set from an argument ("$2") and then used as ((name)) must be matched against 0/1 (or digits) in
    # a [[ ]] test of the same script first: the scripts are searched, so a new flag without a check fails here.
    unchecked = []
    for script in sorted(SCRIPTS.glob("*.sh")):
        text = script.read_text()
        for name in sorted(set(re.findall(r"\b([A-Za-z_]+)=\"\$2\"", text))):
            if not re.search(rf"\(\(\s*!?{name}\b", text):
                continue
            check = re.search(rf'\[\[[^\]]*"\$(?:{name}|[a-z_]*\${name})[^\]]*(\[01\]|\^\[01\]|\[0-9\])', text)
            joint = re.search(rf'"\$[a-z_$]*{name}[a-z_$]*"\s*=~\s*\^\[01\]', text)
            loop = re.search(rf'for (\w+) in [^;\n]*"\${name}"[^\n]*\n\s*\[\[ "\$\1" =~ \^\[01\]', text)
            if not (check or joint or loop):
                unchecked.append(f"{script.name}: {name}")
    assert not unchecked, unchecked
