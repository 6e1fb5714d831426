"""Contract of the fake ``qm`` the retirement and MIG-restart tests run (fakeqm.py, through fakekube's
``install_qm`` and fakemig's ``install_vm``), against qemu-server's own code: ``src/PVE/CLI/qm.pm`` (PVE::CLI::qm,
method ``exec`` with ``--timeout``, and ``$print_agent_result``) and ``src/PVE/QemuServer/Agent.pm``
(``assert_agent_available``, ``qemu_exec_status``). Each case states what that code does."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.components.scripts.fakekube import install_qm
from tests.components.scripts.fakemig import install_vm
from tests.components.scripts.fakeroot import FakeRoot
from tests.support import external


@pytest.fixture(autouse=True)
def _python() -> None:
    external(Path("/usr/bin/python3"), "python3", "install it with: apt-get install python3")


@pytest.fixture(params=["fakekube", "fakemig"])
def host(request: pytest.FixtureRequest, tmp_path: Path) -> FakeRoot:
    host, guest = FakeRoot(tmp_path / "host"), FakeRoot(tmp_path / "guest")
    (install_qm if request.param == "fakekube" else install_vm)(host, guest)
    return host


def qm(host: FakeRoot, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{host.bin}:/usr/bin:/bin", "PGC_ROOT": str(host.root), "LC_ALL": "C"}
    return subprocess.run(["qm", *args], env=env, capture_output=True, text=True, check=False)


def test_a_finished_command_prints_its_status_object_and_exits_0(host: FakeRoot) -> None:
    # qm.pm exec: polls exec-status until "exited", then $print_agent_result prints the hash as pretty canonical
    # JSON; Agent.pm qemu_exec_status decodes out-data/err-data and turns the booleans into 1/0. qm's exit code is
    # 0 whatever the command's.
    proc = qm(host, "guest", "exec", "3201", "--timeout", "30", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert proc.returncode == 0 and proc.stderr == ""
    assert json.loads(proc.stdout) == {"exitcode": 3, "exited": 1, "out-data": "out\n", "err-data": "err\n"}
    assert proc.stdout.startswith("{\n   ")  # pretty: the JSON module's three-space indent


def test_a_timeout_warns_on_stderr_and_prints_the_pid_on_stdout_with_exit_0(host: FakeRoot) -> None:
    # qm.pm exec: when the loop ends without "exited": warn "timeout reached, returning pid\n" and return the
    # guest-exec reply ({pid}); warn goes to stderr, the result to stdout, and the command still succeeds.
    host.write("fake-exec-timeout", "0.3")
    proc = qm(host, "guest", "exec", "3201", "--timeout", "600", "--", "sleep", "3")
    assert proc.returncode == 0
    assert proc.stderr == "timeout reached, returning pid\n"
    result = json.loads(proc.stdout)
    assert set(result) == {"pid"} and isinstance(result["pid"], int)  # no "exited", no "exitcode"
    both = proc.stderr + proc.stdout  # what a step that read both streams as JSON got: not JSON
    with pytest.raises(json.JSONDecodeError):
        json.loads(both)


@pytest.mark.parametrize(
    ("knob", "status", "message"),
    [
        ("fake-no-agent", "running", "No QEMU guest agent configured"),
        (None, "stopped", "VM 3201 is not running"),
        ("agent-dead", "running", "QEMU guest agent is not running"),
    ],
)
def test_an_agent_that_cannot_be_reached_dies_with_qemu_servers_message(
    host: FakeRoot, knob: str | None, status: str, message: str
) -> None:
    # Agent.pm assert_agent_available, in this order: no "agent" in the config, VM not running, guest-ping fails.
    if knob:
        host.write(knob, "")
    host.write("fake-vm-status", status + "\n")
    for args in (["guest", "cmd", "3201", "ping"], ["guest", "exec", "3201", "--", "true"]):
        proc = qm(host, *args)
        assert proc.returncode != 0 and proc.stdout == "" and proc.stderr == message + "\n", args


def test_ping_prints_nothing_when_the_agent_answers(host: FakeRoot) -> None:
    # $print_agent_result: an empty hash (guest-ping's reply) prints nothing.
    proc = qm(host, "guest", "cmd", "3201", "ping")
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""
