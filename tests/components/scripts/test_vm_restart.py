"""vm_restart.sh and guest_hold.sh: a worker VM's pending hardware (what the provider writes into the VM's
configuration and leaves pending: cores, memory, GPUs) applied by a stop and start from its Proxmox node, with the
Kubernetes node held first (its rollout slot, cordon, drain), then checked by the guest's verify step, which
uncordons it. Against the fake ``qm`` (fakemig.py: ``qm pending`` as pve-guest-common prints it; a start makes the
pending configuration current) and the fake API server."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.render.agent_bundle import installed_step
from proxmox_gpu_cluster.render.guest_scripts import hold_args, verify_args
from proxmox_gpu_cluster.render.host_scripts import mig_restart_args, retire_args, vm_restart_args
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakekube import SLOT_NAMESPACE, FakeCluster, Pod, kubelet_conf
from tests.components.scripts.fakemig import install_vm, restarts, shutdowns
from tests.components.scripts.fakeroot import FakeRoot, Result
from tests.components.scripts.test_mig_mode import KUBECONFIG, NODE, VMID
from tests.support import external

HARDWARE = "0123456789abcdef"


@pytest.fixture(autouse=True)
def _tools() -> None:
    external(Path("/usr/bin/python3"), "python3", "install it with: apt-get install python3")
    external(Path("/usr/bin/perl"), "perl", "install it with: apt-get install perl")


def spec(cores: int) -> GuestBootstrapSpec:
    return GuestBootstrapSpec.model_validate(
        {
            "nodeName": NODE, "gpus": [{"vendorDevice": "10de:2236", "product": "NVIDIA-A10"}],
            "driverMode": "operator", "driverBranch": "580", "kernelModules": "open", "toolkit": False,
            "apiEndpoint": "k8s.example.test:6443", "kubernetesMinor": 34, "rollout": {"drainTimeoutSeconds": 60},
            "cpus": cores, "memoryMib": 16384,
        }
    )  # fmt: skip


def vm(tmp_path: Path, *, joined: bool = True) -> tuple[FakeRoot, FakeGuest, FakeCluster]:
    """A VM with 8 cores and 16 GiB running, a change to 16 cores pending; its node (if joined) runs one pod."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    cluster = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=[NODE], pods=[Pod("ml", "train-0", NODE)])
    cluster.save()
    guest = FakeGuest(tmp_path / "guest")
    cluster.install(guest)
    guest.stub_script("sleep", ":")
    if joined:
        guest.write("etc/kubernetes/kubelet.conf", kubelet_conf(NODE)).chmod(0o600)
        guest.write("var/lib/fake-dpkg/kubelet", "1.34.2-1.1")
    guest.write("proc/cpuinfo", "".join(f"processor\t: {i}\n\n" for i in range(8)))
    guest.write("proc/meminfo", f"MemTotal: {16384 * 1024 * 97 // 100} kB\n")
    guest.install_bundle("hold")
    host = FakeRoot(tmp_path / "host")
    install_vm(host, guest, cluster=cluster, node=NODE)
    host.write("fake-vm-config", "cores: 8\nmemory: 16384\n")
    host.write("fake-vm-pending", "cores: 16\n")
    return host, guest, cluster


def restart(host: FakeRoot) -> Result:
    args = vm_restart_args(VMID, NODE, 30, hardware=HARDWARE, guest_step=installed_step("ubuntu", "hold"),
                           guest_args=hold_args(spec(16)))  # fmt: skip
    return host.run_bundle("vm-restart", *args)


def held(cluster: FakeCluster) -> dict[str, str]:
    maps = cluster.state()["configmaps"].items()
    return {k: h for k, cm in maps if k.startswith(f"{SLOT_NAMESPACE}/") and (h := cm["data"].get("holder"))}


def test_pending_hardware_is_applied_by_a_restart_of_the_held_node_and_verified(tmp_path: Path) -> None:
    host, guest, cluster = vm(tmp_path)
    before = guest.step("verify", *verify_args(spec(16)))
    assert before.returncode == 1  # what verify says while the change is pending
    assert "verify: /proc/cpuinfo: expected 16 processors, saw 8 (a VM restart still pending?)" in before.stderr
    r = restart(host)
    assert r.returncode == 0, r.stderr
    assert f"hold: {NODE} held (VM restart for pending hardware)" in r.stdout
    assert f"vm-restart: VM {VMID} ({NODE}) restarted: its pending hardware applied" in r.stdout
    assert shutdowns(host) == [{"pods": [], "held": True}]  # drained and held before the VM stopped
    assert restarts(host) == 1 and NODE in cluster.state()["cordoned"]
    verify = guest.step("verify", *verify_args(spec(16)))
    assert verify.returncode == 0, verify.stderr
    assert f"rollout: uncordoned {NODE}" in verify.stdout and held(cluster) == {}
    again = restart(host)
    assert again.returncode == 0 and f"VM {VMID} ({NODE}): nothing pending" in again.stdout
    assert not [c for c in again.calls if c.startswith(("qm shutdown", "qm start", "qm guest exec"))]


def test_nothing_pending_changes_nothing(tmp_path: Path) -> None:
    host, _, cluster = vm(tmp_path)
    (host.root / "fake-vm-pending").unlink()  # a first provisioning: the VM started on its whole configuration
    r = restart(host)
    assert r.returncode == 0 and "nothing pending" in r.stdout
    assert restarts(host) == 0 and cluster.state()["cordoned"] == [] and held(cluster) == {}
    assert not [c for c in r.calls if c.startswith("qm guest exec")]


def test_a_node_not_joined_yet_is_restarted_without_a_hold(tmp_path: Path) -> None:
    host, _, cluster = vm(tmp_path, joined=False)
    r = restart(host)
    assert r.returncode == 0, r.stderr
    assert "hold: not joined: nothing to hold" in r.stdout and restarts(host) == 1
    assert held(cluster) == {}


def test_a_vm_stopped_by_someone_else_is_not_started(tmp_path: Path) -> None:
    host, _, _ = vm(tmp_path)
    host.write("fake-vm-status", "stopped\n")
    r = restart(host)
    assert r.returncode == 1
    assert r.stderr.startswith(f"vm-restart: VM {VMID} ({NODE}): expected running, saw status: stopped")
    assert restarts(host) == 0


@pytest.mark.slow
def test_a_kill_at_any_command_is_finished_by_the_next_run_with_one_restart(tmp_path: Path) -> None:
    ref_host, _, _ = vm(tmp_path / "ref")
    calls = restart(ref_host).calls
    assert len(calls) >= 8, calls  # the host's commands (the guest's hold: cluster.py's rollout, swept elsewhere)
    for n in range(1, len(calls) + 1):
        host, guest, cluster = vm(tmp_path / f"kill-{n}")
        host.fault(n, "kill")
        restart(host)
        host.fault(None)
        r = restart(host)
        assert r.returncode == 0, (n, calls[n - 1], r.stderr)
        assert restarts(host) == 1 and not (host.root / "fake-vm-pending").exists(), (n, calls[n - 1])
        assert all(s == {"pods": [], "held": True} for s in shutdowns(host)), (n, calls[n - 1])
        verify = guest.step("verify", *verify_args(spec(16)))
        assert verify.returncode == 0, (n, calls[n - 1], verify.stderr)
        assert cluster.state()["cordoned"] == [] and held(cluster) == {}, (n, calls[n - 1])
        shutil.rmtree(tmp_path / f"kill-{n}")


@pytest.mark.parametrize("step", ["vm-restart", "mig-restart"])
def test_a_malformed_rollout_wait_in_the_guests_arguments_fails_before_any_qm_command(
    tmp_path: Path, step: str
) -> None:
    # Both host steps size their guest run from the guest's rollout arguments (host_qm.sh, qm_hold_seconds).
    host, _, _ = vm(tmp_path)
    guest_args = [*hold_args(spec(16)), "--rollout-wait-seconds", "soon"]
    if step == "vm-restart":
        args = vm_restart_args(VMID, NODE, 30, hardware=HARDWARE, guest_step=installed_step("ubuntu", "hold"),
                               guest_args=guest_args)  # fmt: skip
    else:
        args = mig_restart_args(VMID, NODE, 30, installed_step("ubuntu", "mig"), ["--timeout", "60", *guest_args])
    r = host.run_bundle(step, *args)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        f"{step}: guest arguments: expected --rollout-wait-seconds and --rollout-drain-timeout SECONDS, saw 'soon' '60'"
    )
    assert not [c for c in r.calls if c.startswith("qm ")]


SHARED_BAD = {
    "--vmid": ("12", "--vmid: expected a VM id, saw '12'"),
    "--node-name": ("Gpu_1", "--node-name: expected a DNS label, saw 'Gpu_1'"),
    "--timeout": ("PATH[$(touch x)]", "--timeout: expected seconds, saw 'PATH[$(touch x)]'"),
    "--guest-step": ("/home/u/../step.sh", "--guest-step: expected the absolute path of the guest's installed {what}, "
                     "saw '/home/u/../step.sh'"),
}  # fmt: skip
WHAT = {"vm-restart": "hold step", "mig-restart": "MIG step", "retire": "drain step"}


@pytest.mark.parametrize("flag", SHARED_BAD)
@pytest.mark.parametrize("step", WHAT)
def test_the_three_vm_steps_refuse_a_malformed_shared_argument_alike_before_any_qm_command(
    tmp_path: Path, step: str, flag: str
) -> None:
    # One parser and one set of checks (host_qm.sh qm_step_arg, qm_step_checks) for every step that reaches a guest
    # through qm; a script must not trust its arguments.
    host, _, _ = vm(tmp_path)
    guest_step = installed_step("ubuntu", "hold")
    if step == "vm-restart":
        args = vm_restart_args(VMID, NODE, 30, hardware=HARDWARE, guest_step=guest_step, guest_args=hold_args(spec(16)))
    elif step == "mig-restart":
        args = mig_restart_args(VMID, NODE, 30, guest_step, ["--timeout", "60"])
    else:
        args = retire_args(VMID, NODE, 30, guest_step, ["--node-name", NODE], check=True)
    bad, line = SHARED_BAD[flag]
    args[args.index(flag) + 1] = bad
    r = host.run_bundle(step, *args)
    assert r.returncode == 1
    prefix = "retire" if step == "retire" else step
    assert r.stderr.strip().splitlines()[-1] == f"{prefix}: " + line.format(what=WHAT[step])
    assert not [c for c in r.calls if c.startswith("qm ")]
    assert not (host.root / "x").exists()
