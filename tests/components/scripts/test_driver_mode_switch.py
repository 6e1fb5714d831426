"""driverMode host -> operator (and back) on a joined node, in fake guests against one fake API server: the host
driver goes inside a rollout slot (cordoned, drained first), its module with it (unloaded, or a reboot when it is
busy), so the GPU Operator's driver container can take the node; back to host mode installs it again, in a slot."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from tests.components.scripts.fakeguest import FakeGuest, mutating
from tests.components.scripts.fakekube import FakeCluster
from tests.components.scripts.test_rollout import OLD, held, joined_guest, run, spec, two_nodes


@pytest.fixture
def cluster(tmp_path: Path) -> FakeCluster:
    return two_nodes(tmp_path / "api.json")


def operator(node: str) -> GuestBootstrapSpec:
    return spec(node, OLD).model_copy(update={"driver_mode": "operator"})


def driver_packages(guest: FakeGuest) -> list[str]:
    return sorted(p.name for p in (guest.root / "var/lib/fake-dpkg").glob("nvidia-*"))


def test_host_to_operator_removes_the_host_driver_in_a_slot(tmp_path: Path, cluster: FakeCluster) -> None:
    guest = joined_guest(tmp_path / "a", cluster, "gpu-a")
    assert driver_packages(guest) == ["nvidia-headless-580-server-open", "nvidia-utils-580-server"]
    r = run(guest, "driver", operator("gpu-a"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    took = next(i for i, line in enumerate(lines) if line.startswith("rollout: gpu-a took slot"))
    removed = next(i for i, line in enumerate(lines) if line.startswith("driver: host driver removed"))
    assert "(the host driver to remove (driver mode operator))" in lines[took]
    assert "rollout: drained gpu-a" in lines[took:removed]  # no GPU pod meets the removal
    assert driver_packages(guest) == [] and guest.holds() == []
    assert not (guest.root / "sys/module/nvidia").exists()  # unloaded: nothing held it on the drained node
    assert "reboot: not-needed" in r.stdout
    verify = run(guest, "verify", operator("gpu-a"))
    assert verify.returncode == 0, verify.stderr
    assert "rollout: uncordoned gpu-a" in verify.stdout and held(cluster) == {}
    # The next run changes nothing and asks the API server nothing; nor does a boot with the operator's module.
    again = run(guest, "driver", operator("gpu-a"))
    assert again.returncode == 0 and "reboot: not-needed" in again.stdout
    assert mutating(again.calls) == [] and not [c for c in again.calls if c.startswith("kubectl")]
    guest.reboot()
    guest.write("sys/module/nvidia/version", "580.105.08\n")  # what the operator's driver container loads
    after = run(guest, "driver", operator("gpu-a"))
    assert after.returncode == 0 and "reboot: not-needed" in after.stdout and mutating(after.calls) == []


def test_a_busy_host_module_is_taken_away_by_one_reboot(tmp_path: Path, cluster: FakeCluster) -> None:
    guest = joined_guest(tmp_path / "a", cluster, "gpu-a")
    guest.write("nvidia-busy", "")  # something still holds /dev/nvidia*: modprobe -r refuses
    r = run(guest, "driver", operator("gpu-a"))
    assert r.returncode == 0, r.stderr
    assert "driver: reboot needed: expected no host nvidia module (driver mode operator)" in r.stdout
    assert "reboot: scheduled" in r.stdout
    guest.reboot()
    assert not (guest.root / "sys/module/nvidia").exists()  # the packages are gone: no module at boot
    verify = run(guest, "verify", operator("gpu-a"))
    assert verify.returncode == 0, verify.stderr
    again = run(guest, "driver", operator("gpu-a"))
    assert again.returncode == 0 and "reboot: not-needed" in again.stdout and mutating(again.calls) == []


def test_a_killed_removal_is_finished_by_the_next_run(tmp_path: Path, cluster: FakeCluster) -> None:
    guest = joined_guest(tmp_path / "a", cluster, "gpu-a")
    purge = next(
        n for n, c in enumerate(run(FakeGuest.copy(guest, tmp_path / "ref"), "driver", operator("gpu-a")).calls, 1)
        if c.startswith("apt-get") and " purge " in c
    )  # fmt: skip
    guest.fault(purge, "kill")
    run(guest, "driver", operator("gpu-a"))
    guest.fault(None)
    r = run(guest, "driver", operator("gpu-a"))
    assert r.returncode == 0 and "reboot: not-needed" in r.stdout, r.stderr
    assert driver_packages(guest) == [] and not (guest.root / "sys/module/nvidia").exists()


def test_operator_back_to_host_installs_the_driver_in_a_slot(tmp_path: Path, cluster: FakeCluster) -> None:
    guest = joined_guest(tmp_path / "a", cluster, "gpu-a")
    assert run(guest, "driver", operator("gpu-a")).returncode == 0
    assert run(guest, "verify", operator("gpu-a")).returncode == 0
    r = run(guest, "driver", spec("gpu-a", OLD))
    assert r.returncode == 0, r.stderr
    assert "rollout: gpu-a took slot" in r.stdout and "(installed)" in r.stdout
    if "reboot: scheduled" in r.stdout:
        guest.reboot()
    assert run(guest, "verify", spec("gpu-a", OLD)).returncode == 0
    assert driver_packages(guest) == ["nvidia-headless-580-server-open", "nvidia-utils-580-server"]
