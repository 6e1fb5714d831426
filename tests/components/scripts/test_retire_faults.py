"""Retirement against qm failures (retire_vm.sh on a fake Proxmox node, the guest's drain step through the fake
``qm guest exec``, fakeqm.py): a failing qm call is tried again and never skips the drain; qm failing on every try
fails the step in one line; only qm saying the guest is gone skips the drain, with the warning; the exec's JSON is
read from stdout only (qm warns on stderr with exit 0 on a timeout). Then fault injection: every host command of
the retirement failed, or the run killed before or after it, and run again: a run that exits 0 has drained the
node, and the second run finishes what the first left."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakekube import FakeCluster, Pod, install_qm
from tests.components.scripts.fakeroot import FAULT_MODES, FakeRoot
from tests.components.scripts.test_retire import KUBECONFIG, NODE, _tools, make_guest, retire

pytestmark = pytest.mark.usefixtures(_tools.__name__)

BROKEN = 'echo "ipcc_send_rec[1] failed: Connection refused" >&2; exit 255'
"""qm while pmxcfs does not answer (PVE::IPCC): a failure that passes."""


def setup(root: Path) -> tuple[FakeRoot, FakeGuest, FakeCluster]:
    """A Proxmox node whose VM 3201 runs the guest joined as NODE, its agent copy installed (as test_retire's)."""
    root.mkdir(parents=True, exist_ok=True)
    cluster = FakeCluster(root / "api.json", KUBECONFIG, nodes=[NODE, "gpu-a10-b"])
    cluster.pods = [Pod("ml", "infer-7d9f", NODE), Pod("ml", "other", "gpu-a10-b")]
    cluster.save()
    guest = make_guest(root / "guest", cluster)
    host = FakeRoot(root / "host")
    install_qm(host, guest)
    guest.install_bundle("drain")
    return host, guest, cluster


def drained(cluster: FakeCluster) -> bool:
    return NODE not in cluster.state()["nodes"]


@pytest.mark.parametrize("nth", [1, 2, 3, 4])
def test_one_failing_qm_call_is_tried_again_and_the_node_is_drained(tmp_path: Path, nth: int) -> None:
    # nth: qm status, the ping, the test -f exec, the drain exec (the host's stubbed commands: id first).
    probe, _, _ = setup(tmp_path / "probe")
    calls = [c for c in retire(probe).calls if c.startswith("qm ")]
    host, _, cluster = setup(tmp_path / "run")
    host.fault(1 + nth, "fail")  # id is the first stubbed command
    r = retire(host)
    hit = host.fault_hit()
    assert hit == calls[nth - 1], hit
    assert r.returncode == 0 and drained(cluster), r.stdout + r.stderr
    assert f"retire: {' '.join(hit.split()[:3]) if hit.startswith('qm guest') else 'qm status'}" in r.stdout
    assert "was not drained" not in r.stdout


@pytest.mark.parametrize("check", [False, True])
def test_qm_failing_on_every_try_fails_the_step_in_one_line(tmp_path: Path, check: bool) -> None:
    host, _, cluster = setup(tmp_path)
    host.stub_script("qm", BROKEN)
    r = retire(host, check=check)
    assert r.returncode == 1 and r.stderr.splitlines() == [
        "retire: qm status on VM 3201: expected an answer (tried 5 times), saw exit 255: ipcc_send_rec[1] failed: "
        "Connection refused"
    ], r.stderr
    assert [c for c in r.calls if c.startswith("qm")] == ["qm status 3201"] * 5
    assert not drained(cluster) and "was not drained" not in r.stdout


@pytest.mark.parametrize(
    ("knob", "why"),
    [
        ("fake-no-agent", "VM 3201's guest agent does not answer (No QEMU guest agent configured)"),
        ("agent-dead", "VM 3201's guest agent does not answer (QEMU guest agent is not running)"),
    ],
)
def test_only_a_guest_agent_that_is_gone_skips_the_drain(tmp_path: Path, knob: str, why: str) -> None:
    host, _, cluster = setup(tmp_path)
    host.write(knob, "")
    r = retire(host)
    assert not drained(cluster)
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith(f"retire: warning: {why}: {NODE} was not drained")
    pings = [c for c in r.calls if c.startswith("qm guest cmd")]
    assert len(pings) == (1 if knob == "fake-no-agent" else 5)  # not configured is final; not running is tried


def test_a_drain_that_outlives_qms_timeout_fails_with_the_pid_not_a_parse_error(tmp_path: Path) -> None:
    host, guest, _ = setup(tmp_path)
    # qm.pm: "timeout reached, returning pid" on stderr, {"pid": N} on stdout, exit 0. Reading both streams as JSON
    # failed on the parse; the step now names the timeout.
    guest.stub_script("kubectl", "/bin/sleep 2")
    host.write("fake-exec-timeout", "0.5")
    r = retire(host)
    assert r.returncode == 1
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(
        "retire: guest exec: expected the retire step to finish within 780s, saw it still runs in VM 3201 (pid "
    )
    assert "malformed" not in r.stderr and "JSON" not in r.stderr


@pytest.mark.slow
def test_the_retirement_converges_from_every_host_fault(tmp_path: Path) -> None:
    cases, failures = 0, []
    for mode in FAULT_MODES:
        for at in range(1, 100):
            h, _, c = setup(tmp_path / f"{mode}-{at}")
            h.fault(at, mode)
            first = retire(h)
            hit = h.fault_hit()
            h.fault(None)
            if hit is None:
                break
            cases += 1
            if first.returncode == 0 and not drained(c):
                failures.append(f"{mode} at {at} ({hit}): exit 0 without the drain: {first.stdout.strip()}")
                continue
            again = retire(h)
            if again.returncode or not drained(c) or "Node object stays" in again.stdout:
                failures.append(f"{mode} at {at} ({hit}): second run exit {again.returncode}: {again.stderr.strip()}")
    assert cases > 10 and not failures, f"{len(failures)}/{cases}:\n" + "\n".join(failures[:5])
