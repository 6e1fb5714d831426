"""agent/upgrade.py, the join step's questions to the API server during a minor upgrade: the API server's minor
(from /version, which kubectl serves raw only) and the wait for the restarted kubelet's report. Against a stand-in
for kubectl's answers; the real API server answers them in tests/components/scripts/test_kubernetes_upgrade.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.agent.agent import kubeapi, load

upgrade = load("upgrade")


class Answers:
    """kubectl's answers, in order: ``/version``'s body, or Node objects with a kubeletVersion."""

    def __init__(self, *answers: str) -> None:
        self.answers: Iterator[str] = iter(answers)
        self.asked: list[tuple[str, ...]] = []

    def __call__(self, *args: str) -> str:
        self.asked.append(args)
        return next(self.answers)

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))


def node(version: str) -> str:
    return json.dumps({"status": {"nodeInfo": {"kubeletVersion": version}}})


def test_the_api_servers_minor_is_read_from_version_without_an_output_flag() -> None:
    kube = Answers(json.dumps({"major": "1", "minor": "34", "gitVersion": "v1.34.4"}))
    assert upgrade.server_minor(kube) == (34, "v1.34.4")
    assert kube.asked == [("get", "--raw", "/version")]  # kubectl refuses --raw with -o


@pytest.mark.parametrize("body", ["not json", "[]", json.dumps({"gitVersion": "v2.0.0"}), json.dumps({})])
def test_an_unreadable_version_fails_in_one_line(body: str) -> None:
    with pytest.raises(kubeapi.Failure, match=r"^join: API server /version: expected a gitVersion v1.N.P, saw "):
        upgrade.server_minor(Answers(body))


def test_an_api_server_below_the_minor_refuses_and_says_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(kubeapi.Failure) as failure:
        upgrade.check_server(Answers(json.dumps({"gitVersion": "v1.34.4"})), 35)
    assert str(failure.value) == (
        "join: API server version: expected 1.35 or later (a kubelet is never newer than its API server), saw "
        "v1.34.4: upgrade the control plane first (kubeadm upgrade apply), then run pulumi up again"
    )
    upgrade.check_server(Answers(json.dumps({"gitVersion": "v1.35.0"})), 35)
    assert capsys.readouterr().out == "kubernetes: API server v1.35.0\n"


def test_the_wait_ends_when_the_node_reports_the_version_and_is_bounded() -> None:
    slept: list[int] = []
    kube = Answers(node("v1.33.6"), node("v1.33.6"), node("v1.34.2"))
    upgrade.wait_kubelet(kube, "gpu-a", "v1.34.2", 60, poll=5, sleep=slept.append)
    assert slept == [5, 5]
    stuck = Answers(*[node("v1.33.6")] * 4)
    with pytest.raises(kubeapi.Failure) as failure:
        upgrade.wait_kubelet(stuck, "gpu-a", "v1.34.2", 10, poll=5, sleep=slept.append)
    assert str(failure.value) == "join: node gpu-a kubeletVersion within 10s: expected v1.34.2, saw v1.33.6"


def test_an_unknown_command_fails_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert upgrade.main(["rollback", "--kubeconfig", "k", "--api", "a:1"]) == 1
    assert capsys.readouterr().err.startswith("join: upgrade.py command: expected server or kubelet, saw rollback")
