"""The capacity gate in a fake guest: kubectl (with kubelet's credential) answers a sequence of Node objects, so
the gate sees the device plugin catch up, or times out and names the likely cause from the node's labels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxmox_gpu_cluster.render.guest_scripts import capacity_args
from tests.components.scripts.fakeroot import FakeRoot

KUBECTL = r"""
import json, sys
state = sys.argv[1]
args = sys.argv[2:]
assert args[args.index("--kubeconfig") + 1].endswith("/etc/kubernetes/kubelet.conf"), args
answers = json.load(open(state))
answer = answers.pop(0) if len(answers) > 1 else answers[0]
json.dump(answers, open(state, "w"))
if answer is None:
    sys.exit(print("Unable to connect to the server: dial tcp 10.0.0.1:6443: connect: connection refused", file=sys.stderr) or 1)
print(json.dumps(answer))
"""
READY = {"nvidia.com/gpu.present": "true", "nvidia.com/device-plugin.config": "time-slicing-4-abc"}


def node(allocatable: dict[str, str], **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1", "labels": {**READY, **labels}}, "status": {"allocatable": allocatable}}


def guest(tmp_path: Path, answers: list[dict[str, Any] | None], kubelet_conf: bool = True) -> FakeRoot:
    root = FakeRoot(tmp_path)
    state = tmp_path / "answers.json"
    state.write_text(json.dumps(answers))
    (tmp_path / "kubectl.py").write_text(KUBECTL)
    root.stub_script("kubectl", f'python3 "{tmp_path / "kubectl.py"}" "{state}" "$@"')
    root.stub("sleep")  # no real waiting; the stub records each pause
    if kubelet_conf:
        root.write("/etc/kubernetes/kubelet.conf", "apiVersion: v1\nkind: Config\n")
    return root


def gate(root: FakeRoot, expected: dict[str, int], timeout: int = 60, config: str | None = None) -> Any:
    args = capacity_args("gpu-1", expected, timeout=timeout, device_plugin_config=config)
    return root.run_bundle("capacity", *[*args, "--interval", "10"])


def test_passes_at_once_when_the_node_advertises_the_plan(tmp_path: Path) -> None:
    root = guest(tmp_path, [node({"nvidia.com/gpu": "4", "cpu": "16"})])
    result = gate(root, {"nvidia.com/gpu": 4})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "capacity: ok: gpu-1 advertises nvidia.com/gpu=4"
    assert [c.split()[0] for c in result.calls] == ["kubectl"]


def test_waits_for_the_device_plugin_to_catch_up(tmp_path: Path) -> None:
    answers = [None, node({"nvidia.com/gpu": "1"}), node({"nvidia.com/gpu": "1"}), node({"nvidia.com/gpu": "4"})]
    result = gate(guest(tmp_path, answers), {"nvidia.com/gpu": 4})
    assert result.returncode == 0, result.stderr
    assert sum(c.startswith("sleep") for c in result.calls) == 3


@pytest.mark.parametrize(
    ("labels", "cause"),
    [
        ({"nvidia.com/mig.config.state": "pending"}, "MIG reconfiguration is pending"),
        ({"nvidia.com/device-plugin.config": "default"}, "the device-plugin config label is not applied"),
        ({}, "the device plugin has not advertised this configuration yet"),
    ],
)  # fmt: skip
def test_times_out_naming_node_expected_seen_and_cause(tmp_path: Path, labels: dict[str, str], cause: str) -> None:
    root = guest(tmp_path, [node({"nvidia.com/mig-1g.5gb": "2"}, **labels)])
    result = gate(root, {"nvidia.com/mig-1g.5gb": 7}, timeout=30, config="time-slicing-4-abc")
    assert result.returncode == 1
    assert result.stderr.startswith(
        "capacity: node gpu-1 allocatable: expected nvidia.com/mig-1g.5gb=7, "
        "saw nvidia.com/mig-1g.5gb=2 after 30s; likely: "
    )
    assert cause in result.stderr
    assert sum(c.startswith("sleep") for c in result.calls) == 3  # bounded: 30 s at 10 s intervals, 4 reads


def test_a_failed_mig_reconfiguration_fails_at_once(tmp_path: Path) -> None:
    labels = {"nvidia.com/mig.config.state": "failed", "nvidia.com/mig.config": "custom-1"}
    result = gate(guest(tmp_path, [node({"nvidia.com/mig-1g.5gb": "0"}, **labels)]), {"nvidia.com/mig-1g.5gb": 7})
    assert result.returncode == 1
    assert "the MIG configuration failed (nvidia.com/mig.config.state=failed, config custom-1)" in result.stderr
    assert "nvidia-mig-manager pod logs" in result.stderr
    assert not [c for c in result.calls if c.startswith("sleep")]


def test_an_unlabelled_node_points_at_the_operator(tmp_path: Path) -> None:
    bare = {"metadata": {"name": "gpu-1", "labels": {}}, "status": {"allocatable": {}}}
    result = gate(guest(tmp_path, [bare]), {"nvidia.com/gpu": 1}, timeout=10)
    assert "the GPU Operator has not labelled this node yet" in result.stderr
    assert "saw nvidia.com/gpu=0" in result.stderr


def test_an_unreachable_api_server_is_the_cause_after_the_timeout(tmp_path: Path) -> None:
    result = gate(guest(tmp_path, [None]), {"nvidia.com/gpu": 1}, timeout=10)
    assert result.returncode == 1 and "likely: kubectl failed: Unable to connect to the server" in result.stderr


def test_a_node_that_has_not_joined_fails_at_once(tmp_path: Path) -> None:
    result = gate(guest(tmp_path, [node({})], kubelet_conf=False), {"nvidia.com/gpu": 1})
    assert result.returncode == 1 and result.calls == []
    assert "kubelet credential: expected /etc/kubernetes/kubelet.conf (the node has joined), saw no such file" in (
        result.stderr
    )


def test_arguments_are_checked(tmp_path: Path) -> None:
    root = guest(tmp_path, [node({})])
    result = root.run_bundle("capacity", "--node", "gpu-1", "--expect", "nvidia.com/gpu=4;reboot")
    assert result.returncode == 1 and "--expect: expected RESOURCE=COUNT" in result.stderr and result.calls == []
