"""The guest bootstrap steps against a fake Ubuntu guest, run the way the remote commands run them (helpers +
step on stdin, ``bash -s -- args``): a full first provisioning, then a second run that changes nothing; reboots
counted; failures name the step, what was expected and what was seen; secrets never leave the join step."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxmox_gpu_cluster.core.guest_spec import ExpectedGpu, GuestBootstrapSpec
from proxmox_gpu_cluster.render.guest_scripts import driver_args, join_args, runtime_args, verify_args
from tests.components.scripts.fakeguest import A10_LSPCI, A10_SMI, FakeGuest, mutating

TOKEN = "abcdef.0123456789abcdef"
HASH = "sha256:" + "0a" * 32
SECRETS = {"PGC_JOIN_TOKEN": TOKEN, "PGC_CA_CERT_HASH": HASH}


def spec(**overrides: object) -> GuestBootstrapSpec:
    data: dict[str, object] = {
        "nodeName": "gpu-a10-1",
        "gpus": [{"vendorDevice": "10de:2236", "product": "NVIDIA-A10"}],
        "driverMode": "host",
        "driverBranch": "580",
        "driverVersion": "580.95.05",
        "kernelModules": "open",
        "toolkit": True,
        "cdi": False,
        "apiEndpoint": "k8s-api.lab.internal:6443",
        "kubernetesMinor": 34,
    }
    data.update(overrides)
    return GuestBootstrapSpec.model_validate(data)


@pytest.fixture
def guest(tmp_path: Path) -> FakeGuest:
    return FakeGuest(tmp_path / "root")


def files(guest: FakeGuest) -> dict[str, str]:
    """The guest's files but the per-machine lock, which names the last step that held it (and its pid)."""
    return {k: v for k, v in guest.snapshot().items() if not k.startswith("run/lock/")}


def provision(guest: FakeGuest, b: GuestBootstrapSpec) -> tuple[list[str], int]:
    """Every step in order, rebooting where the driver step asks; (all calls, reboots)."""
    calls: list[str] = []
    reboots = 0
    for step, args in (
        ("cloud-init", []),
        ("driver", driver_args(b)),
        ("runtime", runtime_args(b)),
        ("join", join_args(b)),
        ("verify", verify_args(b)),
    ):
        r = guest.step(step, *args, secrets=SECRETS if step == "join" else None)
        assert r.returncode == 0, f"{step}: {r.stderr}"
        calls += r.calls
        if "reboot: scheduled" in r.stdout:
            reboots += 1
            guest.reboot()
    return calls, reboots


def test_first_provisioning_installs_everything_without_a_reboot(guest: FakeGuest) -> None:
    # cloud-init's vendor data blacklisted and unloaded nouveau; the fresh driver module loads with modprobe.
    calls, reboots = provision(guest, spec())
    assert reboots == 0
    assert guest.installed("nvidia-headless-580-server-open") == "580.95.05-0ubuntu0.24.04.2"
    assert guest.installed("nvidia-utils-580-server") == "580.95.05-0ubuntu0.24.04.2"
    assert guest.installed("linux-headers-6.8.0-49-generic") is not None
    assert guest.installed("nvidia-container-toolkit") == "1.18.2-1"
    assert guest.installed("kubeadm") == "1.34.2-1.1"
    assert set(guest.holds()) >= {
        "nvidia-headless-580-server-open", "nvidia-utils-580-server", "nvidia-container-toolkit",
        "libnvidia-container1", "kubelet", "kubeadm", "kubectl",
    }  # fmt: skip
    assert "nvidia-ctk runtime configure --runtime=containerd --set-as-default" in calls
    assert calls.count("systemctl restart containerd") == 1
    assert [c for c in calls if c.startswith("kubeadm")] == [
        f"kubeadm join --config {guest.read('join-config-path').strip()}"
    ]
    assert not [c for c in calls if c.startswith(("systemd-run", "update-initramfs"))]


def test_second_run_changes_nothing_and_reboots_nothing(guest: FakeGuest) -> None:
    b = spec()
    provision(guest, b)
    before = files(guest)
    calls, reboots = provision(guest, b)
    assert reboots == 0
    assert mutating(calls) == []
    assert not [c for c in calls if c.startswith(("apt-get", "modprobe"))]
    assert files(guest) == before


def test_nouveau_loaded_without_blacklist_costs_exactly_one_reboot(guest: FakeGuest) -> None:
    # A standalone host whose cloud-init did not blacklist nouveau, and nouveau bound and busy.
    (guest.root / "etc/modprobe.d/blacklist-nouveau.conf").unlink()
    guest.write("sys/module/nouveau/refcnt", "1\n")
    guest.write("nouveau-busy", "")
    calls, reboots = provision(guest, spec())
    assert reboots == 1
    assert "update-initramfs -u" in calls
    assert "blacklist nouveau" in guest.read("etc/modprobe.d/blacklist-nouveau.conf")
    again, reboots = provision(guest, spec())
    assert reboots == 0 and mutating(again) == []


def test_blacklist_written_but_nouveau_unloadable_needs_no_reboot(guest: FakeGuest) -> None:
    (guest.root / "etc/modprobe.d/blacklist-nouveau.conf").unlink()
    guest.write("sys/module/nouveau/refcnt", "0\n")
    r = guest.step("driver", *driver_args(spec()))
    assert r.returncode == 0, r.stderr
    assert "reboot: not-needed" in r.stdout
    assert "modprobe -r nouveau" in r.calls and "update-initramfs -u" in r.calls


def test_a_blacklist_from_another_file_is_respected(guest: FakeGuest) -> None:
    (guest.root / "etc/modprobe.d/blacklist-nouveau.conf").unlink()
    guest.write("usr/lib/modprobe.d/nvidia-graphics-drivers.conf", "blacklist nouveau\n")
    r = guest.step("driver", *driver_args(spec(driverMode="operator", toolkit=False)))
    assert r.returncode == 0, r.stderr
    assert not (guest.root / "etc/modprobe.d/blacklist-nouveau.conf").exists()
    assert "update-initramfs -u" not in r.calls


def test_driver_version_bump_reinstalls_the_pin_and_reboots_once(guest: FakeGuest) -> None:
    provision(guest, spec())
    bumped = spec(driverVersion="580.105.08")
    r = guest.step("driver", *driver_args(bumped))
    assert r.returncode == 0, r.stderr
    assert guest.installed("nvidia-headless-580-server-open") == "580.105.08-0ubuntu0.24.04.1"
    assert "reboot: scheduled" in r.stdout  # the loaded 580.95.05 module is still in the kernel
    assert [c for c in r.calls if c.startswith("systemd-run")] == [
        "systemd-run --on-active=5 --unit=pgc-guest-reboot systemctl reboot"
    ]
    guest.reboot()
    v = guest.step("verify", *verify_args(bumped))
    assert v.returncode == 0, v.stderr
    again = guest.step("driver", *driver_args(bumped))
    assert "reboot: not-needed" in again.stdout and mutating(again.calls) == []


def test_branch_only_pin_keeps_the_installed_version(guest: FakeGuest) -> None:
    b = spec(driverVersion=None, driverFlavor="desktop", kernelModules="proprietary")
    guest.write("var/lib/fake-archive/nvidia-headless-580", "580.105.08-0ubuntu1\n")
    guest.write("var/lib/fake-archive/nvidia-utils-580", "580.105.08-0ubuntu1\n")
    first = guest.step("driver", *driver_args(b))
    assert first.returncode == 0, first.stderr
    assert guest.installed("nvidia-headless-580") == "580.105.08-0ubuntu1"
    guest.write("var/lib/fake-archive/nvidia-headless-580", "580.110.01-0ubuntu1\n580.105.08-0ubuntu1\n")
    second = guest.step("driver", *driver_args(b))
    assert mutating(second.calls) == [] and guest.installed("nvidia-headless-580") == "580.105.08-0ubuntu1"


def test_missing_driver_version_names_step_expected_and_seen(guest: FakeGuest) -> None:
    r = guest.step("driver", *driver_args(spec(driverVersion="580.1.2")))
    assert r.returncode == 1
    assert r.stderr.strip() == (
        "driver: nvidia-headless-580-server-open: expected a 580.1.2-* package in the archive, "
        "saw 580.105.08-0ubuntu0.24.04.1,580.95.05-0ubuntu0.24.04.2"
    )
    assert mutating(r.calls) == []


def test_operator_mode_installs_no_driver(guest: FakeGuest) -> None:
    b = spec(driverMode="operator", toolkit=False)
    r = guest.step("driver", *driver_args(b))
    assert r.returncode == 0, r.stderr
    assert "driver: left to the GPU Operator" in r.stdout
    assert not [c for c in r.calls if c.startswith(("apt-get", "modprobe nvidia"))]


def test_purge_only_removes_the_driver_packages(guest: FakeGuest) -> None:
    provision(guest, spec())
    r = guest.step("driver", *driver_args(spec()), "--purge")
    assert r.returncode == 0, r.stderr
    assert guest.installed("nvidia-headless-580-server-open") is None
    assert guest.installed("nvidia-container-toolkit") == "1.18.2-1"
    assert not [c for c in r.calls if c.startswith("systemd-run")]


def test_join_keeps_the_secrets_out_of_arguments_output_and_disk(guest: FakeGuest) -> None:
    r = guest.step("join", *join_args(spec()), secrets=SECRETS)
    assert r.returncode == 0, r.stderr
    config = guest.read("join-config")
    assert f'token: "{TOKEN}"' in config and f'caCertHashes: ["{HASH}"]' in config
    assert 'name: "gpu-a10-1"' in config and "apiVersion: kubeadm.k8s.io/v1beta4" in config
    # The node's name in the join config is the identity of kubelet's credential, the one the node steps act with.
    assert "CN=system:node:gpu-a10-1" in guest.read("etc/kubernetes/kubelet.conf")
    assert guest.read("join-config-mode").strip() == "600"
    leftover = Path(guest.read("join-config-path").strip())
    assert not leftover.exists()
    everything = r.stdout + r.stderr + "\n".join(r.calls)
    assert TOKEN not in everything and HASH not in everything and TOKEN.split(".")[1] not in everything


def test_join_through_an_ipv6_api_endpoint(guest: FakeGuest) -> None:
    r = guest.step("join", *join_args(spec(apiEndpoint="[2001:db8::10]:6443")), secrets=SECRETS)
    assert r.returncode == 0, r.stderr
    assert 'apiServerEndpoint: "[2001:db8::10]:6443"' in guest.read("join-config")


def test_join_refuses_a_malformed_token_without_showing_it(guest: FakeGuest) -> None:
    bad = {"PGC_JOIN_TOKEN": "abcdef.NOT-A-TOKEN-$(id)", "PGC_CA_CERT_HASH": HASH}
    r = guest.step("join", *join_args(spec()), secrets=bad)
    assert r.returncode == 1
    assert r.stderr.strip().endswith("join token: expected [a-z0-9]{6}.[a-z0-9]{16}, saw a malformed value")
    assert "NOT-A-TOKEN" not in r.stderr + r.stdout
    assert not [c for c in r.calls if c.startswith("kubeadm")]


def test_join_on_an_older_minor_uses_v1beta3(guest: FakeGuest) -> None:
    for package in ("kubelet", "kubeadm", "kubectl"):
        guest.write(f"var/lib/fake-archive/{package}", "1.30.14-1.1\n")
    r = guest.step("join", *join_args(spec(kubernetesMinor=30)), secrets=SECRETS)
    assert r.returncode == 0, r.stderr
    assert "apiVersion: kubeadm.k8s.io/v1beta3" in guest.read("join-config")
    assert guest.read("etc/apt/sources.list.d/kubernetes.list").strip().endswith("/core:/stable:/v1.30/deb/ /")


@pytest.mark.parametrize(
    ("have", "minor", "why"),
    [
        ("1.35.1-1.1", 34, "join: kubernetes.version: expected 1.35 or later on a node that joined at 1.35, saw 1.34: "
         "a joined node is never downgraded (rebuild it: pulumi up --replace its VM)"),
        ("1.32.9-1.1", 34, "join: kubernetes.version: expected 1.33 (one minor at a time), saw 1.34: kubeadm does not "
         "skip minors; set kubernetes.version to each minor in turn"),
    ],
)  # fmt: skip
def test_a_joined_node_is_never_downgraded_nor_upgraded_past_a_minor(
    guest: FakeGuest, have: str, minor: int, why: str
) -> None:
    # kubernetes.io/docs/tasks/administer-cluster/kubeadm/kubeadm-upgrade/: "Skipping MINOR versions when upgrading
    # is unsupported"; a downgrade has no kubeadm procedure at all. Refused before anything changes.
    for package in ("kubelet", "kubeadm", "kubectl"):
        guest.write(f"var/lib/fake-dpkg/{package}", have)
    guest.write("etc/kubernetes/kubelet.conf", "kind: Config\n")
    r = guest.step("join", *join_args(spec(kubernetesMinor=minor)), secrets=SECRETS)
    assert r.returncode == 1
    assert why in r.stderr
    assert not [c for c in r.calls if c.startswith(("apt-get", "kubeadm", "kubectl", "python3"))]
    assert guest.installed("kubelet") == have


def test_swap_is_turned_off_and_stays_off(guest: FakeGuest) -> None:
    guest.write("proc/swaps", "Filename Type Size Used Priority\n/swap.img file 4194300 0 -2\n")
    guest.write("etc/fstab", "LABEL=cloudimg-rootfs / ext4 defaults 0 1\n/swap.img none swap sw 0 0\n")
    r = guest.step("join", *join_args(spec()), secrets=SECRETS)
    assert r.returncode == 0, r.stderr
    assert "swapoff -a" in r.calls
    assert guest.read("etc/fstab") == "LABEL=cloudimg-rootfs / ext4 defaults 0 1\n#/swap.img none swap sw 0 0\n"
    assert guest.read("etc/sysctl.d/99-kubernetes.conf").count("= 1") == 3


def test_hostile_arguments_stay_data(guest: FakeGuest, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    r = guest.step("join", "--node-name", f"x;touch {marker}", "--api-endpoint", "k:1", "--minor", "34")
    assert r.returncode == 1 and "--node-name: expected a DNS label" in r.stderr
    r = guest.step("driver", "--mode", "host", "--branch", f"580$(touch {marker})")
    assert r.returncode == 1 and "--branch: expected a three-digit branch" in r.stderr
    assert not marker.exists()


def test_verify_passes_with_exactly_the_assigned_gpus(guest: FakeGuest) -> None:
    provision(guest, spec())
    r = guest.step("verify", *verify_args(spec()))
    assert r.returncode == 0 and r.stdout.splitlines() == ["verify: driver: 580.95.05", "verify: ok: NVIDIA-A10"]


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (
            {"fake-lspci": ""},
            "verify: lspci -nn: expected 1 x 10de:2236, saw 0",
        ),
        (
            {"fake-lspci": A10_LSPCI * 2, "fake-gpus": A10_SMI * 2},
            "verify: lspci -nn: expected 1 x 10de:2236, saw 2",
        ),
        (
            {"fake-gpus": "GPU 0: NVIDIA A100-PCIE-40GB (UUID: GPU-1)\n"},
            "verify: nvidia-smi -L: expected NVIDIA-A10, saw NVIDIA-A100-PCIE-40GB",
        ),
        (
            {"sys/module/nvidia/version": "580.105.08\n", "var/lib/fake-dpkg/nvidia-utils-580-server": "580.105.08-1"},
            "verify: driver version: expected 580.95.05, saw 580.105.08",
        ),
        (
            {"fake-running/containerd/conf.d/99-nvidia.toml": ""},  # a daemon started before the toolkit's drop-in
            "verify: containerd running config (crictl info): expected an nvidia runtime, saw runc",
        ),
    ],
    ids=["gpu-missing", "extra-gpu", "wrong-model", "driver-version", "no-nvidia-runtime"],
)
def test_verify_names_what_it_expected_and_saw(guest: FakeGuest, setup: dict[str, str], message: str) -> None:
    provision(guest, spec())
    for path, content in setup.items():
        guest.write(path, content)
    r = guest.step("verify", *verify_args(spec()))
    assert r.returncode == 1
    assert r.stderr.strip() == message


def test_verify_without_a_driver_reports_nvidia_smi_failing(guest: FakeGuest) -> None:
    r = guest.step("verify", *verify_args(spec()))
    assert r.returncode == 1
    line, output = r.stderr.split("\n", 1)
    assert line == (
        "verify: nvidia-smi -L: expected 1 GPU(s), saw exit 9: NVIDIA-SMI has failed because it couldn't "
        "communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
    )
    assert output.startswith("NVIDIA-SMI has failed")  # the tool's own output below the line


def test_gpu_spec_validation() -> None:
    with pytest.raises(ValueError, match="not on branch 580"):
        spec(driverVersion="570.1.2")
    with pytest.raises(ValueError, match="host toolkit needs the host driver"):
        spec(driverMode="operator")
    assert ExpectedGpu(vendorDevice="10de:2236", product="NVIDIA-A10").product == "NVIDIA-A10"


def test_the_fake_kubeadm_upgrade_node_acts_through_the_kubelets_kubeconfig(guest: FakeGuest) -> None:
    # The contract of fakeguest_tools' `kubeadm upgrade node`, after kubernetes v1.34.4: on a worker its client is
    # kubelet.conf (cmd/kubeadm/app/cmd/upgrade/node.go, newNodeData: "couldn't create a Kubernetes client from
    # file"), the control-plane phase is skipped (phases/upgrade/node/controlplane.go) and the kubelet-config phase
    # writes the kubelet's configuration and says so (phases/upgrade/kubeletconfig.go).
    r = guest.run_stdin("kubeadm upgrade node\n")
    assert r.returncode == 1
    assert r.stderr.startswith('couldn\'t create a Kubernetes client from file "/etc/kubernetes/kubelet.conf"')
    guest.write("etc/kubernetes/kubelet.conf", "kind: Config\n")
    r = guest.run_stdin("kubeadm upgrade node\n")
    assert r.returncode == 0, r.stderr
    assert "[upgrade/control-plane] Skipping phase. Not a control plane node." in r.stdout
    assert r.stdout.rstrip().endswith(
        "[upgrade/kubelet-config] The kubelet configuration for this node was successfully upgraded!"
    )
    assert (guest.root / "var/lib/kubelet/config.yaml").exists()
    assert guest.run_stdin("systemctl restart kubelet\n").returncode == 0  # a unit other than containerd
