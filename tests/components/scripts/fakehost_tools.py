"""The stubs' bodies of FakeHost (fakehost.py) and its boot model's kmod: what modprobe, udev and
systemd-modules-load do with a modprobe.d configuration when a boot or a step loads modules."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

KERNEL = "/boot/vmlinuz-6.8.12-4-pve"
INITRD = "boot/initrd.img-6.8.12-4-pve"

# update-grub (grub-mkconfig -o /boot/grub/grub.cfg): /etc/default/grub, then /etc/default/grub.d/*.cfg (grub2-common
# 2.06 grub-mkconfig). On a node whose ESPs proxmox-boot-tool manages, proxmox-kernel-helper's
# /etc/grub.d/000_proxmox_boot_header runs `proxmox-boot-tool refresh` first (unless refresh itself called it:
# PVE_EFIBOOT_UNSHARED), as /boot/grub/grub.cfg is not what those ESPs boot. Refresh runs it with the ESP bind-mounted
# on /boot: here FAKE_BOOT names the ESP's directory, where the kernel is /vmlinuz-<version>.
_UPDATE_GRUB = f"""boot="$PGC_ROOT${{FAKE_BOOT:-/boot}}" kernel={KERNEL}; [ -z "${{FAKE_BOOT:-}}" ] || kernel=/${{kernel##*/}}
if [ -e "$PGC_ROOT/etc/kernel/proxmox-boot-uuids" ] && [ -z "${{PVE_EFIBOOT_UNSHARED:-}}" ]; then
  echo "W: This system is booted via proxmox-boot-tool:" >&2
  echo "W: Running update-grub does not update the correct config!" >&2
  echo "W: Running: 'proxmox-boot-tool refresh'." >&2
  proxmox-boot-tool refresh || exit 1
fi
cfg="$boot/grub/grub.cfg"
echo "Generating grub configuration file ..." >&2
line=$(. "$PGC_ROOT/etc/default/grub" && for f in "$PGC_ROOT"/etc/default/grub.d/*.cfg; do
  if [ -e "$f" ]; then . "$f"; fi; done; printf '%s|%s' "${{GRUB_CMDLINE_LINUX:-}}" "${{GRUB_CMDLINE_LINUX_DEFAULT:-}}") \\
  || {{ echo "/usr/sbin/grub-mkconfig: /etc/default/grub: syntax error" >&2; exit 1; }}
mkdir -p "${{cfg%/*}}"
printf 'menuentry "Proxmox VE GNU/Linux" {{\\n\\tlinux\\t%s root=/dev/mapper/pve-root ro %s %s\\n}}\\n' \\
  "$kernel" "${{line%%|*}}" "${{line#*|}}" > "$cfg.new"
printf 'menuentry "Proxmox VE GNU/Linux (recovery mode)" {{\\n\\tlinux\\t%s root=/dev/mapper/pve-root ro single %s\\n}}\\n' \\
  "$kernel" "${{line%%|*}}" >> "$cfg.new"
mv "$cfg.new" "$cfg"
echo done >&2"""
# proxmox-boot-tool as proxmox-kernel-helper's bin/proxmox-boot-tool and proxmox-boot/zz-proxmox-boot do it (see
# fakehost.py and test_proxmox_boot_model.py). ESP <uuid> is fake-esp/<uuid>/ (it exists: /dev/disk/by-uuid/<uuid>).
_BOOT_TOOL = f"""uuids="$PGC_ROOT/etc/kernel/proxmox-boot-uuids" efi="$PGC_ROOT/sys/firmware/efi" kver={KERNEL.split("vmlinuz-")[1]}
esps() {{ while IFS= read -r id; do
  [ -n "$id" ] || continue
  [ -d "$PGC_ROOT/fake-esp/$id" ] && echo "$id" \\
    || echo "WARN: /dev/disk/by-uuid/$id does not exist - clean '/etc/kernel/proxmox-boot-uuids'! - skipping" >&2
done < "$uuids"; }}
case "$1" in
status)
  [ -e "$uuids" ] || {{ [ "${{2:-}}" = --quiet ] || echo "E: /etc/kernel/proxmox-boot-uuids does not exist." >&2; exit 2; }}
  [ "${{2:-}}" = --quiet ] && exit 0
  echo "Re-executing '/usr/sbin/proxmox-boot-tool' in new private mount namespace.."
  if [ -d "$efi" ]; then echo "System currently booted with uefi"; else echo "System currently booted with legacy bios"; fi
  for id in $(esps); do
    esp="$PGC_ROOT/fake-esp/$id" result=""
    [ -f "$esp/loader/loader.conf" ] && result="uefi (versions: $(ls -1 "$esp/EFI/proxmox" | grep -v '\\.efi$' | paste -sd, - | sed 's/,/, /g'))"
    if [ -d "$esp/grub" ]; then
      grub="grub (versions: $(cd "$esp" && ls -1 vmlinuz-* 2>/dev/null | sed 's/^vmlinuz-//' | paste -sd, - | sed 's/,/, /g'))"
      result="${{result:+$result, }}$grub"
    fi
    echo "$id is configured with: $result"
  done ;;
refresh)
  echo "Running hook script 'proxmox-auto-removal'.."
  echo "Running hook script 'zz-proxmox-boot'.."
  echo "Re-executing '/etc/kernel/postinst.d/zz-proxmox-boot' in new private mount namespace.."
  [ -f "$uuids" ] || {{ echo "No /etc/kernel/proxmox-boot-uuids found, skipping ESP sync." >&2; exit 0; }}
  if [ -f "$PGC_ROOT/etc/kernel/cmdline" ]; then
    cmdline=$(head -n 1 "$PGC_ROOT/etc/kernel/cmdline")
    case " $cmdline " in *" root="*) ;; *) echo "No root= parameter in /etc/kernel/cmdline found!" >&2; exit 1 ;; esac
  else
    echo "No /etc/kernel/cmdline found - falling back to /proc/cmdline" >&2
    cmdline=$(sed 's/initrd=[^ ]* *//g' "$PGC_ROOT/proc/cmdline")
  fi
  for id in $(esps); do
    esp="$PGC_ROOT/fake-esp/$id" grub=""
    [ -e "$esp/EFI/proxmox/grubx64.efi" ] && grub=1
    if [ -d "$efi" ] && [ -z "$grub" ]; then
      [ -f "$esp/loader/loader.conf" ] || {{ echo "/dev/disk/by-uuid/$id contains no loader.conf - skipping" >&2; continue; }}
      [ -d "$esp/EFI/proxmox" ] || {{ echo "/dev/disk/by-uuid/$id/EFI/proxmox does not exist- skipping" >&2; continue; }}
    elif [ ! -d "$esp/grub" ]; then
      echo "/dev/disk/by-uuid/$id contains no grub directory - skipping" >&2; continue
    fi
    echo "Copying and configuring kernels on /dev/disk/by-uuid/$id" >&2
    if [ -n "$grub" ] || [ ! -d "$efi" ]; then
      echo "	Copying kernel $kver" >&2
      : > "$esp/vmlinuz-$kver"
      PVE_EFIBOOT_UNSHARED=1 FAKE_BOOT="/fake-esp/$id" update-grub || exit 1
    else
      echo "	Copying kernel and creating boot-entry for $kver" >&2
      mkdir -p "$esp/EFI/proxmox/$kver" "$esp/loader/entries"; entry="$esp/loader/entries/proxmox-$kver.conf"
      printf 'title    Proxmox Virtual Environment\\nversion  %s\\noptions  %s\\n' "$kver" "$cmdline" > "$entry.new"
      mv "$entry.new" "$entry"
    fi
  done ;;
*) echo "unknown command '$1'" >&2; exit 1 ;;
esac"""
_UPDATE_INITRAMFS = f"""img="$PGC_ROOT/{INITRD}"
echo "update-initramfs: Generating /{INITRD}" >&2
for f in "$PGC_ROOT"/etc/modprobe.d/*.conf; do [ -e "$f" ] && {{ echo "### /etc/modprobe.d/${{f##*/}}"; cat "$f"; }}; done \\
  > "$img.new"
mv "$img.new" "$img\""""
# modprobe vfio-pci as kmod does it with /etc/modprobe.d: vfio-pci's install command if there is one (it writes the
# driver_override files and inserts vfio-pci itself), else the insertion; once inserted vfio-pci takes the unbound
# devices whose driver_override says vfio-pci, or (no override) whose vendor:device ``options vfio-pci ids=`` lists;
# its probe fails without an IOMMU (no group), so then they stay unbound.
_VFIO_TAKES = """inserted=$(sh "$PGC_ROOT/_stubs/_kmod/kmod-install" "$PGC_ROOT"/etc/modprobe.d/*.conf)
[ "$inserted" = insert ] || exit 0
mkdir -p "$PGC_ROOT/sys/module/vfio_pci"
ids=$(sed -n 's/^options vfio-pci ids=//p' "$PGC_ROOT"/etc/modprobe.d/*.conf 2>/dev/null | tr , ' ')
[ -n "$(ls -A "$PGC_ROOT/sys/kernel/iommu_groups" 2>/dev/null)" ] || exit 0
for dev in "$PGC_ROOT"/sys/bus/pci/devices/*; do
  [ -L "$dev/driver" ] && continue
  override=$(cat "$dev/driver_override" 2>/dev/null); [ "$override" = "(null)" ] && override=""
  id="$(sed 's/^0x//' "$dev/vendor"):$(sed 's/^0x//' "$dev/device")"
  take=""; [ "$override" = vfio-pci ] && take=1
  [ -z "$override" ] && for want in $ids; do [ "$want" = "$id" ] && take=1; done
  [ -n "$take" ] && ln -s ../../../bus/pci/drivers/vfio-pci "$dev/driver"
done
exit 0"""
_MODPROBE = f"""[ -d "$PGC_ROOT/sys/module/$(echo "$1" | tr - _)" ] && exit 0  # loaded: modprobe does nothing
[ "$1" = vfio-pci ] || {{ mkdir -p "$PGC_ROOT/sys/module/$(echo "$1" | tr - _)"; exit 0; }}
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
     && [ -n "$(ls -A "$PGC_ROOT/sys/kernel/iommu_groups" 2>/dev/null)" ]; then
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


# kmod-install <modprobe.d files...>: what modprobe does to load vfio-pci under that configuration (man
# modprobe.d: "install modulename command...": the command runs instead of the insertion, with $CMDLINE_OPTS
# replaced; libkmod uses the first install command found). Here the command runs in the fake root (its /sys is
# $PGC_ROOT/sys) and its "modprobe --ignore-install vfio-pci" prints "insert"; without a command, "insert" too.
KMOD_INSTALL = r"""cmd=$(sed -n 's/^install vfio-pci //p' "$@" 2>/dev/null | head -n 1)
[ -n "$cmd" ] || { echo insert; exit 0; }
cmd=$(printf '%s\n' "$cmd" | sed -e "s#/sys/#$PGC_ROOT/sys/#g" -e 's#\$CMDLINE_OPTS##g')
PATH="${0%/*}/bin:$PATH" sh -c "$cmd" 2>/dev/null || true"""
KMOD_MODPROBE = r"""[ "$1 $2" = "--ignore-install vfio-pci" ] && echo insert; exit 0"""


def install_kmod(bin_dir: Path) -> None:
    """The helpers FakeHost's boot and its modprobe stub share (not stubs: no call is logged or counted)."""
    (bin_dir / "_kmod/bin").mkdir(parents=True, exist_ok=True)
    (bin_dir / "_kmod/kmod-install").write_text(KMOD_INSTALL + "\n")
    (bin_dir / "_kmod/bin/modprobe").write_text("#!/bin/sh\n" + KMOD_MODPROBE + "\n")
    (bin_dir / "_kmod/bin/modprobe").chmod(0o755)


def _module(name: str) -> str:
    return name.replace("-", "_")


@dataclass
class Kmod:
    """One modprobe.d configuration (the initramfs's copy or the root file system's, files in name order)."""

    files: list[Path]
    blacklist: set[str] = field(default_factory=set)
    softdeps: dict[str, list[str]] = field(default_factory=dict)
    ids: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        text = "".join(f.read_text() for f in self.files if f.exists())
        self.blacklist = {_module(m) for m in re.findall(r"^blacklist (\S+)", text, re.M)}
        for name, pre in re.findall(r"^softdep (\S+) pre: ([^\n]*?)(?: post:.*)?$", text, re.M):
            self.softdeps.setdefault(_module(name), [_module(m) for m in pre.split()])  # the first one counts
        found = re.findall(r"^options vfio[-_]pci ids=(\S+)", text, re.M)
        self.ids = set(found[-1].split(",")) if found else set()


@dataclass
class Boot:
    """Module loading in one boot: every load runs its softdeps' pre modules first, vfio-pci's install command
    (kmod-install), then the driver probes the unbound devices it matches: vfio-pci those whose driver_override
    names it or (none) whose id ``ids=`` lists, when the IOMMU is on; a host driver its own devices unless their
    driver_override names another driver (drivers/pci/pci-driver.c)."""

    root: Path
    drivers: dict[str, str]
    """Address -> the host driver that claims it (its modalias)."""
    iommu: bool
    loaded: set[str] = field(default_factory=set)

    def device(self, address: str) -> Path:
        return self.root / "sys/bus/pci/devices" / address

    def load(self, module: str, kmod: Kmod) -> None:
        module = _module(module)
        if module in self.loaded:
            return
        for pre in kmod.softdeps.get(module, []):
            self.load(pre, kmod)
        if module == "vfio_pci":
            env = {"PGC_ROOT": str(self.root), "PATH": "/usr/bin:/bin"}
            script = self.root / "_stubs/_kmod/kmod-install"
            args = ["sh", str(script), *map(str, kmod.files)]
            out = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
            if out.stdout.strip() != "insert":
                return  # the install command never inserted it
        self.loaded.add(module)
        for address in sorted(self.drivers.keys() | {d.name for d in (self.root / "sys/bus/pci/devices").iterdir()}):
            dev = self.device(address)
            if (dev / "driver").is_symlink():
                continue
            override = (dev / "driver_override").read_text().strip() if (dev / "driver_override").exists() else ""
            override = "" if override == "(null)" else override
            if module == "vfio_pci":
                ids = f"{(dev / 'vendor').read_text().strip()[2:]}:{(dev / 'device').read_text().strip()[2:]}"
                takes = self.iommu and (override == "vfio-pci" or (not override and ids in kmod.ids))
                driver = "vfio-pci"
            else:
                driver = self.drivers.get(address, "")
                takes = _module(driver) == module and override in ("", driver)
            if takes:
                (dev / "driver").symlink_to(f"../../../bus/pci/drivers/{driver}")

    def coldplug(self, kmod: Kmod) -> None:
        """udev: each unbound device's driver by its modalias, unless that configuration blacklists it."""
        for address, driver in sorted(self.drivers.items()):
            if not (self.device(address) / "driver").is_symlink() and _module(driver) not in kmod.blacklist:
                self.load(driver, kmod)
