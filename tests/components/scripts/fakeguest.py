"""A fake Ubuntu guest for the guest bootstrap scripts: a FakeRoot whose stubs keep state like the real tools
(their sh bodies are in ``fakeguest_tools.py``). Where convergence depends on a tool, the fake does what the real one
does:

- Packages: apt-get/dpkg-query/apt-mark/apt-cache share a database under ``var/lib/fake-dpkg`` (one file per
  package holding its version) and an archive under ``var/lib/fake-archive``. ``apt-get install`` unpacks every
  package first (dpkg status ``iU``, in ``var/lib/fake-dpkg-status``) and then configures them (postinst: DKMS
  builds ``lib/modules/<kernel>/updates/dkms/nvidia.ko`` holding the driver's version for every kernel with headers).
  A run killed between the two (``kill_apt_after_unpack()``) leaves packages ``iU`` and no module; apt-get then
  refuses every install with "E: dpkg was interrupted, you must manually run 'dpkg --configure -a'" (exit 100)
  until ``dpkg --configure -a`` configures them; ``dpkg --audit`` lists them (exit 1). ``fake-dkms-fail``: the
  DKMS build fails in postinst ("Error! Bad return status for module build", package left ``iF``). A held package
  changes only with --allow-change-held-packages, and a lower version only with --allow-downgrades, as in apt 2.6
  ("E: Packages were downgraded and -y was used without --allow-downgrades", exit 100). The fake archive's
  packages depend on nothing (``apt-cache show`` prints no Depends): how Ubuntu's NVIDIA packages depend on each
  other, and what apt makes of it, is tested with the real apt (test_real_apt.py). ``fake-apt-lock`` ("<pid> <name> <seconds>"): the dpkg frontend
  lock is held that long; apt-get waits only with ``-o DPkg::Lock::Timeout=N`` (N >= seconds: it gets the lock),
  else fails with apt's "E: Could not get lock ... It is held by process ..." (exit 100). ``fake-offline``:
  ``apt-get update`` prints W: lines and exits 0 as apt does, E: and exit 100 only with ``--error-on=any``; curl
  fails with "(6) Could not resolve host".
- Keyrings: curl prints an armored key; ``fake-curl-truncate`` cuts it (curl exit 18). ``gpg --dearmor -o F``
  writes as it decodes, so a cut armor leaves a partial F (exit 2); ``gpg --show-keys F`` lists a complete keyring
  and fails with "gpg: no valid OpenPGP data found." otherwise.
- Modules: ``sys/module/<name>``; ``modprobe nvidia`` loads the DKMS-built module of the running kernel (its version
  in ``sys/module/nvidia/version``), fails while nouveau holds the GPU; ``modinfo -F version nvidia`` reads the built
  module; nvidia-smi fails without a module and with "Driver/library version mismatch" (exit 18) when the loaded
  module is not the installed utilities' version.
- Boot: ``update-grub`` GENERATES ``boot/grub/grub.cfg`` from /etc/default/grub and /etc/default/grub.d/*.cfg
  (sourced in order); ``update-initramfs -u`` packs the modprobe configuration and /etc/initramfs-tools/modules
  into ``boot/initrd.img-<kernel>``. ``reboot()`` boots what they last generated, not the files on disk: the kernel
  command line of grub.cfg, nouveau unless both the initramfs and the root file system blacklist it. vfio-pci is
  loaded after the switch to the root file system (modules-load.d) with the root file system's options, as on
  Ubuntu when /etc/initramfs-tools/modules does not list it. /run is
  emptied, ``proc/sys/kernel/random/boot_id`` changes, sysctl.d and modules-load.d are applied, services start with
  their configuration files. ``systemd-run`` records the scheduled reboot in ``fake-reboot-scheduled`` (a second one
  fails, "already loaded", as a transient unit does; ``systemctl is-active`` on the timer sees it) and
  ``reboot_scheduled()`` tells a harness to call ``reboot()`` after the step, killed or not.
- containerd: its package's postinst starts it, ``systemctl restart containerd`` restarts it, each time with the
  configuration files as they are then (copied to ``fake-running/containerd``). ``containerd config dump`` merges
  the FILES; ``crictl info`` (from cri-tools, a kubeadm dependency) shows the RUNNING CRI config (runtimes, default
  runtime, runc options) and fails when containerd does not run. Both apply imports as containerd 1.7 does and
  nvidia-ctk writes what 1.18.2 writes (``fakeguest_containerd.py``; contract: ``test_containerd_contract.py``).
- kubeadm: ``join`` runs the preflight checks of its files ("[ERROR FileAvailable--etc-kubernetes-pki-ca.crt]:
  /etc/kubernetes/pki/ca.crt already exists", exit 1), writes pki/ca.crt and bootstrap-kubelet.conf, then after the
  TLS bootstrap kubelet.conf; with ``fake-kubeadm-tls-timeout`` it times out in the TLS bootstrap leaving the first
  two ("timed out waiting for the condition", exit 1). ``reset -f`` removes them. ``upgrade node`` on a worker (no
  control plane here) acts through kubelet.conf, failing without it, and writes /var/lib/kubelet/config.yaml
  (kubernetes v1.34.4 cmd/kubeadm/app/cmd/upgrade/node.go, newNodeData; phases/upgrade/kubeletconfig.go).
- systemctl: ``restart containerd`` starts containerd's running config; other units' restarts change nothing here.
- sysctl --system applies sysctl.d to ``proc/sys`` (net.bridge keys exist once br_netfilter is loaded); swapoff -a
  empties ``proc/swaps``; systemctl enable/is-enabled keep ``fake-systemd-enabled``.
Every stub records its call.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

from tests.components.scripts.fakeguest_tools import DEFAULT_CONTAINERD, KERNEL, STUBS
from tests.components.scripts.fakeroot import FakeRoot, Result

__all__ = ["DEFAULT_CONTAINERD", "KERNEL", "FakeGuest", "mutating"]
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
    "cri-tools": ["1.34.0-1.1"],
}
MUTATING = (
    "apt-get install",
    "apt-get purge",
    "apt-mark hold",
    "apt-mark auto",
    "apt-mark unhold",
    "dpkg --configure",
    "update-initramfs",
    "update-grub",
    "systemd-run",
    "systemctl restart",
    "systemctl enable",
    "kubeadm join",
    "kubeadm reset",
    "swapoff",
    "sysctl",
    "curl",
    "gpg --dearmor",
    "nvidia-ctk cdi",
)
"""Calls that change a host; a re-run on a provisioned guest must make none."""

BOOT_CMDLINE = "BOOT_IMAGE=/vmlinuz-6.8.0-49-generic root=LABEL=cloudimg-rootfs ro console=tty1 console=ttyS0"
A10_SLOT = "0000:00:10.0"
A10_LSPCI = "00:10.0 3D controller [0302]: NVIDIA Corporation GA102GL [A10] [10de:2236] (rev a1)\n"
A10_SMI = "GPU 0: NVIDIA A10 (UUID: GPU-7f1c2a80-0000-0000-0000-000000000001)\n"
_BLACKLIST = re.compile(r"^\s*blacklist\s+nouveau\s*$", re.MULTILINE)
_MODPROBE_DIRS = ("etc/modprobe.d", "lib/modprobe.d", "usr/lib/modprobe.d")


def boot_id(boot: int) -> str:
    """The boot id of the ``boot``-th boot (0: the guest as created), the same in every fake."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, f"fake-guest-boot-{boot}"))


class FakeGuest(FakeRoot):
    """A fresh Ubuntu 24.04 cloud-image guest after cloud-init ran our vendor data (nouveau blacklisted, the
    initramfs regenerated with the blacklist, nouveau unloaded), with one A10 passed through."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        for name, body in STUBS.items():
            self.stub_script(name, body)
        self.write("etc/os-release", 'NAME="Ubuntu"\nID=ubuntu\nVERSION_ID="24.04"\n')
        self.write("fake-kernel", KERNEL + "\n")
        # The cloud image's kernel: the flavour metapackage and the kernel it depends on.
        self.write("var/lib/fake-dpkg/linux-image-virtual", "6.8.0.49.50")
        self.write(f"var/lib/fake-dpkg/linux-image-{KERNEL}", "6.8.0-49.50")
        self.write("etc/modprobe.d/blacklist-nouveau.conf", "blacklist nouveau\noptions nouveau modeset=0\n")
        self.write("etc/default/grub", 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n')
        self.write(
            "etc/default/grub.d/50-cloudimg-settings.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT="console=tty1 console=ttyS0"\n'
        )
        self.write("etc/fstab", "LABEL=cloudimg-rootfs / ext4 discard,errors=remount-ro 0 1\n")
        self.write("proc/swaps", "Filename Type Size Used Priority\n")
        self.write("proc/sys/net/ipv4/ip_forward", "0\n")
        self.write("proc/sys/kernel/random/boot_id", boot_id(0) + "\n")
        self.write("fake-lspci", A10_LSPCI)
        self.write("proc/cmdline", BOOT_CMDLINE + "\n")
        self.write(f"sys/bus/pci/devices/{A10_SLOT}/vendor", "0x10de\n")
        self.write(f"sys/bus/pci/devices/{A10_SLOT}/device", "0x2236\n")
        self.write("dev/kvm", "")  # cpu host on a node with nested virtualization
        self.write("fake-gpus", A10_SMI)
        for package, versions in ARCHIVE.items():
            self.write(f"var/lib/fake-archive/{package}", "\n".join(versions) + "\n")
        # What the image and cloud-init generated: grub.cfg and the initramfs (with the nouveau blacklist).
        self.run_stdin("update-grub 2>/dev/null; update-initramfs -u 2>/dev/null\n")
        self.log.unlink()

    @classmethod
    def copy(cls, source: FakeGuest, root: Path) -> FakeGuest:
        """A second guest in exactly ``source``'s state (files, running state, call log) under ``root``, sharing
        ``source``'s stubs (they keep no state of their own)."""
        shutil.copytree(
            source.root, root, symlinks=True, ignore=lambda d, names: ["_stubs"] if d == str(source.root) else []
        )
        guest = cls.__new__(cls)
        guest.root, guest.bin, guest.log, guest.outputs = root, source.bin, root / "calls.log", {}
        return guest

    def installed(self, package: str) -> str | None:
        path = self.root / "var/lib/fake-dpkg" / package
        return path.read_text() if path.exists() else None

    def holds(self) -> list[str]:
        path = self.root / "var/lib/fake-holds"
        return path.read_text().split() if path.exists() else []

    def step(self, step: str, *args: str, secrets: dict[str, str] | None = None) -> Result:
        """Run a bootstrap step as the remote command does: the installed agent bundle, secrets on stdin."""
        return self.run_bundle(step, *args, secrets=secrets)

    def reboot_scheduled(self) -> bool:
        """Whether a step scheduled a reboot (systemd-run) that has not happened yet."""
        return (self.root / "fake-reboot-scheduled").exists()

    def kill_apt_after_unpack(self) -> None:
        """The next ``apt-get install`` is killed (its process group) after unpacking, before configuring."""
        self.write("fake-apt-kill-after-unpack", "")

    def reboot(self) -> None:
        """What the (scheduled) reboot does: the kernel boots grub.cfg's command line (IOMMU groups appear with
        *_iommu=on); the initramfs and then udev load nouveau unless both blacklist it; systemd applies sysctl.d and
        loads modules-load.d (vfio-pci binds its ids); udev loads the built nvidia module for unbound NVIDIA GPUs;
        containerd starts with its files. /run and every loaded module and binding are gone."""
        boots = int(self.read("fake-boots")) + 1 if (self.root / "fake-boots").exists() else 1
        self.write("fake-boots", f"{boots}\n")
        self.write("proc/sys/kernel/random/boot_id", boot_id(boots) + "\n")
        for path in ("sys/module", "sys/kernel/iommu_groups", "run", "fake-running", "proc/sys/net"):
            shutil.rmtree(self.root / path, ignore_errors=True)
        for name in ("fake-reboot-scheduled", "nouveau-busy"):
            (self.root / name).unlink(missing_ok=True)
        for device in (self.root / "sys/bus/pci/devices").iterdir():
            if (device / "driver").is_symlink():
                (device / "driver").unlink()
        kernel = self.read("fake-kernel").strip()
        linux = re.search(r"^\s*linux\s+\S+\s+(.*)$", self.read("boot/grub/grub.cfg"), re.MULTILINE)
        cmdline = " ".join([f"BOOT_IMAGE=/vmlinuz-{kernel}", *(linux.group(1).split() if linux else [])])
        self.write("proc/cmdline", cmdline + "\n")
        self.write("proc/sys/net/ipv4/ip_forward", "0\n")
        if "_iommu=on" in cmdline:
            self.write("sys/kernel/iommu_groups/0/type", "identity\n")
        initrd = self.root / f"boot/initrd.img-{kernel}"
        rootfs = "".join(p.read_text() for d in _MODPROBE_DIRS for p in sorted((self.root / d).glob("*.conf")))
        if not (initrd.exists() and _BLACKLIST.search(initrd.read_text()) and _BLACKLIST.search(rootfs)):
            self.write("sys/module/nouveau/refcnt", "1\n")
        loads = "".join(p.read_text() for p in sorted((self.root / "etc/modules-load.d").glob("*.conf")))
        wanted = [m for m in loads.split() if not m.startswith("#")]
        for module in ("overlay", "br_netfilter"):
            if module in wanted:
                (self.root / "sys/module" / module).mkdir(parents=True, exist_ok=True)
        if "br_netfilter" in wanted:
            for key in ("bridge-nf-call-iptables", "bridge-nf-call-ip6tables"):
                self.write(f"proc/sys/net/bridge/{key}", "1\n")
        for conf in sorted((self.root / "etc/sysctl.d").glob("*.conf")):
            for key, value in re.findall(r"^([a-z0-9._-]+)\s*=\s*(\S+)", conf.read_text(), re.MULTILINE):
                target = self.root / "proc/sys" / key.replace(".", "/")
                if target.parent.is_dir():
                    target.write_text(value + "\n")
        if "vfio_pci" in wanted:
            self.run_stdin("modprobe vfio-pci\n")
        # udev loads the module modprobe finds (fakeguest_tools.py: DKMS's before a precompiled one; none while
        # nouveau holds the GPU), unless vfio-pci has the GPU.
        if self.driver_of() != "vfio-pci":
            self.run_stdin("modprobe nvidia 2>/dev/null || true\n")
        if self.installed("containerd") or self.installed("containerd.io"):
            running = self.root / "fake-running/containerd"
            running.mkdir(parents=True)
            if (self.root / "etc/containerd/config.toml").exists():
                shutil.copy(self.root / "etc/containerd/config.toml", running)
            if (self.root / "etc/containerd/conf.d").is_dir():
                shutil.copytree(self.root / "etc/containerd/conf.d", running / "conf.d")

    def kernel_update(self, kernel: str) -> None:
        """What unattended-upgrades does with a new kernel: the flavour metapackages pull the new image and, when
        the headers metapackage is installed, its headers; DKMS's kernel hook then builds the module for it, and the
        kernel's hooks generate its initramfs and grub.cfg. The new kernel runs after the next ``reboot()``."""
        self.write(f"var/lib/fake-dpkg/linux-image-{kernel}", "new")
        self.write(f"var/lib/fake-archive/linux-headers-{kernel}", "new\n")  # the archive has them either way
        if self.installed("linux-headers-virtual") is not None:
            self.run_stdin(f"apt-get install -y linux-headers-{kernel}\n")
        self.write("fake-kernel", kernel + "\n")
        # The kernel's postinst hooks (/etc/kernel/postinst.d: initramfs-tools, zz-update-grub).
        self.run_stdin("update-initramfs -u 2>/dev/null; update-grub 2>/dev/null\n")

    def driver_of(self, slot: str = A10_SLOT) -> str | None:
        """The driver bound to a PCI function, or None."""
        link = self.root / "sys/bus/pci/devices" / slot / "driver"
        return Path(os.readlink(link)).name if link.is_symlink() else None


def mutating(calls: list[str]) -> list[str]:
    """The calls that changed something."""
    return [c for c in calls if c.startswith(MUTATING)]
