"""mig_restart.sh against what ``qm guest exec`` really prints (fakeqm.py, after qemu-server's qm.pm): a guest MIG
step that outlives qm's timeout makes qm warn on stderr and print ``{"pid": N}`` on stdout with exit 0; the step
reads stdout only as JSON and fails naming the timeout, the pid and qm's warning (it read both streams as JSON and
failed on the parse)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxmox_gpu_cluster.render.agent_bundle import installed_step
from proxmox_gpu_cluster.render.guest_scripts import mig_args
from proxmox_gpu_cluster.render.host_scripts import mig_restart_args
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakekube import FakeCluster, Pod, kubelet_conf
from tests.components.scripts.fakemig import install_mig, install_vm
from tests.components.scripts.fakeroot import FakeRoot, Result
from tests.components.scripts.test_mig_mode import KUBECONFIG, NEW, NODE, OLD, VMID, B
from tests.support import external


@pytest.fixture(autouse=True)
def _tools() -> None:
    external(Path("/usr/bin/python3"), "python3", "install it with: apt-get install python3")
    external(Path("/usr/bin/perl"), "perl", "install it with: apt-get install perl")


def setup(tmp_path: Path) -> tuple[FakeRoot, FakeGuest]:
    cluster = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=[NODE], pods=[Pod("ml", "train-0", NODE)])
    cluster.labels = {NODE: {"nvidia.com/mig.config": OLD, "nvidia.com/mig.config.state": "success"}}
    cluster.save()
    guest = FakeGuest(tmp_path / "guest")
    cluster.install(guest)
    guest.write("etc/kubernetes/kubelet.conf", kubelet_conf(NODE)).chmod(0o600)
    guest.write("sys/module/nvidia/version", "580.95.05\n")
    install_mig(guest, {0: "Disabled", 1: "[N/A]"})
    guest.install_bundle("mig")
    host = FakeRoot(tmp_path / "host")
    install_vm(host, guest)
    return host, guest


def restart(host: FakeRoot) -> Result:
    guest_args = mig_args(B, "restart", NEW, 5, "gpu-operator")
    return host.run_bundle(
        "mig-restart", *mig_restart_args(VMID, NODE, 30, installed_step("ubuntu", "mig"), guest_args)
    )


def test_a_guest_step_outliving_qms_timeout_fails_naming_it_not_on_a_parse(tmp_path: Path) -> None:
    host, guest = setup(tmp_path)
    guest.stub_script("kubectl", "/bin/sleep 2")  # the guest's step is still at work when qm stops waiting
    host.write("fake-exec-timeout", "0.5")
    r = restart(host)
    assert r.returncode == 1
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("mig-restart: guest exec: expected the guest's MIG step to finish within ")
    assert f"saw it still runs in VM {VMID} (pid " in line and line.endswith("qm: timeout reached, returning pid )")
    assert "malformed" not in r.stderr


@pytest.mark.parametrize("failure", ["exec-refused", "exec-timeout"])
def test_a_failing_qm_call_leaves_no_temporary_file(tmp_path: Path, failure: str) -> None:
    # qm's stderr goes to a temporary file; a failure (qm refusing the exec after the agent answered its ping, or
    # the guest step outliving qm's timeout) exits from inside the step and must not leave it on the Proxmox node.
    host, guest = setup(tmp_path)
    # A plain `mktemp` (the step's own) makes its file under the fake root; the agent's templated ones stay as they are.
    host.stub_script(
        "mktemp", 'if [ $# -eq 0 ]; then mkdir -p "$PGC_ROOT/tmp"; exec /usr/bin/mktemp -p "$PGC_ROOT/tmp"; fi\n'
        'exec /usr/bin/mktemp "$@"',
    )  # fmt: skip
    if failure == "exec-refused":  # the agent goes away between the ping and the exec (qm dies, exit 255)
        (host.bin / "qm").rename(host.bin / "qm-real")
        host.stub_script(
            "qm", 'case "$2" in exec) echo "QEMU guest agent is not running" >&2; exit 255 ;; esac\n'
            'exec "${0%/*}/qm-real" "$@"',
        )  # fmt: skip
    else:
        guest.stub_script("kubectl", "/bin/sleep 2")
        host.write("fake-exec-timeout", "0.5")
    r = restart(host)
    assert r.returncode == 1, r.stdout
    assert [c for c in r.calls if c.strip() == "mktemp"]
    assert list((host.root / "tmp").iterdir()) == []
