"""host_prep.sh against a fake Proxmox node: the first run writes the files and reboots once (when idle), the
second run after the reboot changes nothing; a newly declared GPU is bound to vfio-pci without a reboot; the reboot
policy decides what happens when running guests are in the way; an interrupted refresh is redone; bad input fails
by step."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.components.scripts.fakehost import A10, A100, BOOT, CLAIMS, GRUB, OLD_KERNEL, OWNER, FakeHost, mutating

MARKER = "run/proxmox-gpu-cluster/reboot-required"
SCHEDULED = "var/lib/proxmox-gpu-cluster/reboot-scheduled"
BOOT_ID_1 = "996ad860-2a9a-504f-8861-aeafd0b2ae29"  # the fake's first boot


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    """An Intel node on Proxmox VE 8.1's kernel 6.5: its IOMMU is off until intel_iommu=on (the one case left in
    which host prep reboots for the IOMMU; test_host_iommu.py has the others)."""
    return FakeHost(tmp_path / "root", cpu="intel", kernel=OLD_KERNEL)


def reboots(calls: list[str]) -> int:
    return sum(c.startswith("systemd-run") for c in calls)


def test_first_run_configures_and_schedules_one_reboot(host: FakeHost) -> None:
    r = host.prep(A10)
    assert r.returncode == 0, r.stderr
    assert sorted(line for line in r.stdout.splitlines() if line.startswith("changed: ")) == [
        "changed: /etc/default/grub",
        "changed: /etc/initramfs-tools/modules",
        "changed: /etc/modprobe.d/vfio.conf",
        "changed: /etc/modules-load.d/vfio.conf",
        f"changed: /{CLAIMS}/{OWNER}.conf",  # its claim, recorded first
    ]
    assert r.stdout.splitlines()[-1] == "reboot: scheduled (the running kernel lacks intel_iommu=on)"
    assert [c.split()[0] for c in r.calls] == ["update-initramfs", "update-grub", "qm", "pct", "systemd-run"]
    assert "update-initramfs -u -k all" in r.calls
    grub = host.read("etc/default/grub")
    # existing arguments kept, the conflicting iommu=soft replaced, all on one line, other lines untouched
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=soft intel_iommu=on"' in grub
    assert grub.replace('"quiet iommu=soft intel_iommu=on"', '"quiet iommu=soft"') == GRUB
    assert host.read("etc/modules-load.d/vfio.conf").split("\n")[1:] == ["vfio", "vfio_iommu_type1", "vfio_pci", ""]
    # the A100 is not declared here: nouveau must stay loadable for it, so no blacklist
    assert not (host.root / "etc/modprobe.d/blacklist-gpu-passthrough.conf").exists()
    vfio = host.read("etc/modprobe.d/vfio.conf")
    assert "ids=" not in vfio  # by address, never by vendor:device id
    assert "\ninstall vfio-pci for f in 0000:41:00.0; do " in vfio
    assert "softdep nouveau pre: vfio-pci" in vfio and "softdep nvidia pre: vfio-pci" in vfio
    # no runtime binding without an IOMMU: the reboot does it
    assert host.driver_of("0000:41:00.0") == "nouveau" and not any(c.startswith("tee") for c in r.calls)
    assert host.read("etc/modules") == "# /etc/modules\nbonding\n"
    assert host.read("etc/modprobe.d/pve-blacklist.conf") == "blacklist nvidiafb\n"


def test_second_run_after_reboot_changes_nothing(host: FakeHost) -> None:
    assert host.prep(A10).returncode == 0
    host.reboot()
    assert host.driver_of("0000:41:00.0") == "vfio-pci"
    assert host.generated_cmdline() == f"{BOOT} quiet iommu=soft intel_iommu=on" == host.read("proc/cmdline").strip()
    before = host.state()
    r = host.prep(A10)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "reboot: not-needed\n"
    assert mutating(r.calls) == [] and r.calls == []
    after = host.state()
    # the reboot it scheduled came back with the arguments: its record goes, nothing else changes
    files = before["files"]
    assert isinstance(files, dict) and files.pop(SCHEDULED).startswith(f"{BOOT_ID_1} the running kernel lacks")
    assert after == before
    assert not (host.root / MARKER).exists()


def test_a_newly_declared_gpu_is_bound_at_runtime_without_a_reboot(host: FakeHost) -> None:
    assert host.prep(A10).returncode == 0
    host.reboot()
    host.guests("VM 3101 gpu-a10-a running")  # a worker runs on the A10: nothing may reboot the node
    r = host.prep(A10, A100)
    assert r.returncode == 0, r.stderr
    assert [line for line in r.stdout.splitlines() if line.startswith("changed: ")] == [
        f"changed: /{CLAIMS}/{OWNER}.conf",  # the owner's claim now holds the A100 too
        "changed: /etc/modprobe.d/blacklist-gpu-passthrough.conf",  # now every NVIDIA card is declared
        "changed: /etc/modprobe.d/vfio.conf",
    ]
    assert "install vfio-pci for f in 0000:41:00.0 0000:81:00.0 0000:81:00.1; do" in host.read(
        "etc/modprobe.d/vfio.conf"
    )
    assert "vfio: 0000:81:00.0 bound to vfio-pci (was unbound)" in r.stdout
    assert "vfio: 0000:81:00.1 bound to vfio-pci (was snd_hda_intel)" in r.stdout
    assert host.driver_of("0000:81:00.0") == host.driver_of("0000:81:00.1") == "vfio-pci"
    assert host.driver_of("0000:41:00.0") == "vfio-pci"  # the running worker's GPU was not touched
    assert r.stdout.splitlines()[-1] == "reboot: not-needed"
    assert reboots(r.calls) == 0 and "update-initramfs -u -k all" in r.calls
    assert not any(c.startswith(("update-grub", "qm", "pct")) for c in r.calls)
    # and the next run is quiet again
    assert mutating(host.prep(A10, A100).calls) == []


def test_a_gpu_that_will_not_unbind_needs_a_reboot(host: FakeHost) -> None:
    assert host.prep(A10).returncode == 0
    host.reboot()
    host.write("busy-0000:81:00.1", "")  # the host still uses the audio function
    r = host.prep(A10, A100)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == ("reboot: scheduled (0000:81:00.1 could not be bound to vfio-pci at runtime)")


def test_when_idle_refuses_to_reboot_over_running_guests_and_resumes_later(host: FakeHost) -> None:
    host.guests("VM 3101 gpu-a100-a running", "VM 3102 stopped-one stopped", "CT 200 dns running")
    r = host.prep(A10)
    assert r.returncode == 1
    assert r.stderr.splitlines()[-1] == (
        "host-prep: reboot: expected no running guests before rebooting the node (the running kernel lacks "
        "intel_iommu=on), saw VM 3101 (gpu-a100-a), CT 200 (dns); stop them, or set rebootPolicy: always (or "
        "never, and reboot it yourself). The configuration is written; the next run continues from here"
    )
    assert reboots(r.calls) == 0
    assert 'intel_iommu=on"' in host.read("etc/default/grub")  # written, refreshed, not applied
    assert "update-grub " in r.calls
    # The guests are stopped; the next run writes nothing new and reboots.
    host.guests()
    r = host.prep(A10)
    assert r.returncode == 0, r.stderr
    assert not [line for line in r.stdout.splitlines() if line.startswith("changed: ")]
    assert reboots(r.calls) == 1 and r.stdout.startswith("reboot: scheduled")


def test_always_reboots_anyway_and_says_what_goes_down(host: FakeHost) -> None:
    host.guests("VM 3101 gpu-a100-a running")
    r = host.prep(A10, policy="always")
    assert r.returncode == 0, r.stderr
    assert reboots(r.calls) == 1
    assert r.stdout.splitlines()[-1] == (
        "reboot: scheduled (the running kernel lacks intel_iommu=on; running guests go down with it: "
        "VM 3101 (gpu-a100-a))"
    )


def test_never_reports_the_reboot_and_leaves_it_to_you(host: FakeHost) -> None:
    r = host.prep(A10, policy="never")
    assert r.returncode == 0, r.stderr
    assert reboots(r.calls) == 0 and not any(c.startswith("qm") for c in r.calls)
    assert r.stdout.splitlines()[-1].startswith("reboot: required (the running kernel lacks intel_iommu=on")
    assert host.read(MARKER).strip() == "the running kernel lacks intel_iommu=on"
    host.reboot()  # the operator reboots it
    r = host.prep(A10, policy="never")
    assert r.stdout == "reboot: not-needed\n" and not (host.root / MARKER).exists()


def test_unlisted_guests_block_a_when_idle_reboot(host: FakeHost) -> None:
    host.write("fake-qm-broken", "")
    r = host.prep(A10)
    assert r.returncode == 1 and r.stderr.splitlines()[-1] == (
        "host-prep: reboot: expected the node's guests listed before rebooting it (the running kernel lacks "
        "intel_iommu=on), saw qm list failing; not rebooting"
    )
    assert reboots(r.calls) == 0


def test_an_interrupted_refresh_is_redone_by_the_next_run(host: FakeHost) -> None:
    grub = (host.bin / "update-grub").read_text()
    host.stub_script("update-grub", 'echo "/usr/sbin/grub-mkconfig: error: out of memory." >&2; exit 1')
    r = host.prep(A10)
    assert r.returncode == 1 and r.stderr.splitlines()[-2:] == [
        "host-prep: boot-loader: expected 'update-grub' to exit 0, saw exit 1 (the next run redoes it; its output "
        "follows)",
        "/usr/sbin/grub-mkconfig: error: out of memory.",
    ]
    (host.bin / "update-grub").write_text(grub)
    r = host.prep(A10)
    assert r.returncode == 0, r.stderr
    assert not [line for line in r.stdout.splitlines() if line.startswith("changed: ")]  # files were written
    assert "update-grub " in r.calls  # but the refresh had not finished
    assert "update-initramfs -u -k all" not in r.calls  # that one had
    assert mutating(host.prep(A10).calls) == ["systemd-run --on-active=5 systemctl reboot"]  # no reboot yet
    host.reboot()
    assert host.read("proc/cmdline") == f"{BOOT} quiet iommu=soft intel_iommu=on\n"


def test_all_functions_of_the_card_are_bound(host: FakeHost) -> None:
    r = host.prep(A10, A100)
    assert r.returncode == 0, r.stderr
    assert "install vfio-pci for f in 0000:41:00.0 0000:81:00.0 0000:81:00.1; do" in host.read(
        "etc/modprobe.d/vfio.conf"
    )
    # every NVIDIA card of the node is passed through: the host drivers may be blacklisted
    blacklist = host.read("etc/modprobe.d/blacklist-gpu-passthrough.conf")
    for module in ("nouveau", "nvidia", "nvidiafb", "nvidia_drm"):
        assert f"blacklist {module}\n" in blacklist + "\n"
    host.reboot()
    assert {host.driver_of(f) for f in ("0000:41:00.0", "0000:81:00.0", "0000:81:00.1")} == {"vfio-pci"}


def test_iommu_pt_and_acs_override(host: FakeHost) -> None:
    r = host.prep(A10, acs="1", pt=True)
    assert r.returncode == 0, r.stderr
    # iommu=soft gives way to iommu=pt where it stood
    line = 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt intel_iommu=on pcie_acs_override=downstream,multifunction"'
    assert line in host.read("etc/default/grub")


def test_systemd_boot_is_detected(host: FakeHost) -> None:
    host.proxmox_boot("uefi")  # ZFS on UEFI without Secure Boot: systemd-boot
    r = host.prep(A10)
    assert r.returncode == 0, r.stderr
    assert host.read("etc/kernel/cmdline") == "root=ZFS=rpool/ROOT/pve-1 boot=zfs intel_iommu=on\n"
    assert host.read("etc/default/grub") == GRUB  # not the boot loader in use
    assert "proxmox-boot-tool refresh" in r.calls and not any(c.startswith("update-grub") for c in r.calls)
    host.reboot()  # boots the ESP entry proxmox-boot-tool wrote: the arguments are active, vfio-pci has the A10
    assert host.read("proc/cmdline").endswith(" root=ZFS=rpool/ROOT/pve-1 boot=zfs intel_iommu=on\n")
    assert host.driver_of("0000:41:00.0") == "vfio-pci"
    assert mutating(host.prep(A10).calls) == []


def test_wrong_model_at_the_path_fails_the_step(host: FakeHost) -> None:
    r = host.prep(("0000:41:00", "10de:20b5"))
    assert r.returncode == 1
    assert (
        r.stderr.strip() == "host-prep: vfio-ids: expected 10de:20b5 at 0000:41:00.0 (the model owner "
        f"{OWNER} declares), saw 10de:2236"
    )
    assert reboots(r.calls) == 0 and not (host.root / CLAIMS).exists()  # a refused claim is never recorded


def test_missing_device_fails_the_step(host: FakeHost) -> None:
    r = host.prep(("0000:99:00", "10de:2236"))
    assert r.returncode == 1
    assert (
        r.stderr
        == f"host-prep: vfio-ids: expected a PCI device at 0000:99:00.0 (declared by owner {OWNER}), saw none\n"
    )


def test_unknown_policy_fails_the_step(host: FakeHost) -> None:
    r = host.prep(A10, policy="sometimes")
    assert r.returncode == 1
    assert (
        r.stderr.strip() == "host-prep: arguments: expected --reboot-policy when-idle, always or never, saw 'sometimes'"
    )


def test_spec_strings_are_arguments_not_code(host: FakeHost) -> None:
    # The component quotes every argument; even a hostile one is only ever data to the script.
    r = host.prep(("0000:41:00", "$(touch /tmp/pwned)"))
    assert r.returncode == 1 and r.stderr == (
        "host-prep: arguments: expected --gpu <domain:bus:device>=<vendor:device> (lower-case hex), "
        "saw '0000:41:00=$(touch /tmp/pwned)'\n"
    )
    r = host.prep(A10, owner="$(touch /tmp/pwned)")
    assert r.returncode == 1 and "saw '$(touch /tmp/pwned)'" in r.stderr
    assert not Path("/tmp/pwned").exists()
