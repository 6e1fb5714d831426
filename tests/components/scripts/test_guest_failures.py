"""Guest steps fail where they fail, in one line `<step>: <what>: expected <x>, saw <y>` with the tool's own output
below it: apt's lock (a bounded wait), the network, a DKMS build, a full disk, kubeadm, nvidia-smi, and any other
command (the ERR trap). Two steps on one guest serialise on the per-machine lock, and a wait that runs out names
the holder."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from proxmox_gpu_cluster.render.guest_scripts import driver_args, join_args, runtime_args, verify_args
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakeroot import SCRIPTS
from tests.components.scripts.guest_harness import run_chain
from tests.components.scripts.test_guest_bootstrap_scripts import SECRETS, spec
from tests.components.scripts.test_guest_fault_injection import chain


@pytest.fixture
def guest(tmp_path: Path) -> FakeGuest:
    return FakeGuest(tmp_path / "root")


def test_apt_waits_for_the_dpkg_lock_and_fails_naming_its_holder_when_it_is_not_freed_in_time(
    guest: FakeGuest,
) -> None:
    guest.write("fake-apt-lock", "4242 unattended-upgr 900\n")  # held longer than the step waits (600 s)
    r = guest.step("driver", *driver_args(spec()))
    assert r.returncode == 1
    line, output = r.stderr.split("\n", 1)
    assert line == (
        "driver: apt-get update: expected exit 0, saw exit 100: E: Could not get lock /var/lib/dpkg/lock-frontend. "
        "It is held by process 4242 (unattended-upgr)"
    )
    assert "Waiting for cache lock" in output
    assert "apt-get -o DPkg::Lock::Timeout=600 update -q --error-on=any" in r.calls
    guest.write("fake-apt-lock", "4242 unattended-upgr 120\n")  # freed within the wait: apt gets it
    assert guest.step("driver", *driver_args(spec())).returncode == 0


def test_a_network_failure_stops_at_apt_get_update(guest: FakeGuest) -> None:
    guest.write("fake-offline", "")
    r = guest.step("driver", *driver_args(spec()))
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == (
        "driver: apt-get update: expected exit 0, saw exit 100: E: Failed to fetch "
        "http://archive.ubuntu.com/ubuntu/dists/noble/InRelease  Temporary failure resolving 'archive.ubuntu.com'"
    )
    assert not [c for c in r.calls if " install " in c]
    runtime = guest.step("runtime", *runtime_args(spec()))
    assert runtime.stderr.splitlines()[0] == (
        "runtime: apt-get update: expected exit 0, saw exit 100: E: Failed to fetch "
        "http://archive.ubuntu.com/ubuntu/dists/noble/InRelease  Temporary failure resolving 'archive.ubuntu.com'"
    )


def test_a_network_failure_fetching_a_repository_key(guest: FakeGuest) -> None:
    guest.write("var/lib/fake-dpkg/containerd", "1.7.28-0ubuntu1~24.04.1")
    guest.write("fake-offline", "")
    r = guest.step("runtime", *runtime_args(spec()))
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == (
        "runtime: curl https://nvidia.github.io/libnvidia-container/gpgkey: expected the repository's signing key, "
        "saw exit 6: curl: (6) Could not resolve host: nvidia.github.io"
    )


def test_a_dkms_build_failure_fails_the_step_and_the_next_run_finishes_the_install(guest: FakeGuest) -> None:
    guest.write("fake-dkms-fail", "")
    r = guest.step("driver", *driver_args(spec()))
    assert r.returncode == 1
    line, output = r.stderr.split("\n", 1)
    assert line == (
        "driver: apt-get install: expected exit 0, saw exit 100: Error! Bad return status for module build on "
        "kernel: 6.8.0-49-generic (x86_64)"
    )
    assert "E: Sub-process /usr/bin/dpkg returned an error code (1)" in output
    verify = guest.step("verify", *verify_args(spec()))
    assert verify.returncode == 1 and "nvidia-smi -L" in verify.stderr
    (guest.root / "fake-dkms-fail").unlink()  # the cause fixed (say, the missing headers)
    again = guest.step("driver", *driver_args(spec()))
    assert again.returncode == 0, again.stderr
    assert "dpkg --force-confdef --force-confold --configure -a" in again.calls
    assert guest.read("sys/module/nvidia/version").strip() == "580.95.05"


def test_a_full_disk_names_the_file_it_could_not_write(guest: FakeGuest) -> None:
    guest.link("etc/sysctl.d/99-kubernetes.conf.pgc-new", "/dev/full")  # every write to it: ENOSPC
    r = guest.step("join", *join_args(spec()), secrets=SECRETS)
    assert r.returncode == 1
    assert r.stderr.strip() == (
        "join: write /etc/sysctl.d/99-kubernetes.conf: expected the file written, saw No space left on device"
    )
    assert not (guest.root / "etc/sysctl.d/99-kubernetes.conf").exists()  # no half-written file either


def test_kubeadm_preflight_errors_are_shown_below_the_line(guest: FakeGuest) -> None:
    guest.write("etc/kubernetes/manifests/kube-apiserver.yaml", "")  # not a join leftover: reset is not ours to run
    guest.write("fake-kubeadm-tls-timeout", "")
    r = guest.step("join", *join_args(spec()), secrets=SECRETS)
    assert r.returncode == 1
    line, output = r.stderr.split("\n", 1)
    assert line == (
        "join: kubeadm join: expected exit 0, saw exit 1: error execution phase kubelet-start: timed out waiting "
        "for the condition"
    )
    assert "[kubelet-start] Waiting for the kubelet to perform the TLS Bootstrap" in output


def test_an_expired_join_token_says_so_and_how_to_get_a_new_one(guest: FakeGuest) -> None:
    guest.write("fake-kubeadm-token-expired", "")
    r = guest.step("join", *join_args(spec()), secrets=SECRETS)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        "join: kubeadm join: expected a bootstrap token the API server holds, saw none with this token's id (expired: "
        "a token the join-token step minted lives 1 h, so replace that step with 'pulumi up --replace <URN of "
        f"{spec().node_name}'s *-join-token step>' (pulumi stack --show-urns); a kubeadmJoinToken secret lives 24 h "
        "unless made with another --ttl: run 'kubeadm token create --ttl 2h' on a control-plane node, set the secret "
        "to what it prints and run pulumi up again)"
    )
    assert SECRETS["PGC_JOIN_TOKEN"].split(".")[1] not in r.stdout + r.stderr  # never the token's secret half
    (guest.root / "fake-kubeadm-token-expired").unlink()
    again = guest.step("join", *join_args(spec()), secrets=SECRETS)  # with a valid token: joins, nothing left over
    assert again.returncode == 0, again.stderr


def test_nvidia_smi_after_a_driver_change_without_its_reboot(guest: FakeGuest) -> None:
    run_chain(guest, chain(spec()))
    bumped = spec(driverVersion="580.105.08")
    assert "reboot: scheduled" in guest.step("driver", *driver_args(bumped)).stdout
    r = guest.step("verify", *verify_args(bumped))  # before the reboot: the old module, the new library
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == (
        "verify: nvidia-smi -L: expected 1 GPU(s), saw exit 18: Failed to initialize NVML: Driver/library version "
        "mismatch"
    )


def test_an_unexpected_failure_names_the_command_and_its_exit_code(guest: FakeGuest) -> None:
    guest.stub_script("uname", "exit 3")
    r = guest.step("driver", *driver_args(spec()))
    assert r.returncode != 0
    assert re.fullmatch(r"driver: .*uname -r.* failed: expected exit 0, saw exit 3", r.stderr.strip()), r.stderr


def slow_cloud_init(guest: FakeGuest, seconds: float) -> None:
    """cloud-init status --wait that takes ``seconds``, logging when it starts and ends and its step's pid (its
    parent is the $(...) subshell of the step's shell)."""
    guest.stub_script(
        "cloud-init",
        'step="$(cut -d" " -f4 /proc/$PPID/stat)"; echo "start $step" >> "$PGC_ROOT/order"; '
        f'sleep {seconds}; echo "end $step" >> "$PGC_ROOT/order"; echo "status: done"',
    )


def test_two_runs_on_one_guest_run_one_after_the_other(guest: FakeGuest) -> None:
    slow_cloud_init(guest, 0.5)
    results = []
    threads = [threading.Thread(target=lambda: results.append(guest.step("cloud-init"))) for _ in range(2)]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join()
    assert [r.returncode for r in results] == [0, 0]
    order = [line.split()[0] for line in guest.read("order").splitlines()]
    assert order == ["start", "end", "start", "end"]  # never both inside at once


def test_a_run_that_cannot_get_the_lock_in_time_names_the_holder(guest: FakeGuest) -> None:
    slow_cloud_init(guest, 3)
    holder = threading.Thread(target=guest.step, args=("cloud-init",))
    holder.start()
    while not (guest.root / "order").exists():
        time.sleep(0.05)
    text = "PGC_LOCK_WAIT=1\n" + "".join(
        (SCRIPTS / f).read_text() for f in ("guest_lib.sh", "guest_rollout.sh", "guest_join.sh")
    )
    r = guest.run_stdin(text, *join_args(spec()))
    holder.join()
    pid = guest.read("order").split()[1]
    assert r.returncode == 1
    assert r.stderr.strip() == (
        f"join: lock /run/lock/proxmox-gpu-cluster.lock: expected free within 1s, saw held by cloud-init (pid {pid})"
    )
    assert r.calls == []  # waited, changed nothing
