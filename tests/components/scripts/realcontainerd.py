"""The real containerd and nvidia-ctk (built by tools/recipes/) inside a fake guest: both run chrooted into the guest's
root, so their own default paths (/etc/containerd/config.toml, the drop-in /etc/containerd/conf.d/99-nvidia.toml and
the ``imports`` line pointing at it) are the guest's files, exactly as on a node. Only ``nvidia-ctk cdi generate``
stays the fake's: it needs NVML, i.e. a GPU and its driver."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.components.scripts.fakeguest import FakeGuest
from tests.support import built_tool

VERSIONS = ("containerd-1.7", "containerd-2.0", "containerd-2.2")
"""The containerd recipes: 1.7 (Ubuntu 24.04's branch, config version 2), 2.0.5 (default config without
SystemdCgroup) and 2.2 (config version 3 with SystemdCgroup)."""


def need_root() -> None:
    """chroot needs root: skipped with the reason elsewhere, a failure under the project's CI."""
    if os.geteuid() != 0:
        message = "running the real containerd/nvidia-ctk chrooted into a fake guest needs root"
        if os.environ.get("PGC_REQUIRE_EXTERNAL"):
            pytest.fail(f"{message} (CI must provide it)")
        pytest.skip(message)


def place(binary: Path, root: Path, name: str) -> None:
    """``binary`` as /usr/bin/<name> in ``root`` with the shared libraries it links (ldd), for chroot."""
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, root / "usr/bin" / name)
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False).stdout
    for lib in re.findall(r"(/\S+)\s+\(0x", ldd):
        dest = root / lib.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            shutil.copy2(Path(lib).resolve(), dest)


def real_guest(root: Path, containerd: str | None) -> FakeGuest:
    """A fake guest whose nvidia-ctk is the real 1.18.2 and whose containerd is the ``containerd`` recipe's (the
    fake's with None)."""
    need_root()
    ctk = built_tool("nvidia-ctk")
    ctd = built_tool(containerd) if containerd else None
    # The fake guest's PATH holds only its stubs; no exec: a kill-after fault's trap needs the stub's shell.
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    guest = FakeGuest(root)
    place(ctk, guest.root, "nvidia-ctk")
    if ctd:
        place(ctd, guest.root, "containerd")
        guest.stub_script("containerd", f'{chroot} "$PGC_ROOT" /usr/bin/containerd "$@"')
    guest.stub_script(
        "nvidia-ctk",
        'if [ "$1" = cdi ]; then echo "cdiVersion: 0.5.0" > "${3#--output=}"; exit 0; fi\n'
        f'{chroot} "$PGC_ROOT" /usr/bin/nvidia-ctk "$@"',
    )
    return guest


def chrooted(guest: FakeGuest, *argv: str) -> str:
    """Run a real tool chrooted into the guest (bounded); its stdout."""
    r = subprocess.run(["chroot", str(guest.root), *argv], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout


def dump(guest: FakeGuest) -> dict[str, Any]:
    """The effective config the real containerd loads from the guest's files (``containerd config dump``)."""
    return tomllib.loads(chrooted(guest, "/usr/bin/containerd", "config", "dump"))


def cri(config: dict[str, Any]) -> dict[str, Any]:
    """The CRI runtime plugin's table: version 2 names it io.containerd.grpc.v1.cri, version 3 (containerd 2.x)
    io.containerd.cri.v1.runtime."""
    plugins: dict[str, Any] = config["plugins"]
    name = "io.containerd.grpc.v1.cri" if config.get("version", 2) == 2 else "io.containerd.cri.v1.runtime"
    table: dict[str, Any] = plugins[name]
    return table


def sandbox_image(config: dict[str, Any]) -> str:
    """The pause image: CRI's sandbox_image in version 2, the images plugin's pinned sandbox image in version 3."""
    if config.get("version", 2) == 2:
        return str(cri(config)["sandbox_image"])
    return str(config["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"])
