"""Issue 24 against FakeHost's boot model: the IOMMU is decided from what runs (populated /sys/kernel/iommu_groups,
the kernel version), never from words on the command line; GPUs are bound by PCI address, so a console GPU of the
same model keeps its host driver; hosts prepared the old way converge without a needless reboot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.components.scripts.fakehost import A10, A100, BOOT, CLAIMS, GRUB, OLD_KERNEL, OWNER, FakeHost, mutating

CONSOLE = "0000:21:00.0"
"""A console A10: the same model (10de:2236) as the passed-through one at 0000:41:00."""
BLACKLIST = "etc/modprobe.d/blacklist-gpu-passthrough.conf"


def changed(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("changed: ")]


def settled(host: FakeHost, *gpus: tuple[str, str], pt: bool = False) -> None:
    """A third run changes nothing and reboots nothing."""
    r = host.prep(*gpus, pt=pt)
    assert r.returncode == 0 and r.stdout == "reboot: not-needed\n" and mutating(r.calls) == [], r.stdout + r.stderr


@pytest.mark.parametrize(
    ("cpu", "kernel"),
    [("amd", "6.8.12-4-pve"), ("amd", OLD_KERNEL), ("intel", "6.8.12-4-pve"), ("intel", "6.14.8-2-pve")],
)
def test_an_active_iommu_needs_no_reboot_and_no_iommu_words(tmp_path: Path, cpu: str, kernel: str) -> None:
    # AMD: on by default on every kernel; Intel: on by default from 6.8 (Proxmox VE 8.2+ and 9).
    host = FakeHost(tmp_path / "root", cpu=cpu, kernel=kernel)
    assert list((host.root / "sys/kernel/iommu_groups").iterdir())  # the IOMMU runs without any argument
    r = host.prep(A10, A100)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "reboot: not-needed"
    assert not any(c.startswith(("systemd-run", "update-grub", "qm", "pct")) for c in r.calls)
    assert host.read("etc/default/grub") == GRUB  # no amd_iommu=on, no intel_iommu=on, no iommu=pt
    assert "vfio: 0000:41:00.0 bound to vfio-pci (was nouveau)" in r.stdout  # bound now, at runtime
    assert {host.driver_of(f) for f in ("0000:41:00.0", "0000:81:00.0", "0000:81:00.1")} == {"vfio-pci"}
    host.reboot()  # whenever it happens, the next boot binds them from the configuration
    assert {host.driver_of(f) for f in ("0000:41:00.0", "0000:81:00.0", "0000:81:00.1")} == {"vfio-pci"}
    assert host.verify(A10[0], A100[0]).returncode == 0
    settled(host, A10, A100)


@pytest.mark.parametrize("cpu", ["amd", "intel"])
def test_a_busy_node_with_its_iommu_on_passes_when_idle(tmp_path: Path, cpu: str) -> None:
    # The symptom: a Proxmox VE 8.2+ node that already passes GPUs through, running VMs, rebootPolicy
    # when-idle: host prep failed on every up, wanting a reboot for amd_iommu=on iommu=pt. Now nothing needs one.
    host = FakeHost(tmp_path / "root", cpu=cpu)
    assert host.prep(A10, A100).returncode == 0
    host.guests("VM 3101 gpu-a100-a running", "CT 200 dns running")
    r = host.prep(A10, A100)
    assert (r.returncode, r.stdout) == (0, "reboot: not-needed\n"), r.stderr
    assert mutating(r.calls) == [] and host.running_args(3101) is not None


def test_iommu_pt_takes_0_or_1(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "root")
    args = ("--owner", OWNER, "--cpu-vendor", "amd", "--iommu-pt", "yes", "--gpu", "0000:41:00=10de:2236")
    r = host.run("host_prep.sh", *args)
    assert r.returncode == 1 and r.stderr.strip() == "host-prep: arguments: expected --iommu-pt 0 or 1, saw 'yes'"


def test_an_intel_kernel_before_6_8_gets_intel_iommu_on_and_one_reboot(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "root", cpu="intel", kernel=OLD_KERNEL)
    assert not (host.root / "sys/kernel/iommu_groups").exists()
    r = host.prep(A10)
    assert (
        r.returncode == 0 and r.stdout.splitlines()[-1] == "reboot: scheduled (the running kernel lacks intel_iommu=on)"
    )
    assert host.reboot_if_scheduled() and host.read("proc/cmdline") == f"{BOOT} quiet iommu=soft intel_iommu=on\n"
    assert host.driver_of("0000:41:00.0") == "vfio-pci" and host.verify(A10[0]).returncode == 0
    settled(host, A10)
    assert host.boots == 2


def test_intel_iommu_on_only_where_the_running_kernel_needs_it(tmp_path: Path) -> None:
    # A 6.5 kernel built with CONFIG_INTEL_IOMMU_DEFAULT_ON runs with the IOMMU on: it needs nothing, no reboot.
    host = FakeHost(tmp_path / "default-on", cpu="intel", kernel=OLD_KERNEL)
    host.intel_default_on = True
    host.reboot()
    r = host.prep(A10)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "reboot: not-needed", r.stdout + r.stderr
    assert "intel_iommu" not in host.read("etc/default/grub")
    # Proxmox's 6.5 has its IOMMU on thanks to intel_iommu=on: the boot configuration keeps it for the next boot,
    # even after someone took it out of the file (put back, GRUB regenerated, no reboot: the running kernel has it).
    host = FakeHost(tmp_path / "proxmox", cpu="intel", kernel=OLD_KERNEL)
    assert host.prep(A10).returncode == 0 and host.reboot_if_scheduled()
    host.write("etc/default/grub", GRUB)
    r = host.prep(A10)
    assert r.returncode == 0 and changed(r.stdout) == ["changed: /etc/default/grub"] and "update-grub " in r.calls
    assert r.stdout.splitlines()[-1] == "reboot: not-needed"
    assert "intel_iommu=on" in host.generated_cmdline()


def test_iommu_pt_only_when_the_spec_asks(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "root")
    assert host.prep(A10, A100).returncode == 0 and "iommu=pt" not in host.read("etc/default/grub")
    r = host.prep(A10, A100, pt=True)  # iommuPassthrough: true
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "reboot: scheduled (the running kernel lacks iommu=pt)"
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"' in host.read("etc/default/grub")  # in place of iommu=soft
    assert host.reboot_if_scheduled() and host.verify(A10[0], A100[0], pt=True).returncode == 0
    settled(host, A10, A100, pt=True)
    # Asked no more: host prep does not take it away (it may be yours), and nothing reboots.
    r = host.prep(A10, A100)
    assert changed(r.stdout) == [f"changed: /{CLAIMS}/{OWNER}.conf"] and mutating(r.calls) == [], r.stdout
    settled(host, A10, A100)


def test_an_iommu_the_firmware_keeps_off_fails_instead_of_rebooting_forever(tmp_path: Path) -> None:
    amd = FakeHost(tmp_path / "amd", firmware_iommu=False)
    r = amd.prep(A10)
    assert r.returncode == 1 and not any(c.startswith("systemd-run") for c in r.calls)
    assert (
        r.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "host-prep: iommu: expected an active IOMMU (entries in /sys/kernel/iommu_groups) on kernel 6.8.12-4-pve "
            f"with '{BOOT} quiet iommu=soft', saw none; turn on VT-d (Intel) or the IOMMU/AMD-Vi (AMD) in the firmware"
        )
    )
    # Intel 6.8 with VT-d off in the firmware: the IOMMU is off, so intel_iommu=on is worth one reboot; then the
    # same failure, never a second reboot.
    intel = FakeHost(tmp_path / "intel", cpu="intel", firmware_iommu=False)
    r = intel.prep(A10)
    assert (
        r.returncode == 0 and r.stdout.splitlines()[-1] == "reboot: scheduled (the running kernel lacks intel_iommu=on)"
    )
    assert intel.reboot_if_scheduled()
    r = intel.prep(A10)
    assert r.returncode == 1 and "host-prep: iommu: expected an active IOMMU" in r.stderr
    assert mutating(r.calls) == [] and not intel.reboot_if_scheduled()


def console_node(root: Path, cpu: str = "amd", kernel: str = "6.8.12-4-pve") -> FakeHost:
    """The A10 and A100 for passthrough, and a console A10 of the same model, on nouveau."""
    host = FakeHost(root, cpu=cpu, kernel=kernel)
    host.device(CONSOLE, "10de", "2236", driver="nouveau", pci_class="0x030000", group=30)
    host.reboot()
    return host


def test_a_console_gpu_of_the_same_model_keeps_its_host_driver(tmp_path: Path) -> None:
    host = console_node(tmp_path / "root")
    r = host.prep(A10, A100)
    assert r.returncode == 0, r.stderr
    assert host.driver_of(CONSOLE) == "nouveau"  # runtime: only the declared functions were touched
    assert not (host.root / BLACKLIST).exists()  # nouveau is still needed for the console
    vfio = host.read("etc/modprobe.d/vfio.conf")
    assert "ids=" not in vfio and CONSOLE not in vfio
    host.reboot()  # the boot: vfio-pci takes exactly the declared functions, nouveau the console
    assert host.driver_of(CONSOLE) == "nouveau"
    assert {host.driver_of(f) for f in ("0000:41:00.0", "0000:81:00.0", "0000:81:00.1")} == {"vfio-pci"}
    assert host.verify(A10[0], A100[0]).returncode == 0
    settled(host, A10, A100)


def test_the_install_command_is_one_line_kmod_runs_with_sh(tmp_path: Path) -> None:
    # modprobe.d(5): "install modulename command...": the rest of the line, run by the shell; the boot model runs
    # exactly that line (in the fake root) whenever vfio-pci loads.
    host = console_node(tmp_path / "root")
    assert host.prep(A10).returncode == 0
    installs = re.findall(r"^install .*$", host.read("etc/modprobe.d/vfio.conf"), re.M)
    assert installs == [
        "install vfio-pci for f in 0000:41:00.0; do [ ! -e /sys/bus/pci/devices/$f/driver_override ] || echo "
        "vfio-pci > /sys/bus/pci/devices/$f/driver_override; done; modprobe --ignore-install vfio-pci $CMDLINE_OPTS"
    ]
    host.reboot()
    assert host.read("sys/bus/pci/devices/0000:41:00.0/driver_override") == "vfio-pci\n"
    assert host.read(f"sys/bus/pci/devices/{CONSOLE}/driver_override") == "(null)\n"
    assert (host.driver_of(CONSOLE), host.driver_of("0000:41:00.0")) == ("nouveau", "vfio-pci")
    # An undeclared A100 was never touched either: it keeps its host driver (none in this fake).
    assert host.driver_of("0000:81:00.0") is None


OLD_VFIO = """# Managed by proxmox-gpu-cluster
options vfio-pci ids=10de:1aef,10de:20f1,10de:2236
softdep nouveau pre: vfio-pci
softdep nvidia pre: vfio-pci
softdep nvidiafb pre: vfio-pci
softdep nvidia_drm pre: vfio-pci
softdep snd_hda_intel pre: vfio-pci"""
OLD_BLACKLIST = """# Managed by proxmox-gpu-cluster: host drivers must not claim passthrough GPUs
blacklist nouveau
blacklist nvidia
blacklist nvidiafb
blacklist nvidia_drm"""


def prepared_the_old_way(root: Path, cpu: str = "amd", console: bool = True) -> FakeHost:
    """A node an earlier version prepared: <cpu>_iommu=on iommu=pt, ids= by vendor:device, the blacklist; booted."""
    host = FakeHost(root, cpu=cpu)
    if console:
        host.device(CONSOLE, "10de", "2236", driver="nouveau", pci_class="0x030000", group=30)
    host.write("etc/default/grub", GRUB.replace("quiet iommu=soft", f"quiet {cpu}_iommu=on iommu=pt"))
    host.write("etc/modules-load.d/vfio.conf", "# Managed by proxmox-gpu-cluster\nvfio\nvfio_iommu_type1\nvfio_pci\n")
    host.write("etc/modprobe.d/vfio.conf", OLD_VFIO + "\n")
    host.write(BLACKLIST, OLD_BLACKLIST + "\n")
    for tool in (["update-grub"], ["update-initramfs", "-u", "-k", "all"]):
        host.run_quietly(*tool)
    host.reboot()
    return host


def test_the_old_ids_configuration_took_the_console_gpu(tmp_path: Path) -> None:
    # What the issue reports, reproduced by the boot model: ids= and the blacklist take every A10, the console too.
    host = prepared_the_old_way(tmp_path / "root")
    assert host.driver_of(CONSOLE) == "vfio-pci"


@pytest.mark.parametrize("cpu", ["amd", "intel"])
def test_a_host_prepared_the_old_way_converges_without_a_reboot(tmp_path: Path, cpu: str) -> None:
    host = prepared_the_old_way(tmp_path / "root", cpu=cpu)
    r = host.prep(A10, A100)
    assert r.returncode == 0, r.stderr
    files = ["changed: /etc/modprobe.d/vfio.conf", "changed: /etc/modprobe.d/blacklist-gpu-passthrough.conf (removed)"]
    files += [f"changed: /{CLAIMS}/{OWNER}.conf", "changed: /etc/initramfs-tools/modules"]
    # AMD: amd_iommu=on goes (no such value), so GRUB is regenerated; Intel: intel_iommu=on stays (valid).
    assert sorted(changed(r.stdout)) == sorted(files + (["changed: /etc/default/grub"] if cpu == "amd" else []))
    assert "update-initramfs -u -k all" in r.calls and ("update-grub " in r.calls) is (cpu == "amd")
    assert r.stdout.splitlines()[-1] == "reboot: not-needed" and not any(c.startswith("systemd-run") for c in r.calls)
    assert host.read("etc/default/grub").count(f'quiet {"" if cpu == "amd" else "intel_iommu=on "}iommu=pt"') == 1
    settled(host, A10, A100)
    host.reboot()  # the next reboot, whenever the operator chooses: the console GPU is back on nouveau
    assert host.driver_of(CONSOLE) == "nouveau"
    assert {host.driver_of(f) for f in ("0000:41:00.0", "0000:81:00.0", "0000:81:00.1")} == {"vfio-pci"}
    settled(host, A10, A100)
