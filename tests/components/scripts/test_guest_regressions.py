"""The non-convergent cases the issue's author saw on guests, each reproduced by name: the state a fault leaves, then
the next `pulumi up` (the faulted step and the later ones), which must reach the wanted state, and a run after that
which changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxmox_gpu_cluster.render.guest_scripts import driver_args, join_args, runtime_args, verify_args
from tests.components.scripts.fakeguest import FakeGuest, mutating
from tests.components.scripts.guest_harness import run_chain
from tests.components.scripts.test_guest_bootstrap_scripts import SECRETS, spec
from tests.components.scripts.test_guest_fault_injection import chain
from tests.components.scripts.test_guest_vfio import kubevirt_spec

BUMPED = spec(driverVersion="580.105.08")


@pytest.fixture
def guest(tmp_path: Path) -> FakeGuest:
    return FakeGuest(tmp_path / "root")


def provisioned(guest: FakeGuest) -> FakeGuest:
    run_chain(guest, chain(spec()))
    assert guest.read("sys/module/nvidia/version").strip() == "580.95.05"
    return guest


def settled(guest: FakeGuest, b: object) -> None:
    """Every step once more changes nothing and reboots nothing."""
    for name, args, secrets in chain(b):  # type: ignore[arg-type]
        r = guest.step(name, *args, secrets=secrets)
        assert r.returncode == 0, f"{name}: {r.stderr}"
        assert mutating(r.calls) == [] and not guest.reboot_scheduled(), f"{name}: {r.calls}"


def test_a_bump_killed_inside_apt_get_install_still_reboots_into_the_new_module(guest: FakeGuest) -> None:
    provisioned(guest)
    guest.kill_apt_after_unpack()
    killed = guest.step("driver", *driver_args(BUMPED))
    assert killed.returncode == -9
    assert guest.installed("nvidia-headless-580-server-open") == "580.105.08-0ubuntu0.24.04.1"  # unpacked only
    again = guest.step("driver", *driver_args(BUMPED))
    assert again.returncode == 0, again.stderr
    assert "dpkg --force-confdef --force-confold --configure -a" in again.calls  # the interrupted install finished
    assert "reboot: scheduled" in again.stdout  # not "present, reboot: not-needed" with the old module running
    guest.reboot()
    assert guest.read("sys/module/nvidia/version").strip() == "580.105.08"
    assert guest.step("verify", *verify_args(BUMPED)).returncode == 0
    settled(guest, BUMPED)


@pytest.mark.parametrize("command", ["apt-mark showhold", "uname -r", "systemd-run"])
def test_a_bump_whose_step_failed_after_the_install_still_reboots(guest: FakeGuest, command: str) -> None:
    provisioned(guest)
    calls = dry_calls(guest, BUMPED)
    install = next(i for i, c in enumerate(calls, 1) if c.startswith("apt-get") and " install " in c)
    guest.fault(next(i for i, c in enumerate(calls, 1) if i > install and c.startswith(command)), "fail")
    failed = guest.step("driver", *driver_args(BUMPED))
    guest.fault(None)
    assert failed.returncode == 1 and f"{command.split(maxsplit=1)[0]}: injected failure" in failed.stderr
    assert guest.installed("nvidia-headless-580-server-open") == "580.105.08-0ubuntu0.24.04.1"
    again = guest.step("driver", *driver_args(BUMPED))
    assert again.returncode == 0, again.stderr
    assert "reboot: scheduled" in again.stdout  # the old module still runs: observed, not remembered
    assert {"nvidia-headless-580-server-open", "nvidia-utils-580-server"} <= set(guest.holds())
    guest.reboot()
    assert guest.read("sys/module/nvidia/version").strip() == "580.105.08"
    assert guest.step("verify", *verify_args(BUMPED)).returncode == 0
    settled(guest, BUMPED)


def test_a_vfio_step_killed_before_update_grub_regenerates_it_and_reboots_once(guest: FakeGuest) -> None:
    b = kubevirt_spec()
    guest.step("cloud-init")
    guest.fault(next(i for i, c in enumerate(dry_calls(guest, b), 1) if c.strip() == "update-grub"), "kill")
    killed = guest.step("driver", *driver_args(b))
    guest.fault(None)
    assert killed.returncode == -9 and "intel_iommu=on" in guest.read("etc/default/grub.d/90-proxmox-gpu-cluster.cfg")
    assert "intel_iommu" not in guest.read("boot/grub/grub.cfg")  # written, never generated
    again = guest.step("driver", *driver_args(b))
    assert "update-grub " in again.calls and "reboot: scheduled" in again.stdout
    guest.reboot()
    assert "intel_iommu=on iommu=pt" in guest.read("proc/cmdline") and guest.driver_of() == "vfio-pci"
    run_chain(guest, chain(b)[2:])
    settled(guest, b)


def dry_calls(guest: FakeGuest, b: object) -> list[str]:
    """The calls the driver step makes from ``guest``'s state (run on a copy)."""
    probe = FakeGuest.copy(guest, guest.root.parent / "probe")
    return probe.step("driver", *driver_args(b)).calls  # type: ignore[arg-type]


def test_a_reboot_that_did_not_apply_the_command_line_stops_instead_of_rebooting_again(guest: FakeGuest) -> None:
    b = kubevirt_spec()
    first = guest.step("driver", *driver_args(b))
    assert "reboot: scheduled" in first.stdout
    before = guest.read("proc/sys/kernel/random/boot_id").strip()
    guest.write("boot/grub/grub.cfg", "menuentry 'Ubuntu' {\n\tlinux\t/vmlinuz root=LABEL=cloudimg-rootfs ro\n}\n")
    guest.reboot()  # the boot loader booted another configuration: no IOMMU arguments
    again = guest.step("driver", *driver_args(b))
    assert again.returncode == 1
    assert again.stderr.splitlines()[0].startswith(
        f"driver: after the reboot from boot {before}: expected intel_iommu=on iommu=pt in /proc/cmdline, saw "
        "BOOT_IMAGE=/vmlinuz-6.8.0-49-generic root=LABEL=cloudimg-rootfs ro (the boot did not apply it"
    )
    assert not guest.reboot_scheduled() and not [c for c in again.calls if c.startswith("systemd-run")]


def test_a_join_that_timed_out_in_the_tls_bootstrap_is_reset_and_joined(guest: FakeGuest) -> None:
    run_chain(guest, chain(spec())[:3])
    guest.write("fake-kubeadm-tls-timeout", "")
    failed = guest.step("join", *join_args(spec()), secrets=SECRETS)
    assert failed.returncode == 1
    assert failed.stderr.startswith(
        "join: kubeadm join: expected exit 0, saw exit 1: error execution phase kubelet-start: timed out waiting "
        "for the condition\n"
    )
    assert (guest.root / "etc/kubernetes/pki/ca.crt").exists() and not (guest.root / KUBELET_CONF).exists()
    (guest.root / "fake-kubeadm-tls-timeout").unlink()
    again = guest.step("join", *join_args(spec()), secrets=SECRETS)
    assert again.returncode == 0, again.stderr  # not "[ERROR FileAvailable--etc-kubernetes-pki-ca.crt]"
    kubeadm = [c.split(" --config")[0] for c in again.calls if c.startswith("kubeadm")]
    assert kubeadm == ["kubeadm reset -f", "kubeadm join"]
    assert (guest.root / KUBELET_CONF).exists()


KUBELET_CONF = "etc/kubernetes/kubelet.conf"


def test_containerd_is_restarted_by_the_next_run_after_an_interrupted_runtime_step(guest: FakeGuest) -> None:
    run_chain(guest, chain(spec())[:2])
    calls = FakeGuest.copy(guest, guest.root.parent / "probe").step("runtime", *runtime_args(spec())).calls
    guest.fault(calls.index("systemctl restart containerd") + 1, "kill")
    assert guest.step("runtime", *runtime_args(spec())).returncode == -9
    guest.fault(None)
    assert 'default_runtime_name = "nvidia"' in guest.read("etc/containerd/conf.d/99-nvidia.toml")  # the files
    assert not (guest.root / "fake-running/containerd/conf.d").exists()  # the daemon still runs the defaults
    again = guest.step("runtime", *runtime_args(spec()))
    assert "systemctl restart containerd" in again.calls and "runtime: containerd restarted" in again.stdout
    run_chain(guest, chain(spec())[3:])  # verify reads the running config (crictl info): it passes now
    settled(guest, spec())


def test_verify_fails_when_containerd_runs_without_the_nvidia_runtime(guest: FakeGuest) -> None:
    run_chain(guest, chain(spec()))
    guest.write("fake-running/containerd/conf.d/99-nvidia.toml", "")  # the daemon runs what it was started with
    r = guest.step("verify", *verify_args(spec()))
    assert r.returncode == 1
    assert r.stderr.strip() == "verify: containerd running config (crictl info): expected an nvidia runtime, saw runc"


def test_a_truncated_keyring_is_fetched_again(guest: FakeGuest) -> None:
    guest.write("var/lib/fake-dpkg/containerd", "1.7.28-0ubuntu1~24.04.1")
    guest.write("etc/apt/keyrings/nvidia-container-toolkit.gpg", "fake-openpgp-keyring\nmQINBFfake")  # cut short
    r = guest.step("runtime", *runtime_args(spec()))
    assert r.returncode == 0, r.stderr
    assert "curl -fsSL --retry 3 https://nvidia.github.io/libnvidia-container/gpgkey" in r.calls
    shown = guest.run_stdin(f"gpg --show-keys {guest.root}/etc/apt/keyrings/nvidia-container-toolkit.gpg\n")
    assert shown.returncode == 0


def test_a_download_cut_short_leaves_no_keyring(guest: FakeGuest) -> None:
    guest.write("fake-curl-truncate", "")
    r = guest.step("runtime", *runtime_args(spec()))
    assert r.returncode == 1
    assert r.stderr.startswith(
        "runtime: curl https://nvidia.github.io/libnvidia-container/gpgkey: expected the repository's signing key, "
        "saw exit 18: curl: (18) transfer closed with outstanding read data remaining"
    )
    assert not (guest.root / "etc/apt/keyrings/nvidia-container-toolkit.gpg").exists()
    again = guest.step("runtime", *runtime_args(spec()))
    assert again.returncode == 0, again.stderr


def test_holds_taken_off_are_put_back(guest: FakeGuest) -> None:
    run_chain(guest, chain(spec()))
    guest.run_stdin("apt-mark unhold nvidia-headless-580-server-open kubeadm nvidia-container-toolkit\n")
    run_chain(guest, chain(spec()))
    assert {"nvidia-headless-580-server-open", "kubeadm", "nvidia-container-toolkit"} <= set(guest.holds())


def test_secret_files_a_killed_run_left_are_removed_by_the_next_run(guest: FakeGuest) -> None:
    run_chain(guest, chain(spec())[:3])
    calls = FakeGuest.copy(guest, guest.root.parent / "probe").step("join", *join_args(spec()), secrets=SECRETS).calls
    guest.fault(next(i for i, c in enumerate(calls, 1) if c.startswith("kubeadm join")), "kill-after")
    assert guest.step("join", *join_args(spec()), secrets=SECRETS).returncode == -9
    guest.fault(None)
    assert list((guest.root / "run").glob("pgc-join.*"))  # the EXIT trap never ran
    assert guest.step("cloud-init").returncode == 0  # any step's next run
    assert not list((guest.root / "run").glob("pgc-join.*"))
