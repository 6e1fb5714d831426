"""A fake Proxmox VE node for host_prep.sh: a FakeRoot whose stubs behave like the parts of the kernel and of
Proxmox the script touches.

The kernel side is ``tee``: host_prep.sh writes sysfs through ``timeout 30 tee <file>``, and the stub does what
the kernel does with those writes (``driver_override``, ``<driver>/unbind``, ``drivers_probe``). ``qm list`` and
``pct list`` print the guests in ``fake-guests``; ``reboot()`` is what the scheduled reboot would do.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from tests.components.scripts.fakeroot import FakeRoot, Result

GRUB = """# If you change this file, run 'update-grub' afterwards.
GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=soft"
GRUB_CMDLINE_LINUX=""
"""
BOOT = "BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro"
A10 = ("0000:41:00", "10de:2236")
A100 = ("0000:81:00", "10de:20f1")
MUTATING = ("update-grub", "proxmox-boot-tool", "update-initramfs", "systemd-run", "modprobe", "tee")
"""Calls that change the host; a run on a prepared node with nothing new makes none."""

# What the kernel does with the sysfs writes host_prep.sh makes (Documentation/ABI/testing/sysfs-bus-pci).
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
*) exec /usr/bin/tee "$@" ;;
esac"""
_GUESTS = """f="$PGC_ROOT/fake-guests"; [ -e "$PGC_ROOT/fake-qm-broken" ] && { echo "ipcc_send_rec failed" >&2; exit 2; }
if [ "$(basename "$0")" = qm ]; then
  echo "      VMID NAME                 STATUS     MEM(MB)    BOOTDISK(GB) PID"
  [ -f "$f" ] && awk '$1 == "VM" { printf "%10s %-20s %-10s 4096 32.00 1234\\n", $2, $3, $4 }' "$f"
else
  echo "VMID       Status     Lock         Name"
  [ -f "$f" ] && awk '$1 == "CT" { printf "%-10s %-10s %-12s %s\\n", $2, $4, "", $3 }' "$f"
fi
exit 0"""


class FakeHost(FakeRoot):
    """A Proxmox VE 8 node on GRUB, IOMMU off, an A10 bound to nouveau and an A100 whose second function has
    snd_hda_intel, no guests running."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        for name in ("update-grub", "proxmox-boot-tool", "update-initramfs", "systemd-run"):
            self.stub(name)
        self.stub_script("tee", _KERNEL)
        self.stub_script("qm", _GUESTS)
        self.stub_script("pct", _GUESTS)
        self.stub_script("modprobe", 'mkdir -p "$PGC_ROOT/sys/module/$(echo "$1" | tr - _)"')
        self.write("etc/default/grub", GRUB)
        self.write("etc/modules", "# /etc/modules\nbonding\n")
        self.write("etc/modprobe.d/pve-blacklist.conf", "blacklist nvidiafb\n")
        self.write("proc/cmdline", f"{BOOT} quiet iommu=soft\n")
        self.boot_drivers: dict[str, str] = {}
        """Address -> the driver that claims it at boot unless blacklisted or vfio-pci takes it first."""
        self.device("0000:41:00.0", "10de", "2236", driver="nouveau")
        self.device("0000:81:00.0", "10de", "20f1")
        self.device("0000:81:00.1", "10de", "1aef", driver="snd_hda_intel")

    def device(self, address: str, vendor: str, device: str, driver: str | None = None) -> None:
        self.write(f"sys/bus/pci/devices/{address}/vendor", f"0x{vendor}\n")
        self.write(f"sys/bus/pci/devices/{address}/device", f"0x{device}\n")
        if driver is not None:
            self.boot_drivers[address] = driver
            self.link(f"sys/bus/pci/devices/{address}/driver", f"../../../bus/pci/drivers/{driver}")

    def driver_of(self, address: str) -> str | None:
        link = self.root / "sys/bus/pci/devices" / address / "driver"
        return Path(os.readlink(link)).name if link.is_symlink() else None

    def guests(self, *lines: str) -> None:
        """Running guests, e.g. ``"VM 3101 gpu-a100-a running"`` or ``"CT 200 dns running"``."""
        self.write("fake-guests", "".join(f"{line}\n" for line in lines))

    def prep(self, *gpus: tuple[str, str], policy: str = "when-idle", vendor: str = "amd", acs: str = "0") -> Result:
        args = ["--cpu-vendor", vendor, "--boot-loader", "auto", "--acs-override", acs, "--reboot-policy", policy]
        for slot, vendor_device in gpus:
            args += ["--gpu", f"{slot}={vendor_device}"]
        return self.run("host_prep.sh", *args)

    def reboot(self) -> None:
        """The node boots with the configured kernel arguments; vfio-pci (loaded from modules-load.d) takes the
        ids of ``options vfio-pci ids=`` when the IOMMU is on; the blacklisted drivers stay out."""
        line = re.search(r'^GRUB_CMDLINE_LINUX_DEFAULT="(.*)"$', self.read("etc/default/grub"), re.M)
        assert line is not None
        cmdline = f"{BOOT} {line.group(1)}"
        self.write("proc/cmdline", cmdline + "\n")
        shutil.rmtree(self.root / "sys/module", ignore_errors=True)
        shutil.rmtree(self.root / "run", ignore_errors=True)  # a tmpfs
        blacklisted = {
            m
            for f in (self.root / "etc/modprobe.d").glob("*.conf")
            for m in re.findall(r"^blacklist (\S+)$", f.read_text(), re.M)
        }
        if (self.root / "etc/modules-load.d/vfio.conf").exists():
            (self.root / "sys/module/vfio_pci").mkdir(parents=True)
        conf = self.root / "etc/modprobe.d/vfio.conf"
        found = re.findall(r"^options vfio-pci ids=(\S+)$", conf.read_text(), re.M) if conf.exists() else []
        ids = set(found[0].split(",")) if found else set()
        for dev in (self.root / "sys/bus/pci/devices").iterdir():
            (dev / "driver_override").unlink(missing_ok=True)
            vendor_device = f"{(dev / 'vendor').read_text().strip()[2:]}:{(dev / 'device').read_text().strip()[2:]}"
            driver = "vfio-pci" if vendor_device in ids and "_iommu=on" in cmdline else None
            if driver is None and self.boot_drivers.get(dev.name) not in (None, *blacklisted):
                driver = self.boot_drivers[dev.name]
            if (dev / "driver").is_symlink():
                (dev / "driver").unlink()
            if driver is not None:
                self.link(f"sys/bus/pci/devices/{dev.name}/driver", f"../../../bus/pci/drivers/{driver}")


def mutating(calls: list[str]) -> list[str]:
    """The calls that changed something."""
    return [c for c in calls if c.startswith(MUTATING)]
