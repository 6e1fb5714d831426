"""A fake Ubuntu guest for the guest bootstrap scripts: a FakeRoot whose stubs keep state like the real tools.

apt-get/dpkg-query/apt-mark/apt-cache share a package database under ``var/lib/fake-dpkg`` (one file per
installed package holding its version) and an archive of available versions under ``var/lib/fake-archive``.
modprobe loads modules by creating ``sys/module/<name>`` (nvidia only when a driver package is installed, with
its upstream version); ``reboot()`` is what the scheduled reboot would do. Every stub records its call.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from proxmox_gpu_cluster.render.guest_scripts import secret_stdin, step_script
from tests.components.scripts.fakeroot import FakeRoot, Result

KERNEL = "6.8.0-49-generic"
DEFAULT_CONTAINERD = """version = 2
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.8"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"
          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            SystemdCgroup = false"""
ARCHIVE = {
    "nvidia-headless-580-server-open": ["580.105.08-0ubuntu0.24.04.1", "580.95.05-0ubuntu0.24.04.2"],
    "nvidia-headless-580-server": ["580.105.08-0ubuntu0.24.04.1", "580.95.05-0ubuntu0.24.04.2"],
    "nvidia-utils-580-server": ["580.105.08-0ubuntu0.24.04.1", "580.95.05-0ubuntu0.24.04.2"],
    f"linux-headers-{KERNEL}": [f"{KERNEL.removesuffix('-generic')}.50"],
    "linux-headers-virtual": ["6.8.0.49.50"],
    "containerd": ["1.7.28-0ubuntu1~24.04.1"],
    "nvidia-container-toolkit": ["1.18.2-1", "1.18.1-1"],
    "nvidia-container-toolkit-base": ["1.18.2-1", "1.18.1-1"],
    "libnvidia-container-tools": ["1.18.2-1", "1.18.1-1"],
    "libnvidia-container1": ["1.18.2-1", "1.18.1-1"],
    "kubelet": ["1.34.2-1.1"],
    "kubeadm": ["1.34.2-1.1"],
    "kubectl": ["1.34.2-1.1"],
}
MUTATING = (
    "apt-get install",
    "apt-get purge",
    "apt-mark hold",
    "apt-mark unhold",
    "update-initramfs",
    "update-grub",
    "systemd-run",
    "systemctl restart",
    "systemctl enable",
    "kubeadm join",
    "swapoff",
    "sysctl",
    "curl",
    "nvidia-ctk cdi",
)
"""Calls that change a host; a re-run on a provisioned guest must make none."""

_DPKG = "$PGC_ROOT/var/lib/fake-dpkg"
# What loading vfio-pci does: with the IOMMU on (a kernel booted with *_iommu=on), it binds every unbound device
# whose id its `options vfio-pci ids=` list names; without an IOMMU group the probe fails and they stay unbound.
_BIND_VFIO = """bind_vfio() {
  grep -q "_iommu=on" "$PGC_ROOT/proc/cmdline" || return 0
  ids="$(sed -n 's/^options vfio-pci ids=//p' "$PGC_ROOT"/etc/modprobe.d/*.conf 2>/dev/null | tr , ' ')"
  for dev in "$PGC_ROOT"/sys/bus/pci/devices/*; do
    [ -L "$dev/driver" ] && continue
    id="$(sed 's/^0x//' "$dev/vendor"):$(sed 's/^0x//' "$dev/device")"
    for want in $ids; do
      [ "$id" = "$want" ] && ln -s ../../../bus/pci/drivers/vfio-pci "$dev/driver"
    done
  done
  return 0
}
"""
# What DKMS does after a package install (its kernel postinst hook and the nvidia-dkms postinst): build the module
# for every kernel whose headers are installed, when the driver's module source is.
_DKMS = f"""dkms_autoinstall() {{
  ls "{_DPKG}"/nvidia-headless-* >/dev/null 2>&1 || return 0
  for h in "{_DPKG}"/linux-headers-[0-9]*; do
    [ -f "$h" ] || continue
    k="${{h##*/linux-headers-}}"; mkdir -p "$PGC_ROOT/lib/modules/$k/updates/dkms"
    : > "$PGC_ROOT/lib/modules/$k/updates/dkms/nvidia.ko"
  done
}}
"""
_STUBS = {
    # One package: "ii  <version>"; a pattern (linux-image-*): "ii  <package>" per installed match.
    "dpkg-query": f'p="$3"; case "$p" in *"*"*) for f in "{_DPKG}"/$p; do [ -f "$f" ] && printf "ii  %s\\n" '
    f'"$(basename "$f")"; done; exit 0 ;; esac\n[ -f "{_DPKG}/$p" ] || exit 1; printf "ii  %s\\n" "$(cat "{_DPKG}/$p")"',
    "apt-cache": 'f="$PGC_ROOT/var/lib/fake-archive/$2"; [ -f "$f" ] || exit 0\n'
    'while read -r v; do printf " %s | %s | http://archive.ubuntu.com/ubuntu noble/restricted\\n" "$2" "$v"; '
    'done < "$f"',
    "apt-get": _DKMS
    + f"""cmd=""; skip=0
for a in "$@"; do
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  case "$a" in
    -o) skip=1 ;;
    -*) ;;
    update|install|purge) cmd="$a" ;;
    *) p="${{a%%=*}}"; v="${{a#*=}}"
       a_file="$PGC_ROOT/var/lib/fake-archive/$p"
       if [ "$cmd" = install ]; then
         [ -f "$a_file" ] || {{ echo "E: Unable to locate package $p" >&2; exit 100; }}
         [ "$v" = "$a" ] && v="$(head -n 1 "$a_file")"
         mkdir -p "{_DPKG}"; printf "%s" "$v" > "{_DPKG}/$p"
       elif [ "$cmd" = purge ]; then rm -f "{_DPKG}/$p"; fi ;;
  esac
done
[ "$cmd" = install ] && dkms_autoinstall; exit 0""",
    "apt-mark": 'h="$PGC_ROOT/var/lib/fake-holds"; touch "$h"; c="$1"; shift\n'
    'case "$c" in showhold) cat "$h" ;; hold) for p in "$@"; do echo "$p" >> "$h"; done ;;\n'
    'unhold) for p in "$@"; do grep -vxF "$p" "$h" > "$h.new" || true; mv "$h.new" "$h"; done ;; esac',
    "curl": 'echo "-----BEGIN PGP PUBLIC KEY BLOCK-----"',
    "gpg": 'while [ $# -gt 0 ]; do if [ "$1" = -o ]; then out="$2"; fi; shift; done; cat > "$out"',
    "uname": 'cat "$PGC_ROOT/fake-kernel"',
    "modprobe": _BIND_VFIO
    + f"""if [ "$1" = -r ]; then
  [ -f "$PGC_ROOT/nouveau-busy" ] && exit 1; rm -rf "$PGC_ROOT/sys/module/$2"; exit 0
fi
if [ "$1" = nvidia ]; then
  v=""; for f in "{_DPKG}"/nvidia-headless-*; do [ -f "$f" ] && v="$(cut -d- -f1 < "$f")"; done
  [ -n "$v" ] || exit 1
  [ -f "$PGC_ROOT/lib/modules/$(cat "$PGC_ROOT/fake-kernel")/updates/dkms/nvidia.ko" ] || {{
    echo "modprobe: FATAL: Module nvidia not found in directory /lib/modules/$(cat "$PGC_ROOT/fake-kernel")" >&2
    exit 1; }}
  mkdir -p "$PGC_ROOT/sys/module/nvidia"; printf "%s\\n" "$v" > "$PGC_ROOT/sys/module/nvidia/version"; exit 0
fi
if [ "$1" = vfio-pci ]; then
  mkdir -p "$PGC_ROOT/sys/module/vfio_pci"; bind_vfio; exit 0
fi
mkdir -p "$PGC_ROOT/sys/module/$1\"""",
    "update-grub": "true",
    "containerd": f"""if [ "$2" = default ]; then cat <<'EOF'
{DEFAULT_CONTAINERD}
EOF
else cat "$PGC_ROOT/etc/containerd/config.toml" "$PGC_ROOT"/etc/containerd/conf.d/*.toml 2>/dev/null; fi""",
    "nvidia-ctk": """if [ "$1" = cdi ]; then out="${3#--output=}"; echo "cdiVersion: 0.5.0" > "$out"; exit 0; fi
c="$PGC_ROOT/etc/containerd/config.toml"
grep -q '^imports' "$c" || { printf 'imports = ["/etc/containerd/conf.d/*.toml"]\\n' | cat - "$c" > "$c.n"; mv "$c.n" "$c"; }
mkdir -p "$PGC_ROOT/etc/containerd/conf.d"
{ echo '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]'
  echo '  runtime_type = "io.containerd.runc.v2"'
  [ "$4" = --set-as-default ] && echo '[plugins."io.containerd.grpc.v1.cri".containerd]' && \
    echo '  default_runtime_name = "nvidia"'
} > "$PGC_ROOT/etc/containerd/conf.d/99-nvidia.toml\"""",
    "nvidia-smi": """[ -f "$PGC_ROOT/sys/module/nvidia/version" ] || { echo "NVIDIA-SMI has failed" ; exit 9; }
if [ "$1" = -L ]; then cat "$PGC_ROOT/fake-gpus"; else cat "$PGC_ROOT/sys/module/nvidia/version"; fi""",
    "lspci": 'cat "$PGC_ROOT/fake-lspci"',
    "kubeadm": 'if [ "$1" = reset ]; then rm -rf "$PGC_ROOT/etc/kubernetes"; echo "[reset] done"; exit 0; fi\n'
    'cfg="$3"; stat -c %a "$cfg" > "$PGC_ROOT/join-config-mode"; cp "$cfg" "$PGC_ROOT/join-config"\n'
    'printf "%s\\n" "$cfg" > "$PGC_ROOT/join-config-path"\n'
    'mkdir -p "$PGC_ROOT/etc/kubernetes"; echo "kind: Config" > "$PGC_ROOT/etc/kubernetes/kubelet.conf"\n'
    'echo "This node has joined the cluster"',
    "cloud-init": 'echo "status: done"',
}

BOOT_CMDLINE = "BOOT_IMAGE=/vmlinuz-6.8.0-49-generic root=LABEL=cloudimg-rootfs ro console=tty1 console=ttyS0"
A10_SLOT = "0000:00:10.0"
A10_LSPCI = "00:10.0 3D controller [0302]: NVIDIA Corporation GA102GL [A10] [10de:2236] (rev a1)\n"
A10_SMI = "GPU 0: NVIDIA A10 (UUID: GPU-7f1c2a80-0000-0000-0000-000000000001)\n"


class FakeGuest(FakeRoot):
    """A fresh Ubuntu 24.04 cloud-image guest after cloud-init ran our vendor data (nouveau blacklisted and
    unloaded), with one A10 passed through."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        for name, body in _STUBS.items():
            self.stub_script(name, body)
        for name in ("update-initramfs", "systemd-run", "systemctl", "sysctl", "swapoff"):
            self.stub(name)
        self.write("etc/os-release", 'NAME="Ubuntu"\nID=ubuntu\nVERSION_ID="24.04"\n')
        self.write("fake-kernel", KERNEL + "\n")
        # The cloud image's kernel: the flavour metapackage and the kernel it depends on.
        self.write("var/lib/fake-dpkg/linux-image-virtual", "6.8.0.49.50")
        self.write(f"var/lib/fake-dpkg/linux-image-{KERNEL}", "6.8.0-49.50")
        self.write("etc/modprobe.d/blacklist-nouveau.conf", "blacklist nouveau\noptions nouveau modeset=0\n")
        self.write("etc/fstab", "LABEL=cloudimg-rootfs / ext4 discard,errors=remount-ro 0 1\n")
        self.write("proc/swaps", "Filename Type Size Used Priority\n")
        self.write("fake-lspci", A10_LSPCI)
        self.write("proc/cmdline", BOOT_CMDLINE + "\n")
        self.write(f"sys/bus/pci/devices/{A10_SLOT}/vendor", "0x10de\n")
        self.write(f"sys/bus/pci/devices/{A10_SLOT}/device", "0x2236\n")
        self.write("dev/kvm", "")  # cpu host on a node with nested virtualization
        self.write("fake-gpus", A10_SMI)
        for package, versions in ARCHIVE.items():
            self.write(f"var/lib/fake-archive/{package}", "\n".join(versions) + "\n")

    def installed(self, package: str) -> str | None:
        path = self.root / "var/lib/fake-dpkg" / package
        return path.read_text() if path.exists() else None

    def holds(self) -> list[str]:
        path = self.root / "var/lib/fake-holds"
        return path.read_text().split() if path.exists() else []

    def step(self, step: str, *args: str, secrets: dict[str, str] | None = None) -> Result:
        """Run a bootstrap step as the remote command does (helpers + step on stdin)."""
        text = secret_stdin(step, secrets) if secrets is not None else step_script(step)
        return self.run_stdin(text, *args)

    def reboot(self) -> None:
        """What the scheduled reboot does: the kernel boots with the GRUB drop-in's arguments (IOMMU groups
        appear with *_iommu=on), nouveau stays out (blacklisted), modules-load.d loads vfio-pci (which binds its
        ids), udev loads the installed nvidia module."""
        shutil.rmtree(self.root / "sys/module", ignore_errors=True)
        shutil.rmtree(self.root / "sys/kernel/iommu_groups", ignore_errors=True)
        for device in (self.root / "sys/bus/pci/devices").iterdir():
            if (device / "driver").is_symlink():
                (device / "driver").unlink()
        (self.root / "nouveau-busy").unlink(missing_ok=True)
        dropin = self.root / "etc/default/grub.d/90-proxmox-gpu-cluster.cfg"
        extra = (
            re.findall(r'GRUB_CMDLINE_LINUX_DEFAULT="\$\{GRUB_CMDLINE_LINUX_DEFAULT:-\} ([^"]*)"', dropin.read_text())
            if dropin.exists()
            else []
        )
        cmdline = " ".join([BOOT_CMDLINE, *extra])
        self.write("proc/cmdline", cmdline + "\n")
        if "_iommu=on" in cmdline:
            self.write("sys/kernel/iommu_groups/0/type", "identity\n")
        if list((self.root / "etc/modules-load.d").glob("*vfio*")):
            self.run_stdin("modprobe vfio-pci\n")
        drivers = sorted((self.root / "var/lib/fake-dpkg").glob("nvidia-headless-*"))
        kernel = self.read("fake-kernel").strip()
        if drivers and (self.root / f"lib/modules/{kernel}/updates/dkms/nvidia.ko").exists():
            self.write("sys/module/nvidia/version", drivers[-1].read_text().split("-")[0] + "\n")

    def kernel_update(self, kernel: str) -> None:
        """What unattended-upgrades does with a new kernel: the flavour metapackages pull the new image and, when
        the headers metapackage is installed, its headers; DKMS's kernel hook then builds the module for it. The
        new kernel runs after the next ``reboot()``."""
        self.write(f"var/lib/fake-dpkg/linux-image-{kernel}", "new")
        self.write(f"var/lib/fake-archive/linux-headers-{kernel}", "new\n")  # the archive has them either way
        if self.installed("linux-headers-virtual") is not None:
            self.run_stdin(f"apt-get install -y linux-headers-{kernel}\n")
        self.write("fake-kernel", kernel + "\n")

    def driver_of(self, slot: str = A10_SLOT) -> str | None:
        """The driver bound to a PCI function, or None."""
        link = self.root / "sys/bus/pci/devices" / slot / "driver"
        return Path(os.readlink(link)).name if link.is_symlink() else None


def mutating(calls: list[str]) -> list[str]:
    """The calls that changed something."""
    return [c for c in calls if c.startswith(MUTATING)]
