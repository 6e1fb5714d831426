"""A fake Proxmox VE node for the host steps: a FakeRoot whose stubs behave like the parts of the kernel and of
Proxmox the steps touch, with a boot model in which a reboot boots what was last GENERATED, never the files.

- ``update-grub`` (grub-mkconfig) sources /etc/default/grub and then /etc/default/grub.d/*.cfg (so a later file
  overrides a variable) and writes /boot/grub/grub.cfg (as grub.cfg.new, renamed when complete): the default
  entry's ``linux`` line carries GRUB_CMDLINE_LINUX and GRUB_CMDLINE_LINUX_DEFAULT, the recovery entry
  GRUB_CMDLINE_LINUX and ``single``.
- ``proxmox-boot-tool refresh`` copies the first line of /etc/kernel/cmdline into the ``options`` of the loader
  entry on every ESP listed in /etc/kernel/proxmox-boot-uuids (ESPs are not mounted normally: here they are
  fake-esp/<uuid>/); without that list it only says "No /etc/kernel/proxmox-boot-uuids found, skipping ESP sync.".
- ``update-initramfs -u -k all`` packs /etc/modprobe.d/*.conf into /boot/initrd.img-<version> (.new, renamed).
- ``reboot()``: /proc/cmdline is the default GRUB entry's line, or the ESP entry's options when the node boots
  with systemd-boot (/etc/kernel/proxmox-boot-uuids exists); a new boot id (/proc/sys/kernel/random/boot_id);
  /run emptied (a tmpfs); every VM stopped; in the initramfs, devices are claimed first using ITS blacklist and
  ``options vfio-pci ids=`` (vfio-pci only with the IOMMU on: ``<vendor>_iommu=on``); then systemd-modules-load
  loads /etc/modules and /etc/modules-load.d from the root file system, and a vfio-pci loaded there takes the
  still unclaimed devices of /etc/modprobe.d's ids; IOMMU groups, /sys/class/iommu and the kernel log (dmesg,
  journalctl -k: AMD-Vi or DMAR lines) exist only with the IOMMU on. The initramfs copy Proxmox's hook puts on the
  ESPs is taken to be /boot's.
- ``systemd-run --on-active=5 systemctl reboot`` records the scheduled reboot in fake-reboot-scheduled (a transient
  timer outlives the SSH session, so a kill after it still reboots): ``reboot_if_scheduled()`` does it.
- The kernel side of sysfs is ``tee``: the steps write sysfs through ``timeout --foreground 30 tee <file>``, and the
  stub does what the kernel does with ``driver_override``, ``<driver>/unbind`` and ``drivers_probe``;
  ``modprobe vfio-pci`` loads the module, which takes the unclaimed devices of /etc/modprobe.d's ids.
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

from tests.components.scripts.fakeroot import FakeRoot, Result

GRUB = """# If you change this file, run 'update-grub' afterwards.
GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=soft"
GRUB_CMDLINE_LINUX=""
"""
KERNEL = "/boot/vmlinuz-6.8.12-4-pve"
BOOT = f"BOOT_IMAGE={KERNEL} root=/dev/mapper/pve-root ro"
INITRD = "boot/initrd.img-6.8.12-4-pve"
A10 = ("0000:41:00", "10de:2236")
A100 = ("0000:81:00", "10de:20f1")
WINDOW = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=65536"
MUTATING = ("update-grub", "proxmox-boot-tool", "update-initramfs", "systemd-run", "modprobe", "tee", "qm set",
            "qm start", "qm stop", "qm shutdown")  # fmt: skip
"""Calls that change the host; a run on a prepared node with nothing new makes none."""

_UPDATE_GRUB = f"""cfg="$PGC_ROOT/boot/grub/grub.cfg"
echo "Generating grub configuration file ..." >&2
line=$(. "$PGC_ROOT/etc/default/grub" && for f in "$PGC_ROOT"/etc/default/grub.d/*.cfg; do
  if [ -e "$f" ]; then . "$f"; fi; done; printf '%s|%s' "${{GRUB_CMDLINE_LINUX:-}}" "${{GRUB_CMDLINE_LINUX_DEFAULT:-}}") \\
  || {{ echo "/usr/sbin/grub-mkconfig: /etc/default/grub: syntax error" >&2; exit 1; }}
mkdir -p "${{cfg%/*}}"
printf 'menuentry "Proxmox VE GNU/Linux" {{\\n\\tlinux\\t{KERNEL} root=/dev/mapper/pve-root ro %s %s\\n}}\\n' \\
  "${{line%%|*}}" "${{line#*|}}" > "$cfg.new"
printf 'menuentry "Proxmox VE GNU/Linux (recovery mode)" {{\\n\\tlinux\\t{KERNEL} root=/dev/mapper/pve-root ro single %s\\n}}\\n' \\
  "${{line%%|*}}" >> "$cfg.new"
mv "$cfg.new" "$cfg"
echo done >&2"""
_BOOT_TOOL = """[ "$1" = refresh ] || { echo "unknown command '$1'" >&2; exit 1; }
uuids="$PGC_ROOT/etc/kernel/proxmox-boot-uuids"
[ -f "$uuids" ] || { echo "No /etc/kernel/proxmox-boot-uuids found, skipping ESP sync."; exit 0; }
options=$(head -n 1 "$PGC_ROOT/etc/kernel/cmdline") || exit 1
for id in $(cat "$uuids"); do
  echo "Copying and configuring kernels on /dev/disk/by-uuid/$id"
  entry="$PGC_ROOT/fake-esp/$id/loader/entries/proxmox-6.8.12-4-pve.conf"; mkdir -p "${entry%/*}"
  printf 'title Proxmox Virtual Environment\\noptions %s\\n' "$options" > "$entry.new" && mv "$entry.new" "$entry"
done"""
_UPDATE_INITRAMFS = f"""img="$PGC_ROOT/{INITRD}"
echo "update-initramfs: Generating /{INITRD}" >&2
for f in "$PGC_ROOT"/etc/modprobe.d/*.conf; do [ -e "$f" ] && {{ echo "### /etc/modprobe.d/${{f##*/}}"; cat "$f"; }}; done \\
  > "$img.new"
mv "$img.new" "$img\""""
# vfio-pci, once loaded, takes the unclaimed devices whose vendor:device /etc/modprobe.d lists (IOMMU on only).
_VFIO_TAKES = """ids=$(sed -n 's/^options vfio-pci ids=//p' "$PGC_ROOT"/etc/modprobe.d/*.conf 2>/dev/null | tr , ' ')
grep -q "_iommu=on" "$PGC_ROOT/proc/cmdline" || exit 0
for dev in "$PGC_ROOT"/sys/bus/pci/devices/*; do
  [ -L "$dev/driver" ] && continue
  id="$(sed 's/^0x//' "$dev/vendor"):$(sed 's/^0x//' "$dev/device")"
  for want in $ids; do [ "$want" = "$id" ] && ln -s ../../../bus/pci/drivers/vfio-pci "$dev/driver"; done
done
exit 0"""
_MODPROBE = f"""mkdir -p "$PGC_ROOT/sys/module/$(echo "$1" | tr - _)"
[ "$1" = vfio-pci ] || exit 0
{_VFIO_TAKES}"""
# What the kernel does with sysfs writes (Documentation/ABI/testing/sysfs-bus-pci).
_KERNEL = """target="$1"; value="$(cat)"
dev="$PGC_ROOT/sys/bus/pci/devices/$value"
case "$target" in
*/driver_override) printf '%s\\n' "$value" > "$target" ;;
*/unbind)
  [ -e "$PGC_ROOT/busy-$value" ] && { echo "Device or resource busy" >&2; exit 1; }
  rm -f "$dev/driver" ;;
*/drivers_probe)
  [ -L "$dev/driver" ] && exit 0
  if [ "$(cat "$dev/driver_override" 2>/dev/null)" = vfio-pci ] && [ -d "$PGC_ROOT/sys/module/vfio_pci" ] \\
     && grep -q "_iommu=on" "$PGC_ROOT/proc/cmdline"; then
    ln -s ../../../bus/pci/drivers/vfio-pci "$dev/driver"
  fi ;;
*) /usr/bin/tee "$@" ;;
esac"""
_QM = """vms="$PGC_ROOT/fake-vms" run="$PGC_ROOT/var/run/qemu-server" vmid="${2:-}"
[ -e "$PGC_ROOT/fake-qm-broken" ] && { echo "ipcc_send_rec[1] failed: Connection refused" >&2; exit 2; }
pid_of() { p=$(cat "$run/$1.pid" 2>/dev/null) && [ -d "$PGC_ROOT/proc/$p" ] && echo "$p"; }
showcmd() {
  printf '/usr/bin/kvm -id %s -name %s,debug-threads=on -machine type=q35+pve0' "$1" "$(cat "$vms/$1.name")"
  a=$(sed -n 's/^args: //p' "$vms/$1.conf"); [ -z "$a" ] || printf ' %s' "$a"; echo
}
if [ "$1" = list ]; then
  echo "      VMID NAME                 STATUS     MEM(MB)    BOOTDISK(GB) PID"
  for c in "$vms"/*.conf; do
    [ -e "$c" ] || continue; id=$(basename "$c" .conf)
    if p=$(pid_of "$id"); then s=running; else s=stopped; p=0; fi
    printf '%10s %-20s %-10s %-10s %-12s %s\\n' "$id" "$(cat "$vms/$id.name")" "$s" 4096 32.00 "$p"
  done
  exit 0
fi
[ "$1" = guest ] && vmid="$3"  # qm guest cmd <vmid> <command>
conf="$vms/$vmid.conf"
[ -f "$conf" ] || { echo "Configuration file 'nodes/pve1/qemu-server/$vmid.conf' does not exist" >&2; exit 2; }
case "$1" in
config) cat "$conf" ;;
showcmd) showcmd "$vmid" ;;
status) if pid_of "$vmid" > /dev/null; then echo "status: running"; else echo "status: stopped"; fi ;;
set)
  grep -v '^args:' "$conf" > "$conf.new" || true
  [ "$3" = --args ] && echo "args: $4" >> "$conf.new"
  mv "$conf.new" "$conf" ;;
start)
  pid_of "$vmid" > /dev/null && { echo "VM $vmid already running" >&2; exit 255; }
  n=$(( $(cat "$PGC_ROOT/fake-pid-counter" 2>/dev/null || echo 1000) + 1 )); echo "$n" > "$PGC_ROOT/fake-pid-counter"
  mkdir -p "$PGC_ROOT/proc/$n" "$run"; set -f; printf '%s\\0' $(showcmd "$vmid") > "$PGC_ROOT/proc/$n/cmdline"; set +f
  echo "$n" > "$run/$vmid.pid" ;;
shutdown|stop) if p=$(pid_of "$vmid"); then rm -rf "$PGC_ROOT/proc/$p"; fi; rm -f "$run/$vmid.pid" ;;
guest) cat "$PGC_ROOT/agent.json" 2>/dev/null || { echo "QEMU guest agent is not running" >&2; exit 2; } ;;
*) echo "unknown command 'qm $1'" >&2; exit 255 ;;
esac"""
_PCT = """echo "VMID       Status     Lock         Name"
[ -f "$PGC_ROOT/fake-guests" ] && awk '$1 == "CT" { printf "%-10s %-10s %-12s %s\\n", $2, $4, "", $3 }' \\
  "$PGC_ROOT/fake-guests"
exit 0"""


class FakeHost(FakeRoot):
    """A Proxmox VE 8 node on GRUB, IOMMU off, an A10 bound to nouveau (behind a root port in its IOMMU group) and
    an A100 whose second function has snd_hda_intel, no guests, booted once from its generated configuration."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.bodies: dict[str, str] = {}
        self.stub_script("update-grub", _UPDATE_GRUB)
        self.stub_script("proxmox-boot-tool", _BOOT_TOOL)
        self.stub_script("update-initramfs", _UPDATE_INITRAMFS)
        self.stub_script("systemd-run", 'echo "$*" > "$PGC_ROOT/fake-reboot-scheduled"\n'
                         'echo "Running timer as unit: run-r3c1d.timer" >&2')  # fmt: skip
        self.stub_script("tee", _KERNEL)
        self.stub_script("qm", _QM)
        self.stub_script("pct", _PCT)
        self.stub_script("modprobe", _MODPROBE)
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

    def prep(self, *gpus: tuple[str, str], policy: str = "when-idle", vendor: str = "amd", acs: str = "0",
             boot_loader: str = "auto") -> Result:  # fmt: skip
        args = ["--cpu-vendor", vendor, "--boot-loader", boot_loader, "--acs-override", acs, "--reboot-policy", policy]
        for slot, vendor_device in gpus:
            args += ["--gpu", f"{slot}={vendor_device}"]
        return self.run("host_prep.sh", *args)

    def verify(self, *slots: str, vendor: str = "amd", nested: bool = False) -> Result:
        args = ["--kernel-arg", f"{vendor}_iommu=on", "--kernel-arg", "iommu=pt"]
        for slot in slots:
            args += ["--gpu", slot]
        return self.run("host_verify.sh", *args, *(["--nested", "1"] if nested else []))

    def generated_cmdline(self) -> str:
        """The command line the next boot gets: the ESP entry on a systemd-boot node, else GRUB's default entry."""
        if (self.root / "etc/kernel/proxmox-boot-uuids").exists():
            entries = sorted((self.root / "fake-esp").glob("*/loader/entries/*.conf"))
            options = re.search(r"^options (.*)$", entries[0].read_text(), re.M) if entries else None
            return "initrd=\\EFI\\proxmox\\6.8.12-4-pve\\initrd.img-6.8.12-4-pve " + (options[1] if options else "")
        line = re.search(r"^\s*linux\s+(\S+)\s+(.*)$", self.read("boot/grub/grub.cfg"), re.M)
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
        iommu = re.search(r"\b(amd|intel)_iommu=on\b", cmdline)
        initrd, files = self.read(INITRD), "".join(f.read_text() for f in (self.root / "etc/modprobe.d").glob("*.conf"))
        early_ids, late_ids = _ids(initrd), _ids(files)
        blacklisted = set(re.findall(r"^blacklist (\S+)$", initrd, re.M))
        loaded = {
            m.replace("-", "_")
            for f in [self.root / "etc/modules", *(self.root / "etc/modules-load.d").glob("*.conf")]
            if f.exists()
            for m in re.findall(r"^([^#\s]\S*)$", f.read_text(), re.M)
        }
        for dev in sorted((self.root / "sys/bus/pci/devices").iterdir()):
            (dev / "driver_override").unlink(missing_ok=True)
            if (dev / "driver").is_symlink():
                (dev / "driver").unlink()
            ids = f"{(dev / 'vendor').read_text().strip()[2:]}:{(dev / 'device').read_text().strip()[2:]}"
            driver = None
            if iommu and ids in early_ids:
                driver = "vfio-pci"  # in the initramfs, before any GPU driver (softdep)
            elif self.boot_drivers.get(dev.name) not in (None, *blacklisted):
                driver = self.boot_drivers[dev.name]
            elif iommu and "vfio_pci" in loaded and ids in late_ids:
                driver = "vfio-pci"  # systemd-modules-load, from the root file system
            if driver is not None:
                loaded.add(driver.replace("-", "_"))
                self.link(f"sys/bus/pci/devices/{dev.name}/driver", f"../../../bus/pci/drivers/{driver}")
            if iommu:
                group = self.groups[dev.name]
                self.link(f"sys/bus/pci/devices/{dev.name}/iommu_group", f"../../../../kernel/iommu_groups/{group}")
                self.link(
                    f"sys/kernel/iommu_groups/{group}/devices/{dev.name}", f"../../../../bus/pci/devices/{dev.name}"
                )
        for module in loaded:
            (self.root / "sys/module" / module).mkdir(parents=True, exist_ok=True)
        log = "[    0.000000] Linux version 6.8.12-4-pve\n"
        if iommu and iommu[1] == "amd":
            self.write("sys/class/iommu/ivhd0/uevent", "")
            log += "[    0.9] AMD-Vi: Interrupt remapping enabled\n[    1.0] AMD-Vi: Found IOMMU cap 0x40\n"
        elif iommu:
            self.write("sys/class/iommu/dmar0/uevent", "")
            log += "[    0.1] DMAR: IOMMU enabled\n[    0.2] DMAR-IR: Enabled IRQ remapping in x2apic mode\n"
        self.write("fake-kmsg", log)

    def state(self) -> dict[str, object]:
        """Files (the lock's holder line aside) and running state: loaded modules, drivers, VMs' kvm argv, boots."""
        files = {k: v for k, v in self.snapshot().items() if not k.startswith("run/lock/")}
        modules = sorted(p.name for p in (self.root / "sys/module").glob("*"))
        drivers = {d.name: self.driver_of(d.name) for d in sorted((self.root / "sys/bus/pci/devices").iterdir())}
        vms = {vmid: self.running_args(vmid) for vmid in self.vms()}
        return {"files": files, "modules": modules, "drivers": drivers, "vms": vms, "boots": self.boots}


def _ids(modprobe_conf: str) -> set[str]:
    found = re.findall(r"^options vfio-pci ids=(\S+)$", modprobe_conf, re.M)
    return set(found[-1].split(",")) if found else set()


def mutating(calls: list[str]) -> list[str]:
    """The calls that changed something."""
    return [c for c in calls if c.startswith(MUTATING)]
