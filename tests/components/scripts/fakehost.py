"""A fake Proxmox VE node for the host steps: a FakeRoot whose stubs behave like the parts of the kernel and of
Proxmox the steps touch, with a boot model in which a reboot boots what was last GENERATED, never the files.

- ``update-grub`` (grub-mkconfig) sources /etc/default/grub and then /etc/default/grub.d/*.cfg (so a later file
  overrides a variable) and writes /boot/grub/grub.cfg (as grub.cfg.new, renamed when complete): the default
  entry's ``linux`` line carries GRUB_CMDLINE_LINUX and GRUB_CMDLINE_LINUX_DEFAULT, the recovery entry
  GRUB_CMDLINE_LINUX and ``single``.
- ``proxmox-boot-tool`` (proxmox-kernel-helper; ``proxmox_boot()`` sets a node up as the installer does on a ZFS
  root): ``status`` prints the firmware (/sys/firmware/efi) and what each ESP listed in
  /etc/kernel/proxmox-boot-uuids was initialised for; ``refresh`` updates each ESP for the boot loader ``init`` put
  there: GRUB (the ESP holds EFI/proxmox/grubx64.efi, or the firmware is legacy BIOS) by running update-grub with
  the ESP as /boot, so from /etc/default/grub; systemd-boot by writing a loader entry whose ``options`` are the first
  line of /etc/kernel/cmdline. ESPs are not mounted normally: here they are fake-esp/<uuid>/. update-grub on such a
  node runs refresh first (proxmox-kernel-helper's /etc/grub.d/000_proxmox_boot_header). test_proxmox_boot_model.py
  is its contract.
- ``update-initramfs -u -k all`` packs /etc/modprobe.d/*.conf into /boot/initrd.img-<version> (.new, renamed).
- ``reboot()``: /proc/cmdline is what the firmware boots (``generated_cmdline``): on a proxmox-boot-tool node the
  first ESP's GRUB (UEFI with grubx64.efi, or BIOS) or systemd-boot entry, else /boot/grub/grub.cfg's default entry; a new boot id (/proc/sys/kernel/random/boot_id);
  /run emptied (a tmpfs); every VM stopped; the kernel ``self.kernel`` (/proc/sys/kernel/osrelease) with the IOMMU
  on or off as the real one decides (``iommu_on``: AMD on by default, ``amd_iommu=off`` or ``iommu=off`` turn it
  off, ``amd_iommu=on`` is no value and changes nothing; Intel ``intel_iommu=on``/``off``, else on from kernel 6.8,
  Proxmox's CONFIG_INTEL_IOMMU_DEFAULT_ON; never with the firmware's IOMMU off); every driver_override cleared
  ("(null)", as the kernel shows it); then modules load as kmod loads them (fakehost_tools.Boot: softdeps first,
  vfio-pci's install command run by a shell in the fake root, ``ids=`` as vfio-pci's parameter): udev loads each
  device's host driver in the initramfs with ITS modprobe.d copy and blacklist, then again on the root file system
  with /etc/modprobe.d, before systemd-modules-load loads /etc/modules and /etc/modules-load.d (the order that
  would hurt: nothing but the configuration keeps a host driver from a passthrough card); IOMMU groups,
  /sys/class/iommu and the kernel log (dmesg, journalctl -k: AMD-Vi or DMAR lines) exist only with the IOMMU on.
  The initramfs copy Proxmox's hook puts on the ESPs is taken to be /boot's.
- ``systemd-run --on-active=5 systemctl reboot`` records the scheduled reboot in fake-reboot-scheduled (a transient
  timer outlives the SSH session, so a kill after it still reboots): ``reboot_if_scheduled()`` does it.
- The kernel side of sysfs is ``tee``: the steps write sysfs through ``timeout --foreground 30 tee <file>``, and the
  stub does what the kernel does with ``driver_override``, ``<driver>/unbind`` and ``drivers_probe``;
  ``modprobe vfio-pci`` loads the module as kmod does with /etc/modprobe.d (its install command, then the unbound
  devices whose driver_override names vfio-pci or whose id ``ids=`` lists; nothing without an IOMMU).
- ``qm`` keeps VMs in fake-vms/<vmid>.conf: ``list``, ``config``, ``set --args``/``--delete``, ``status``,
  ``showcmd`` (from the config), ``start`` (the kvm process's argv, built from the config AT START, in
  /proc/<pid>/cmdline, NUL-separated, pid in /var/run/qemu-server/<vmid>.pid), ``shutdown``/``stop``; ``pct list``
  prints the CT lines of fake-guests; ``id -u`` says root.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import uuid
from pathlib import Path

from tests.components.scripts import fakehost_tools as tools
from tests.components.scripts.fakehost_tools import INITRD, KERNEL, Boot, Kmod, install_kmod
from tests.components.scripts.fakeroot import FakeRoot, Result

GRUB = """# If you change this file, run 'update-grub' afterwards.
GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=soft"
GRUB_CMDLINE_LINUX=""
"""
BOOT = f"BOOT_IMAGE={KERNEL} root=/dev/mapper/pve-root ro"
OLD_KERNEL = "6.5.13-6-pve"
"""Proxmox VE 8.1's kernel: Intel's IOMMU is off without intel_iommu=on (on by default from 6.8)."""
A10 = ("0000:41:00", "10de:2236")
A100 = ("0000:81:00", "10de:20f1")
OWNER = "dev-1a2b3c4d"
"""The scope token host prep runs for unless a test names another (core/names.py StackScope.token)."""
CLAIMS = "etc/proxmox-gpu-cluster/host-prep.d"
"""Host prep's drop-ins, one per owner."""
WINDOW = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=65536"
MUTATING = ("update-grub", "proxmox-boot-tool refresh", "update-initramfs", "systemd-run", "modprobe", "tee", "qm set",
            "qm start", "qm stop", "qm shutdown")  # fmt: skip
"""Calls that change the host; a run on a prepared node with nothing new makes none."""
__all__ = ["INITRD", "KERNEL"]


class FakeHost(FakeRoot):
    """A Proxmox VE node on GRUB with a ``cpu`` ("amd" or "intel") CPU, running ``kernel``, the firmware's IOMMU
    on unless ``firmware_iommu`` is False; an A10 bound to nouveau (behind a root port in its IOMMU group) and an
    A100 whose second function has snd_hda_intel, no guests, booted once from its generated configuration. With
    the defaults (AMD, Proxmox VE 8.2's 6.8 kernel) the IOMMU is on from the first boot."""

    def __init__(self, root: Path, cpu: str = "amd", kernel: str = "6.8.12-4-pve", firmware_iommu: bool = True) -> None:
        super().__init__(root)
        self.cpu, self.kernel, self.firmware_iommu = cpu, kernel, firmware_iommu
        self.firmware = "bios"
        """"bios", "uefi" or "secureboot" (UEFI with Secure Boot on): set by ``proxmox_boot``."""
        self.intel_default_on: bool | None = None
        """CONFIG_INTEL_IOMMU_DEFAULT_ON of the kernel, when not Proxmox's (set from 6.8); None: Proxmox's."""
        install_kmod(self.bin)
        self.bodies: dict[str, str] = {}
        self.stub_script("update-grub", tools._UPDATE_GRUB)
        self.stub_script("proxmox-boot-tool", tools._BOOT_TOOL)
        self.stub_script("update-initramfs", tools._UPDATE_INITRAMFS)
        self.stub_script("systemd-run", 'echo "$*" > "$PGC_ROOT/fake-reboot-scheduled"\n'
                         'echo "Running timer as unit: run-r3c1d.timer" >&2')  # fmt: skip
        self.stub_script("tee", tools._KERNEL)
        self.stub_script("qm", tools._QM)
        self.stub_script("pct", tools._PCT)
        self.stub_script("modprobe", tools._MODPROBE)
        self.stub_script("dmesg", 'cat "$PGC_ROOT/fake-kmsg"')
        self.stub_script("journalctl", 'cat "$PGC_ROOT/fake-kmsg"')
        self.stub_script("id", '[ "$1" = -u ] && echo 0')
        self.write("etc/default/grub", GRUB)
        self.write("etc/modules", "# /etc/modules\nbonding\n")
        self.write("etc/modprobe.d/pve-blacklist.conf", "blacklist nvidiafb\n")
        self.write("boot/grub/grub.cfg", f"\tlinux\t{KERNEL} root=/dev/mapper/pve-root ro quiet iommu=soft\n")
        self.write(INITRD, "### /etc/modprobe.d/pve-blacklist.conf\nblacklist nvidiafb\n")
        self.boots = 0
        self.boot_drivers: dict[str, str] = {}
        """Address -> the driver that claims it at boot unless blacklisted or vfio-pci takes it first."""
        self.groups: dict[str, int] = {}
        self.device("0000:40:01.1", "1022", "1483", driver="pcieport", pci_class="0x060400", group=42)
        self.device("0000:41:00.0", "10de", "2236", driver="nouveau", group=42)
        self.device("0000:81:00.0", "10de", "20f1", group=50)
        self.device("0000:81:00.1", "10de", "1aef", driver="snd_hda_intel", pci_class="0x040300", group=50)
        self.reboot()

    def stub_script(self, name: str, body: str) -> None:
        self.bodies[name] = body
        super().stub_script(name, body)

    def prepend(self, name: str, shell: str) -> None:
        """Run ``shell`` first in the stub ``name``, e.g. a delay or a failure, then what it does."""
        self.stub_script(name, f"{shell}\n{self.bodies[name]}")

    def clone(self, root: Path) -> FakeHost:
        """The same node in another directory (faster than building it again: the harness needs hundreds)."""
        shutil.copytree(self.root, root, symlinks=True)
        twin = copy.copy(self)
        twin.root, twin.bin, twin.log = root, root / "_stubs", root / "calls.log"
        twin._fault = None
        return twin

    def device(self, address: str, vendor: str, device: str, driver: str | None = None,
               pci_class: str = "0x030200", group: int = 60) -> None:  # fmt: skip
        """A PCI function; its driver claims it at every boot (unless blacklisted) and now."""
        base = f"sys/bus/pci/devices/{address}"
        self.write(f"{base}/driver_override", "(null)\n")
        self.write(f"{base}/vendor", f"0x{vendor}\n")
        self.write(f"{base}/device", f"0x{device}\n")
        self.write(f"{base}/class", f"{pci_class}\n")
        self.groups[address] = group
        if driver is not None:
            self.boot_drivers[address] = driver
            self.link(f"{base}/driver", f"../../../bus/pci/drivers/{driver}")

    def driver_of(self, address: str) -> str | None:
        link = self.root / "sys/bus/pci/devices" / address / "driver"
        return Path(os.readlink(link)).name if link.is_symlink() else None

    def vm(self, vmid: int, name: str, args: str | None = None, running: bool = False) -> None:
        """A VM's config (``args`` as ``qm set --args`` would store it), started now if ``running``."""
        self.write(f"fake-vms/{vmid}.name", f"{name}\n")
        self.write(f"fake-vms/{vmid}.conf", "boot: order=scsi0\n" + (f"args: {args}\n" if args else ""))
        if running:
            self.run_quietly("qm", "start", str(vmid))

    def guests(self, *lines: str) -> None:
        """The node's guests, replacing any: ``"VM 3101 gpu-a100-a running"`` or ``"CT 200 dns running"``."""
        for old in self.vms():
            self.run_quietly("qm", "stop", str(old))
        shutil.rmtree(self.root / "fake-vms", ignore_errors=True)
        self.write("fake-guests", "".join(f"{line}\n" for line in lines))
        for kind, vmid, name, status in (line.split() for line in lines):
            if kind == "VM":
                self.vm(int(vmid), name, running=status == "running")

    def vms(self) -> list[int]:
        return sorted(int(p.stem) for p in (self.root / "fake-vms").glob("*.conf"))

    def running_args(self, vmid: int) -> str | None:
        """The argv of the VM's kvm process, space-separated; None when it is not running."""
        pidfile = self.root / f"var/run/qemu-server/{vmid}.pid"
        if not pidfile.exists():
            return None
        cmdline = self.root / "proc" / pidfile.read_text().strip() / "cmdline"
        return cmdline.read_text().rstrip("\0").replace("\0", " ") if cmdline.exists() else None

    def run_quietly(self, name: str, *args: str) -> str:
        """Run a stub as the harness (not as a step): no call logged, no fault counted; its stdout."""
        log = self.log.read_text() if self.log.exists() else None
        fault, self._fault = getattr(self, "_fault", None), None
        out = self._call([str(self.bin / name), *args]).stdout
        self._fault = fault
        if log is None:
            self.log.unlink(missing_ok=True)
        else:
            self.log.write_text(log)
        return out

    def prep(self, *gpus: tuple[str, str], policy: str = "when-idle", vendor: str | None = None, acs: str = "0",
             boot_loader: str = "auto", pt: bool = False, owner: str = OWNER) -> Result:  # fmt: skip
        """host_prep.sh as ``render/host_scripts.prep_args`` calls it (``vendor``: the node's CPU by default), for
        ``owner`` (a stack's or cluster's scope token; one stack by default)."""
        args = ["--owner", owner, "--cpu-vendor", vendor or self.cpu, "--boot-loader", boot_loader]
        args += ["--acs-override", acs]
        args += ["--reboot-policy", policy, *(["--iommu-pt", "1"] if pt else [])]
        for slot, vendor_device in gpus:
            args += ["--gpu", f"{slot}={vendor_device}"]
        return self.run("host_prep.sh", *args)

    def release(self, owner: str = OWNER) -> Result:
        """host_prep.sh --release, as the prep step's delete runs it when its cluster's host prep is destroyed."""
        return self.run("host_prep.sh", "--owner", owner, "--release")

    def verify(self, *slots: str, pt: bool = False, nested: bool = False) -> Result:
        args = ["--kernel-arg", "iommu=pt"] if pt else []
        for slot in slots:
            args += ["--gpu", slot]
        return self.run("host_verify.sh", *args, *(["--nested", "1"] if nested else []))

    def proxmox_boot(self, firmware: str, uuid: str = "1234-ABCD") -> None:
        """Make this a ZFS-root node as the Proxmox VE installer sets it up (pve-installer Proxmox/Install.pm;
        pve-docs system-booting.adoc, "Host Bootloader"): /etc/kernel/cmdline, the ESP listed in
        /etc/kernel/proxmox-boot-uuids, initialised as ``proxmox-boot-tool init`` does for the ``firmware``:
        "bios" (GRUB i386-pc with its files on the ESP: a grub directory), "secureboot" (UEFI, Secure Boot on:
        ``init <partition> grub``, GRUB's EFI binary in EFI/proxmox and a grub directory) or "uefi" (systemd-boot:
        loader/loader.conf and EFI/proxmox). Then refreshed and booted."""
        self.firmware = firmware
        shutil.rmtree(self.root / "sys/firmware", ignore_errors=True)
        if firmware != "bios":
            var = self.root / "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
            var.parent.mkdir(parents=True)
            var.write_bytes(b"\x06\x00\x00\x00" + (b"\x01" if firmware == "secureboot" else b"\x00"))
        self.write("etc/kernel/cmdline", "root=ZFS=rpool/ROOT/pve-1 boot=zfs\n")
        self.write("etc/kernel/proxmox-boot-uuids", f"{uuid}\n")
        esp = f"fake-esp/{uuid}"
        if firmware == "uefi":
            self.write(f"{esp}/loader/loader.conf", "timeout 3\ndefault proxmox-*\n")
            (self.root / esp / "EFI/proxmox").mkdir(parents=True, exist_ok=True)
        else:
            (self.root / esp / "grub").mkdir(parents=True, exist_ok=True)
            if firmware == "secureboot":
                self.write(f"{esp}/EFI/proxmox/grubx64.efi", "")
                self.write(f"{esp}/EFI/proxmox/shimx64.efi", "")
        self.run_quietly("proxmox-boot-tool", "refresh")
        self.reboot()

    def generated_cmdline(self) -> str:
        """The command line the next boot gets. On a proxmox-boot-tool node the firmware starts the first listed ESP
        that exists: GRUB with its grub.cfg there (UEFI with EFI/proxmox/grubx64.efi, or legacy BIOS), else
        systemd-boot's newest proxmox-* entry; otherwise GRUB from /boot/grub/grub.cfg."""
        uuids = self.root / "etc/kernel/proxmox-boot-uuids"
        listed = uuids.read_text().split() if uuids.exists() else []
        esp = next((self.root / "fake-esp" / u for u in listed if (self.root / "fake-esp" / u).is_dir()), None)
        cfg = self.root / "boot/grub/grub.cfg"
        if esp is not None and (self.firmware == "bios" or (esp / "EFI/proxmox/grubx64.efi").exists()):
            cfg = esp / "grub/grub.cfg"
        elif esp is not None:
            entries = sorted((esp / "loader/entries").glob("proxmox-*.conf"))
            assert entries, f"systemd-boot finds no entry on {esp.name}"
            options = re.search(r"^options\s+(.*)$", entries[-1].read_text(), re.M)
            return "initrd=\\EFI\\proxmox\\6.8.12-4-pve\\initrd.img-6.8.12-4-pve " + (options[1] if options else "")
        assert cfg.exists(), f"GRUB finds no {cfg.relative_to(self.root)}"
        line = re.search(r"^\s*linux\s+(\S+)\s+(.*)$", cfg.read_text(), re.M)
        assert line is not None, "grub.cfg has no linux line"
        return " ".join([f"BOOT_IMAGE={line[1]}", *line[2].split()])

    def reboot_if_scheduled(self) -> bool:
        if not (self.root / "fake-reboot-scheduled").exists():
            return False
        self.reboot()
        return True

    def reboot(self) -> None:
        """Boot what update-grub / proxmox-boot-tool and update-initramfs last generated (see the module doc)."""
        self.boots += 1
        cmdline = self.generated_cmdline()
        self.write("proc/cmdline", cmdline + "\n")
        self.write("proc/sys/kernel/random/boot_id", f"{uuid.uuid5(uuid.NAMESPACE_OID, str(self.boots))}\n")
        for gone in ("run", "var/run", "sys/module", "sys/class/iommu", "sys/kernel/iommu_groups"):
            shutil.rmtree(self.root / gone, ignore_errors=True)
        for proc in (self.root / "proc").glob("[0-9]*"):
            shutil.rmtree(proc)
        (self.root / "fake-reboot-scheduled").unlink(missing_ok=True)
        iommu = self.iommu_on(cmdline)
        self.write("proc/sys/kernel/osrelease", f"{self.kernel}\n")
        drivers = dict(self.boot_drivers)
        for dev in sorted((self.root / "sys/bus/pci/devices").iterdir()):
            (dev / "driver_override").write_text("(null)\n")
            (dev / "iommu_group").unlink(missing_ok=True)
            if (dev / "driver").is_symlink():
                (dev / "driver").unlink()
            if iommu:
                group = self.groups[dev.name]
                self.link(f"sys/bus/pci/devices/{dev.name}/iommu_group", f"../../../../kernel/iommu_groups/{group}")
                self.link(
                    f"sys/kernel/iommu_groups/{group}/devices/{dev.name}", f"../../../../bus/pci/devices/{dev.name}"
                )
        boot = Boot(self.root, drivers, iommu)
        boot.coldplug(Kmod([self.root / INITRD]))  # the initramfs: its own copy of modprobe.d
        rootfs = Kmod(sorted((self.root / "etc/modprobe.d").glob("*.conf")))
        boot.coldplug(rootfs)
        for f in [self.root / "etc/modules", *sorted((self.root / "etc/modules-load.d").glob("*.conf"))]:
            for module in re.findall(r"^([^#\s]\S*)$", f.read_text() if f.exists() else "", re.M):
                boot.load(module, rootfs)
        for module in boot.loaded:
            (self.root / "sys/module" / module).mkdir(parents=True, exist_ok=True)
        log = f"[    0.000000] Linux version {self.kernel}\n"
        if iommu and self.cpu == "amd":
            self.write("sys/class/iommu/ivhd0/uevent", "")
            log += "[    0.9] AMD-Vi: Interrupt remapping enabled\n[    1.0] AMD-Vi: Found IOMMU cap 0x40\n"
        elif iommu:
            self.write("sys/class/iommu/dmar0/uevent", "")
            log += "[    0.1] DMAR: IOMMU enabled\n[    0.2] DMAR-IR: Enabled IRQ remapping in x2apic mode\n"
        self.write("fake-kmsg", log)

    def iommu_on(self, cmdline: str) -> bool:
        """Whether a kernel booted with ``cmdline`` runs with the IOMMU on (kernel-parameters.txt: amd_iommu=,
        intel_iommu=, iommu=; drivers/iommu/intel/iommu.c: dmar_disabled = !CONFIG_INTEL_IOMMU_DEFAULT_ON, set in
        Proxmox's kernels from 6.8); the last of an argument counts."""
        if not self.firmware_iommu:
            return False
        args = {k: v.split(",") for k, _, v in (a.partition("=") for a in cmdline.split())}
        if "off" in args.get("iommu", []):
            return False
        if self.cpu == "amd":
            return "off" not in args.get("amd_iommu", [])
        if "on" in args.get("intel_iommu", []) or "off" in args.get("intel_iommu", []):
            return "on" in args["intel_iommu"]
        major, minor = (int(x) for x in re.findall(r"\d+", self.kernel)[:2])
        return (major, minor) >= (6, 8) if self.intel_default_on is None else self.intel_default_on

    def state(self) -> dict[str, object]:
        """Files (the lock's holder line aside) and running state: loaded modules, drivers, VMs' kvm argv, boots."""
        files = {k: v for k, v in self.snapshot().items() if not k.startswith("run/lock/")}
        modules = sorted(p.name for p in (self.root / "sys/module").glob("*"))
        drivers = {d.name: self.driver_of(d.name) for d in sorted((self.root / "sys/bus/pci/devices").iterdir())}
        vms = {vmid: self.running_args(vmid) for vmid in self.vms()}
        return {"files": files, "modules": modules, "drivers": drivers, "vms": vms, "boots": self.boots}


def mutating(calls: list[str]) -> list[str]:
    """The calls that changed something."""
    return [c for c in calls if c.startswith(MUTATING)]
