"""Host prep against the real initramfs generator (issue 34, section 2): Debian's initramfs-tools builds the
initramfs from the module list and modprobe.d files host prep wrote, for a real kernel's modules (Debian's
linux-image-amd64: a Proxmox kernel is not available here, and vfio, vfio_iommu_type1 and vfio_pci are modules in
both). update-initramfs runs for real in a private mount namespace where the fake node's /etc/initramfs-tools (the
machine's, with MODULES=list: only the listed modules and their dependencies, initramfs.conf(5)), /etc/modprobe.d,
and /boot are bind-mounted over the machine's. lsinitramfs then shows what the node would
boot with: the vfio modules, loaded from conf/modules, and host prep's modprobe.d (the address-bound install
command and the softdeps that put vfio-pci before every host GPU driver)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.components.scripts.fakehost import A10, FakeHost, mutating
from tests.support import external

pytestmark = pytest.mark.slow  # a real initramfs and host prep: several seconds

REAL_UPDATE_INITRAMFS = """unshare --mount --propagation private sh -c '
for d in etc/initramfs-tools etc/modprobe.d boot; do
  mount --bind "$PGC_ROOT/$d" "/$d" || exit 1
done
PATH=/usr/sbin:/usr/bin:/sbin:/bin /usr/sbin/update-initramfs "$@"' update-initramfs "$@\""""


def kernel() -> str:
    """A kernel whose modules are installed here (with vfio-pci as a module)."""
    external(Path("/usr/sbin/update-initramfs"), "update-initramfs", "install it with: apt-get install initramfs-tools")
    found = sorted(Path("/lib/modules").glob("*/kernel/drivers/vfio/pci/vfio-pci.ko*"))
    if not found:
        external(Path("/lib/modules/<version>/kernel/drivers/vfio/pci/vfio-pci.ko"), "a kernel's modules",
                 "install them with: apt-get install linux-image-amd64")  # fmt: skip
    r = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        external(Path("/nonexistent/unshare-mount"), "a private mount namespace (unshare --mount, as root)", r.stderr)
    return found[-1].relative_to("/lib/modules").parts[0]


@pytest.fixture
def host(tmp_path: Path) -> tuple[FakeHost, str]:
    version = kernel()
    h = FakeHost(tmp_path / "root")
    shutil.copytree("/etc/initramfs-tools", h.root / "etc/initramfs-tools", dirs_exist_ok=True)
    conf = h.root / "etc/initramfs-tools/initramfs.conf"
    conf.write_text(conf.read_text().replace("\nMODULES=most", "\nMODULES=list"))
    # -u -k all: every kernel in /boot (linux-version list) that has an initramfs already; mkinitramfs reads the
    # kernel's config for the compressions it can unpack.
    for name in (f"vmlinuz-{version}", f"config-{version}"):
        shutil.copy(f"/boot/{name}", h.root / "boot" / name)
    h.write(f"boot/initrd.img-{version}", "")
    h.stub_script("update-initramfs", REAL_UPDATE_INITRAMFS)
    return h, version


def lsinitramfs(image: Path) -> list[str]:
    r = subprocess.run(["lsinitramfs", str(image)], capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


def test_the_real_initramfs_holds_and_loads_the_vfio_modules(host: tuple[FakeHost, str]) -> None:
    h, version = host
    assert "MODULES=list" in h.read("etc/initramfs-tools/initramfs.conf")
    r = h.prep(A10)
    assert r.returncode == 0, r.stderr
    assert f"update-initramfs: Generating /boot/initrd.img-{version}" in r.stderr  # the real tool's words
    assert "changed: /etc/initramfs-tools/modules" in r.stdout
    files = lsinitramfs(h.root / f"boot/initrd.img-{version}")
    for module in ("vfio/vfio.ko", "vfio/vfio_iommu_type1.ko", "vfio/pci/vfio-pci.ko"):
        assert any(f"/kernel/drivers/{module}" in f for f in files), (module, [f for f in files if "vfio" in f])
    assert not any("/drivers/gpu/drm/nouveau/" in f for f in files)  # MODULES=list: nothing else unlisted
    assert "etc/modprobe.d/vfio.conf" in files
    unpacked = h.root.parent / "unpacked"
    subprocess.run(["unmkinitramfs", str(h.root / f"boot/initrd.img-{version}"), str(unpacked)], check=True)
    root = next(p.parent.parent for p in unpacked.rglob("conf/modules"))
    assert (root / "conf/modules").read_text().split()[-3:] == ["vfio", "vfio_iommu_type1", "vfio_pci"]
    assert (root / "etc/modprobe.d/vfio.conf").read_text() == h.read("etc/modprobe.d/vfio.conf")
    # Host prep's record of what the initramfs was built from agrees: a further run rebuilds nothing.
    r = h.prep(A10)
    assert r.returncode == 0 and mutating(r.calls) == [], r.stderr


def test_the_nodes_own_module_lines_stay(host: tuple[FakeHost, str]) -> None:
    h, version = host
    own = h.read("etc/initramfs-tools/modules") + "dm_crypt\n"
    h.write("etc/initramfs-tools/modules", own)
    assert h.prep(A10).returncode == 0
    assert h.read("etc/initramfs-tools/modules").startswith(own)
    files = lsinitramfs(h.root / f"boot/initrd.img-{version}")
    assert any(f.endswith("/dm-crypt.ko") or "/dm-crypt.ko" in f for f in files)
