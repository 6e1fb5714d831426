"""A package archive built by the tests with the real tools (dpkg-deb, apt-ftparchive) in the shape of Ubuntu's NVIDIA
archive on noble, for the real apt and dpkg to run against (realapt.py).

The shape, and where it comes from:
- The driver packages of one source build (``nvidia-graphics-drivers-<branch>[-server]``, one version for all) and
  their dependencies: canonical/nvidia-graphics-drivers ``debian/templates/control.in`` on branch 580-server-noble.
  ``nvidia-headless-B`` depends on ``nvidia-headless-no-dkms-B`` and ``nvidia-dkms-B`` WITHOUT a version;
  ``nvidia-headless-no-dkms-B`` on ``libnvidia-compute-B``, ``nvidia-compute-utils-B``, ``libnvidia-cfg1-B`` and
  ``nvidia-kernel-source-B`` at ``(= ${binary:Version})`` and on ``nvidia-kernel-common-B`` in
  ``(<= U-1), (>= U)`` (U: the upstream version); ``nvidia-dkms-B`` on ``dkms`` and on the kernel source and common
  packages in that range; ``nvidia-utils-B`` and ``libnvidia-compute-B`` on the virtual
  ``nvidia-kernel-common-B-U``, which ``nvidia-kernel-common-B`` provides (it depends on the firmware package
  ``nvidia-firmware-B-U``). The ``-open`` variants swap the kernel source and DKMS packages (and the two headless
  metapackages) for ``-open`` ones; the kernel source packages conflict through the virtual ``nvidia-kernel-source``.
- A retired branch: its packages become transitional ones in section oldlibs that depend, unversioned, on the
  successor's package of the same role (same repository, branch 570-server-noble, commit d27e751b "Release
  transitionals to 580": ``nvidia-headless-570-server-open Depends: nvidia-headless-580-server-open``).
- Precompiled modules (linux-restricted-modules): ``linux-modules-nvidia-B[-server][-open]-<kernel>`` depends on
  the kernel image, ``linux-signatures-nvidia-<kernel>`` and ``nvidia-kernel-common-B`` in ``(<= U-1), (>= U)`` of the
  driver it was built against (the shape apt prints in elementary/settings-system issue #233), and ships the signed
  module under ``/lib/modules/<kernel>/kernel/nvidia-B[srv][-open]/``; the flavour metapackage
  ``linux-modules-nvidia-B[...]-generic`` follows the kernel the flavour metapackages follow (precompiled_flavour).
No package has maintainer scripts (dpkg then needs no chroot into the test's root); DKMS's build is modelled by
realapt.py. Built once per test session (about a second).
"""

from __future__ import annotations

import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

KERNELS = ("6.8.0-49-generic", "6.8.0-51-generic")
"""The kernels the archive has images, headers and precompiled modules for (the guest boots the first)."""
BUILDS = {
    "570": ("570.172.08-0ubuntu0.24.04.1", "570.195.03-0ubuntu0.24.04.1"),
    "580": ("580.95.05-0ubuntu0.24.04.2", "580.105.08-0ubuntu0.24.04.1", "580.126.20-0ubuntu0.24.04.2"),
}
"""Driver builds per branch, oldest first (the server flavour; the desktop flavour has the newest only)."""
RETIRED = {"565": ("565.57.01-0ubuntu1.24.04.1", "580")}
"""A retired branch: the version of its transitional packages and the branch they hand over to."""


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    depends: tuple[str, ...] = ()
    provides: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    section: str = "restricted/libs"
    source: str = ""
    files: dict[str, str] = field(default_factory=dict)

    def control(self) -> str:
        lines = [f"Package: {self.name}", f"Version: {self.version}", "Architecture: amd64"]
        if self.source:
            lines.append(f"Source: {self.source}")
        lines += [f"Section: {self.section}", "Maintainer: Test <test@example.invalid>"]
        for key, values in (("Depends", self.depends), ("Provides", self.provides), ("Conflicts", self.conflicts)):
            if values:
                lines.append(f"{key}: {', '.join(values)}")
        lines.append(f"Description: {self.name} (test package)")
        return "\n".join(lines) + "\n"


def driver_source(branch: str, server: bool, version: str) -> list[Package]:
    """Every package of one build of ``nvidia-graphics-drivers-<branch>[-server]`` that a headless install uses."""
    f = f"{branch}-server" if server else branch
    up = version.split("-", maxsplit=1)[0]
    src = f"nvidia-graphics-drivers-{f}"
    common = (f"nvidia-kernel-common-{f} (<= {up}-1)", f"nvidia-kernel-common-{f} (>= {up})")

    def pkg(name: str, *depends: str, **kw: object) -> Package:
        return Package(name, version, tuple(depends), source=src, **kw)  # type: ignore[arg-type]

    out = [
        pkg(f"nvidia-utils-{f}", f"nvidia-kernel-common-{f}-{up}", provides=("nvidia-utils", "nvidia-smi")),
        pkg(f"libnvidia-compute-{f}", f"nvidia-kernel-common-{f}-{up}"),
        pkg(f"nvidia-compute-utils-{f}", f"libnvidia-compute-{f}", "adduser"),
        pkg(f"libnvidia-cfg1-{f}"),
        pkg(f"nvidia-firmware-{f}-{up}"),
        pkg(f"nvidia-kernel-common-{f}", f"nvidia-firmware-{f}-{up}", provides=(f"nvidia-kernel-common-{f}-{up}",)),
    ]
    for open_ in ("", "-open"):
        source = f"nvidia-kernel-source-{f}{open_}"
        out += [
            pkg(source, provides=("nvidia-kernel-source",), conflicts=("nvidia-kernel-source",)),
            pkg(f"nvidia-dkms-{f}{open_}", "dkms", f"{source} (<= {up}-1)", f"{source} (>= {up})", *common),
            pkg(
                f"nvidia-headless-no-dkms-{f}{open_}",
                *common,
                f"{source} (= {version})",
                f"libnvidia-compute-{f} (= {version})",
                f"nvidia-compute-utils-{f} (= {version})",
                f"libnvidia-cfg1-{f} (= {version})",
            ),
            pkg(f"nvidia-headless-{f}{open_}", f"nvidia-headless-no-dkms-{f}{open_}", f"nvidia-dkms-{f}{open_}"),
        ]
    return out


def transitional(branch: str, server: bool, version: str, successor: str) -> list[Package]:
    """A retired branch's build: every role's package depends on the successor branch's one, nothing else."""
    f, g = (f"{branch}-server", f"{successor}-server") if server else (branch, successor)
    names = ["nvidia-utils-{}", "libnvidia-compute-{}", "nvidia-kernel-common-{}"]
    names += [f"{n}{o}" for o in ("", "-open") for n in ("nvidia-headless-{}", "nvidia-headless-no-dkms-{}")]
    src = f"nvidia-graphics-drivers-{f}"
    return [Package(n.format(f), version, (n.format(g),), section="restricted/oldlibs", source=src) for n in names]


def precompiled(branch: str, server: bool, version: str, kernel: str) -> list[Package]:
    """linux-restricted-modules' signed modules of one driver build for one kernel (plain and open)."""
    f = f"{branch}-server" if server else branch
    up = version.split("-", maxsplit=1)[0]
    abi = kernel.removesuffix("-generic")
    lrm = f"{abi}.{abi.split('-')[1]}+1"  # e.g. 6.8.0-49.49+1
    out = [Package(f"linux-signatures-nvidia-{kernel}", lrm, source="linux-restricted-signatures")]
    for open_ in ("", "-open"):
        directory = f"nvidia-{branch}{'srv' if server else ''}{open_}"
        out.append(
            Package(
                f"linux-modules-nvidia-{f}{open_}-{kernel}",
                lrm,
                (
                    f"linux-image-{kernel}",
                    f"linux-signatures-nvidia-{kernel}",
                    f"nvidia-kernel-common-{f} (<= {up}-1)",
                    f"nvidia-kernel-common-{f} (>= {up})",
                ),
                source="linux-restricted-modules",
                files={
                    f"lib/modules/{kernel}/kernel/{directory}/nvidia.ko": f"{up}\nlicense="
                    + ("Dual MIT/GPL\n" if open_ else "NVIDIA\n")  # fakeguest_tools.py's module file
                },
            )
        )
    return out


def precompiled_flavour(branch: str, server: bool, version: str, kernel: str) -> list[Package]:
    """The flavour metapackages of the precompiled modules (``linux-modules-nvidia-B[-server][-open]-generic``,
    plain and open), following ``kernel``: they depend on its modules package at exactly its version and on
    ``nvidia-kernel-common-B (>= U)`` (packages.ubuntu.com, noble-updates, linux-modules-nvidia-580-open-generic)."""
    f = f"{branch}-server" if server else branch
    up = version.split("-", maxsplit=1)[0]
    abi = kernel.removesuffix("-generic")
    lrm = f"{abi}.{abi.split('-')[1]}+1"
    return [
        Package(
            f"linux-modules-nvidia-{f}{open_}-generic",
            lrm,
            (f"linux-modules-nvidia-{f}{open_}-{kernel} (= {lrm})", f"nvidia-kernel-common-{f} (>= {up})"),
            section="kernel",
            source="linux-restricted-modules",
        )
        for open_ in ("", "-open")
    ]


def kernel_packages() -> list[Package]:
    """The kernel images and headers, the flavour metapackages (following the first kernel), dkms and adduser."""
    out = [Package("dkms", "3.0.11-1ubuntu13", section="admin"), Package("adduser", "3.137ubuntu1", section="admin")]
    for kernel in KERNELS:
        abi = kernel.removesuffix("-generic")
        out += [
            Package(f"linux-image-{kernel}", f"{abi}.{abi.split('-')[1]}", section="kernel"),
            Package(f"linux-headers-{kernel}", f"{abi}.{abi.split('-')[1]}", section="kernel"),
        ]
    # The flavour metapackages follow the kernel the guest boots; a kernel update is a later archive (kernel_update).
    out += flavour_metapackages(KERNELS[0])
    return out


def flavour_metapackages(kernel: str) -> list[Package]:
    """linux-image-virtual and linux-headers-virtual depending on ``kernel``'s image and headers."""
    meta = kernel.removesuffix("-generic").replace("-", ".") + ".1"
    return [
        Package(f"linux-{k}-virtual", meta, (f"linux-{k}-{kernel}",), section="kernel") for k in ("image", "headers")
    ]


TOOLKIT_BUILDS = ("1.18.1-1", "1.18.2-1")


def toolkit(version: str) -> list[Package]:
    """The NVIDIA Container Toolkit's packages of one release: nvidia-container-toolkit depends on
    nvidia-container-toolkit-base and libnvidia-container-tools at exactly its version (NVIDIA/nvidia-container-toolkit
    packaging/debian/control, tag v1.18.2); libnvidia-container-tools' own dependencies are not modelled."""
    tools = ("libnvidia-container-tools (= {v})", "libnvidia-container-tools (<< 2.0.0)")
    return [
        Package(
            "nvidia-container-toolkit",
            version,
            (f"nvidia-container-toolkit-base (= {version})", *(t.format(v=version) for t in tools)),
            section="utils",
        ),
        Package("nvidia-container-toolkit-base", version, section="utils"),
        Package("libnvidia-container-tools", version, section="utils"),
        Package("libnvidia-container1", version, section="libs"),
    ]


def ubuntu_nvidia_archive() -> list[Package]:
    """Branches 570 and 580 (server and desktop, several builds each), retired 565 (transitional), precompiled
    modules of each branch's newest build for every kernel, the kernel packages and two toolkit releases."""
    out = kernel_packages()
    for branch, versions in BUILDS.items():
        for server in (True, False):
            for version in versions if server else versions[-1:]:  # the desktop flavour: its newest build only
                out += driver_source(branch, server, version)
            for kernel in KERNELS:
                out += [p for p in precompiled(branch, server, versions[-1], kernel) if p not in out]
            out += precompiled_flavour(branch, server, versions[-1], KERNELS[0])
    for branch, (version, successor) in RETIRED.items():
        for server in (True, False):
            out += transitional(branch, server, version, successor)
    for version in TOOLKIT_BUILDS:
        out += toolkit(version)
    return out


def build(packages: list[Package], repo: Path) -> Path:
    """Build every package with dpkg-deb and index them with apt-ftparchive into a flat repository at ``repo``
    (``deb [trusted=yes] file:<repo> ./``); returns ``repo``."""
    repo.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=repo.parent) as tmp:

        def one(p: Package) -> None:
            tree = Path(tmp) / f"{p.name}_{p.version}"
            (tree / "DEBIAN").mkdir(parents=True)
            (tree / "DEBIAN/control").write_text(p.control())
            for path, content in {f"usr/share/doc/{p.name}/version": p.version + "\n", **p.files}.items():
                (tree / path).parent.mkdir(parents=True, exist_ok=True)
                (tree / path).write_text(content)
            deb = repo / f"{p.name}_{p.version}_amd64.deb"
            # A new file, never one written through: a later archive's debs are hard links to an earlier one's.
            deb.unlink(missing_ok=True)
            # -Znone: nothing to gain from compressing a few bytes; --nocheck: the control file is ours (dpkg and
            # apt-ftparchive parse it anyway); --root-owner-group: the files belong to root.
            subprocess.run(
                ["dpkg-deb", "-Znone", "--nocheck", "--root-owner-group", "--build", str(tree), str(deb)],
                check=True,
                capture_output=True,
            )

        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(one, packages))
    packages_index = subprocess.run(
        ["apt-ftparchive", "packages", "."], cwd=repo, check=True, capture_output=True, text=True
    ).stdout
    (repo / "Packages").write_text(packages_index)
    release = subprocess.run(["apt-ftparchive", "release", "."], cwd=repo, check=True, capture_output=True, text=True)
    (repo / "Release").write_text(release.stdout)
    return repo
