"""MIG mode changes complete through the hypervisor (issue 24, part 3): inside the rollout slot the guest's MIG
begin step sets the mode; after the label change the Proxmox-side mig-restart step restarts the VM only when the
guest reports the mode pending (a fake NVML that stays pending until a restart), and the end step waits for
mig-manager's report from after the restart before it uncordons. A new worker's driver step sets the mode before the
join. Run as machines run them: the agent bundles (the guest's mig and driver, the host's mig-restart)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.render.agent_bundle import installed_step
from proxmox_gpu_cluster.render.guest_scripts import driver_args, mig_args
from proxmox_gpu_cluster.render.host_scripts import mig_restart_args
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakekube import FakeCluster, Pod, kubelet_conf
from tests.components.scripts.fakemig import (
    api_down_after_boot,
    install_mig,
    install_vm,
    mig_manager,
    mig_state,
    operator_driver,
    restarts,
)
from tests.components.scripts.fakeroot import FakeRoot, Result
from tests.components.scripts.test_rollout import held
from tests.support import external

KUBECONFIG = "apiVersion: v1\nkind: Config\nusers:\n- name: admin\n  user: {token: CANARY-MIG-TOKEN}\n"
NODE, VMID = "gpu-a100-a", 210
OLD, NEW = "all-disabled", "all-1g.5gb"
RESTARTED = "proxmox-gpu-cluster.io/mig-restart"
SPEC = {
    "nodeName": NODE, "gpus": [{"vendorDevice": "10de:20f1", "product": "NVIDIA-A100-PCIE-40GB"}],
    "driverMode": "host", "driverBranch": "580", "kernelModules": "open", "toolkit": True,
    "apiEndpoint": "k8s.example.test:6443", "kubernetesMinor": 34, "rollout": {"drainTimeoutSeconds": 60},
}  # fmt: skip
B = GuestBootstrapSpec.model_validate({**SPEC, "migModes": ["0=1"]})


@pytest.fixture(autouse=True)
def _tools() -> None:
    external(Path("/usr/bin/python3"), "python3", "install it with: apt-get install python3")
    external(Path("/usr/bin/perl"), "perl", "install it with: apt-get install perl")


@pytest.fixture
def cluster(tmp_path: Path) -> FakeCluster:
    c = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=[NODE], pods=[Pod("ml", "train-0", NODE)])
    c.labels = {NODE: {"nvidia.com/mig.config": OLD, "nvidia.com/mig.config.state": "success"}}
    c.save()
    return c


@pytest.fixture
def guest(tmp_path: Path, cluster: FakeCluster) -> FakeGuest:
    g = FakeGuest(tmp_path / "guest")
    cluster.install(g)
    g.write("etc/kubernetes/kubelet.conf", kubelet_conf(NODE)).chmod(0o600)
    g.write("sys/module/nvidia/version", "580.95.05\n")  # the host driver runs
    g.stub_script("sleep", "/bin/sleep 0.05")
    install_mig(g, {0: "Disabled", 1: "[N/A]"})
    g.install_bundle("mig")
    return g


@pytest.fixture
def host(tmp_path: Path, guest: FakeGuest) -> FakeRoot:
    h = FakeRoot(tmp_path / "host")
    install_vm(h, guest)
    return h


def phase(guest: FakeGuest, name: str, timeout: int = 5) -> Result:
    return guest.run_bundle("mig", *mig_args(B, name, NEW, timeout, "gpu-operator"))


def restart(host: FakeRoot) -> Result:
    guest_args = mig_args(B, "restart", NEW, 5, "gpu-operator")
    return host.run_bundle(
        "mig-restart", *mig_restart_args(VMID, NODE, 30, installed_step("ubuntu", "mig"), guest_args)
    )


def label_patch(cluster: FakeCluster, guest: FakeGuest) -> None:
    """The NodePatch lands; mig-manager reacts to it (and cannot reset the GPU in the VM)."""
    cluster.set_labels(NODE, **{"nvidia.com/mig.config": NEW})
    mig_manager(cluster, guest, NODE)


def test_a_mode_change_restarts_the_vm_once_from_proxmox_and_waits_for_mig_manager(
    guest: FakeGuest, host: FakeRoot, cluster: FakeCluster
) -> None:
    begin = phase(guest, "begin")
    assert begin.returncode == 0, begin.stderr
    assert f"rollout: {NODE} took slot proxmox-gpu-cluster-rollout-0 (MIG {OLD} -> {NEW})" in begin.stdout
    assert "nvidia-smi -i 0 -mig 1" in begin.calls  # after the drain, inside the slot
    assert begin.calls.index("nvidia-smi -i 0 -mig 1") > max(i for i, c in enumerate(begin.calls) if "drain" in c or
                                                             "--raw" in c)  # fmt: skip
    assert "mig-restart: needed (GPU 0 MIG mode Disabled, Enabled pending a GPU reset)" in begin.stdout
    assert mig_state(guest)[0] == ("Disabled", "Enabled")
    label_patch(cluster, guest)
    assert cluster.state()["labels"][NODE]["nvidia.com/mig.config.state"] == "failed"  # no reset in the guest
    first = restart(host)
    assert first.returncode == 0, first.stderr
    assert f"mig-restart: VM {VMID} ({NODE}) restarted: its GPUs' MIG mode applied" in first.stdout
    assert restarts(host) == 1 and mig_state(guest)[0] == ("Enabled", "Enabled")
    assert [c for c in first.calls if c.split()[1] in ("shutdown", "start")] == [
        f"qm shutdown {VMID} --timeout 300 --forceStop 1",
        f"qm start {VMID}",
    ]
    assert cluster.state()["annotations"][NODE][RESTARTED] == "failed"  # mig-manager's report from before
    # The stale "failed" does not fail the end step: it waits for mig-manager's run after the boot.
    end = phase(guest, "end", timeout=1)
    assert end.returncode == 1 and "state failed, its report from before the VM restart" in end.stderr
    assert mig_manager(cluster, guest, NODE) == "success"
    end = phase(guest, "end")
    assert end.returncode == 0, end.stderr
    assert f"mig: {NODE} runs {NEW} (mig-manager: success)" in end.stdout
    state = cluster.state()
    assert state["cordoned"] == [] and held(cluster) == {} and RESTARTED not in state["annotations"].get(NODE, {})
    # Run again as the next pulumi up would: nothing restarts, nothing changes.
    again = restart(host)
    assert again.returncode == 0, again.stderr
    assert "not restarted: its GPUs run the wanted MIG mode" in again.stdout and restarts(host) == 1
    for name in ("begin", "end"):
        rerun = phase(guest, name)
        assert rerun.returncode == 0, rerun.stderr
        assert not [c for c in rerun.calls if " -mig " in c or c.startswith(("kubectl cordon", "kubectl annotate"))]


def test_a_gpu_the_guest_can_reset_needs_no_restart(guest: FakeGuest, host: FakeRoot, cluster: FakeCluster) -> None:
    guest.write("fake-mig-resettable", "")
    assert "mig-restart: not-needed" in phase(guest, "begin").stdout
    label_patch(cluster, guest)
    done = restart(host)
    assert done.returncode == 0 and "not restarted" in done.stdout and restarts(host) == 0
    assert RESTARTED not in cluster.state()["annotations"].get(NODE, {})
    assert phase(guest, "end").returncode == 0


def test_a_restart_that_does_not_reset_the_gpu_fails_once_and_never_loops(
    guest: FakeGuest, host: FakeRoot, cluster: FakeCluster
) -> None:
    host.write("fake-no-reset", "")
    assert phase(guest, "begin").returncode == 0
    label_patch(cluster, guest)
    for _ in range(2):
        failed = restart(host)
        assert failed.returncode == 1
        assert failed.stderr.splitlines()[-1].startswith(
            f"mig-restart: VM {VMID} ({NODE}) after its restart: expected the GPUs' MIG mode applied, saw still pending"
        )
    assert restarts(host) == 1  # the second run did not restart it again
    end = phase(guest, "end")
    assert end.returncode == 1 and "mig: MIG mode: expected the wanted mode on every GPU after the VM restart" in (
        end.stderr
    )
    assert cluster.state()["cordoned"] == [NODE]  # it stays cordoned, keeping its slot


def test_a_vm_stopped_by_someone_else_is_not_started(guest: FakeGuest, host: FakeRoot) -> None:
    host.write("fake-vm-status", "stopped\n")
    failed = restart(host)
    assert failed.returncode == 1 and restarts(host) == 0
    assert failed.stderr.strip() == f"mig-restart: VM {VMID} ({NODE}): expected running, saw status: stopped"


def test_a_gpu_without_mig_or_a_missing_one_fails_in_one_line(guest: FakeGuest) -> None:
    for modes, saw in ((["1=1"], "GPU 1: expected a MIG-capable GPU (MIG mode Enabled or Disabled), saw [N/A]"),
                       (["5=1"], "GPU 5: expected a GPU with nvidia-smi index 5, saw indexes 0,1")):  # fmt: skip
        b = GuestBootstrapSpec.model_validate({**SPEC, "migModes": modes})
        run = guest.run_bundle("mig", *mig_args(b, "begin", NEW, 5, "gpu-operator"))
        assert run.returncode == 1 and run.stderr.strip() == f"mig: {saw}"


@pytest.mark.parametrize("resettable", [True, False])
def test_a_new_worker_gets_its_mode_in_the_driver_step_before_the_join(tmp_path: Path, resettable: bool) -> None:
    g = FakeGuest(tmp_path / "new")
    install_mig(g, {0: "Disabled"}, resettable=resettable)
    first = g.run_bundle("driver", *driver_args(B))
    assert first.returncode == 0, first.stderr
    assert "nvidia-smi -i 0 -mig 1" in first.calls and first.stdout.rstrip().endswith("reboot: not-needed")
    assert mig_state(g)[0] == ("Enabled" if resettable else "Disabled", "Enabled")
    line = "mig-restart: not-needed" if resettable else "mig-restart: needed (GPU 0 MIG mode Disabled, Enabled"
    assert line in first.stdout
    again = g.run_bundle("driver", *driver_args(B))
    assert again.returncode == 0 and not [c for c in again.calls if " -mig " in c]


def test_a_joined_workers_driver_step_leaves_the_mode_to_the_mig_step(tmp_path: Path) -> None:
    g = FakeGuest(tmp_path / "joined")
    install_mig(g, {0: "Disabled"}, resettable=True)
    assert g.run_bundle("driver", *driver_args(B)).returncode == 0 and mig_state(g)[0] == ("Enabled", "Enabled")
    g.write("etc/kubernetes/kubelet.conf", kubelet_conf(NODE))  # joined: GPU pods may run now
    off = B.model_copy(update={"mig_modes": ("0=0",)})
    again = g.run_bundle("driver", *driver_args(off))
    assert again.returncode == 0, again.stderr
    assert not [c for c in again.calls if c.startswith("nvidia-smi")] and mig_state(g)[0] == ("Enabled", "Enabled")


def test_a_guest_that_cannot_reach_the_api_server_right_after_its_start_is_asked_again(
    guest: FakeGuest, host: FakeRoot, cluster: FakeCluster
) -> None:
    assert phase(guest, "begin").returncode == 0
    label_patch(cluster, guest)
    api_down_after_boot(host, cluster)
    done = restart(host)
    assert done.returncode == 0, done.stderr
    assert "the guest's MIG step failed (exit 1) right after the start; trying again in 10 s" in done.stderr
    assert "restarted: its GPUs' MIG mode applied" in done.stdout and restarts(host) == 1


def test_in_operator_mode_the_driver_containers_nvidia_smi_is_used_and_the_restart_step_waits_for_it(
    guest: FakeGuest, host: FakeRoot, cluster: FakeCluster
) -> None:
    operator_driver(guest)
    assert "--mig-mode" not in driver_args(B.model_copy(update={"driver_mode": "operator", "toolkit": False}))
    begin = phase(guest, "begin")
    assert begin.returncode == 0, begin.stderr
    assert f"chroot {guest.root}/run/nvidia/driver nvidia-smi -i 0 -mig 1" in begin.calls
    label_patch(cluster, guest)
    assert restart(host).returncode == 0 and restarts(host) == 1
    assert mig_manager(cluster, guest, NODE) == "success" and phase(guest, "end").returncode == 0
    # A first provisioning: the operator's driver container does not run yet. Begin leaves the mode to later (the
    # operator installs after the labels, which wait for begin); the restart step's guest side waits for the
    # container (bounded) instead of deciding "not needed" from nothing (test_mig_mode_operator.py: the whole path).
    (guest.root / "run/nvidia/driver/usr/bin/nvidia-smi").unlink()
    cluster.set_labels(NODE, **{"nvidia.com/mig.config": ""})  # no geometry yet: nothing drained
    begin = phase(guest, "begin")
    assert (
        begin.returncode == 0 and "mig-manager sets the MIG mode" in begin.stdout and "nothing to drain" in begin.stdout
    )
    done = restart(host)
    assert done.returncode == 1 and restarts(host) == 1 and "not restarted" not in done.stdout
    assert f"mig: NVIDIA driver on {NODE}: expected the GPU Operator's driver container answering" in done.stderr


def test_a_mode_change_under_an_unchanged_label_waits_a_minute_for_mig_manager_then_restarts(
    guest: FakeGuest, host: FakeRoot, cluster: FakeCluster
) -> None:
    cluster.set_labels(NODE, **{"nvidia.com/mig.config": NEW})  # the geometry stays; GPU 0's mode changes
    begin = phase(guest, "begin")
    assert begin.returncode == 0 and f"(MIG mode for {NEW})" in begin.stdout, begin.stderr
    # No label change: mig-manager starts no run, and its success is an earlier one's. The restart step's guest
    # side gives it a minute (not its whole 300 s) to begin one, then restarts.
    guest_args = mig_args(B, "restart", NEW, 300, "gpu-operator")
    done = host.run_bundle(
        "mig-restart", *mig_restart_args(VMID, NODE, 30, installed_step("ubuntu", "mig"), guest_args)
    )
    assert done.returncode == 0, done.stderr
    assert f"mig: {NODE}: no report from mig-manager for {NEW} within 60s (state success); restarting" in done.stdout
    assert restarts(host) == 1 and cluster.state()["annotations"][NODE][RESTARTED] == "success"
    # After the boot mig-manager runs for the label (pending: the GPUs' instances are gone after the reset), then
    # reports success: the end step takes that one.
    cluster.set_labels(NODE, **{"nvidia.com/mig.config.state": "pending"})
    assert phase(guest, "end", timeout=1).returncode == 1
    assert mig_manager(cluster, guest, NODE) == "success"
    end = phase(guest, "end")
    assert end.returncode == 0 and cluster.state()["cordoned"] == [], end.stderr
