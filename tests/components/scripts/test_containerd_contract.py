"""Contract tests of the fake guest's containerd, nvidia-ctk and crictl (fakeguest_containerd.py, kept for the
fault-injection harnesses): for the same files and arguments the fake's output means what the real binaries' does
(containerd 1.7.28 and nvidia-ctk 1.18.2, built by tools/recipes/). Each starts a fake guest, so all are slow."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.components.scripts.fakeguest import DEFAULT_CONTAINERD, FakeGuest
from tests.components.scripts.realcontainerd import chrooted, cri, dump, real_guest

pytestmark = pytest.mark.slow

SITE = """# site tuning
version = 2
imports = ["/etc/containerd/site.d/*.toml"]
oom_score = -999
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "site.example/pause:3.10"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "/etc/containerd/certs.d"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
"""
VERSION3 = """version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = 'runc'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = true
"""
CONFIGS = {"default": DEFAULT_CONTAINERD.replace("= false", "= true"), "site": SITE, "version3": VERSION3}
FLAGS = {"plain": [], "default": ["--set-as-default"], "default-cdi": ["--set-as-default", "--cdi.enabled"]}
CONFIGURE = ["runtime", "configure", "--runtime=containerd"]


def files(guest: FakeGuest) -> dict[str, Any]:
    """config.toml and the toolkit's drop-in, parsed; and whether config.toml kept a comment."""
    main = guest.read("etc/containerd/config.toml")
    drop_in = guest.root / "etc/containerd/conf.d/99-nvidia.toml"
    return {
        "config.toml": tomllib.loads(main),
        "99-nvidia.toml": tomllib.loads(drop_in.read_text()) if drop_in.exists() else None,
        "comments kept": "#" in main,
    }


@pytest.mark.parametrize("flags", FLAGS.values(), ids=FLAGS.keys())
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_fake_nvidia_ctk_runtime_configure_writes_what_the_real_one_does(
    tmp_path: Path, config: str, flags: list[str]
) -> None:
    # nvidia-ctk 1.18.2 cmd/nvidia-ctk/runtime/configure and pkg/config/engine/containerd: the whole CRI table of
    # config.toml copied into the drop-in (containerd 1.7 replaces whole plugin tables on import), the nvidia
    # runtime as a copy of runc's, the drop-in folder added to imports and config.toml re-serialised.
    real, fake = real_guest(tmp_path / "real", None), FakeGuest(tmp_path / "fake")
    for guest in (real, fake):
        guest.write("etc/containerd/config.toml", config)
    chrooted(real, "/usr/bin/nvidia-ctk", *CONFIGURE, *flags)
    assert fake.run_stdin(" ".join(["nvidia-ctk", *CONFIGURE, *flags]) + "\n").returncode == 0
    assert files(fake) == files(real)
    # Run again (the step runs it every time), then without the flags (a spec change): still the same.
    for again in (flags, []):
        chrooted(real, "/usr/bin/nvidia-ctk", *CONFIGURE, *again)
        assert fake.run_stdin(" ".join(["nvidia-ctk", *CONFIGURE, *again]) + "\n").returncode == 0
        assert files(fake) == files(real)


def leaves(table: dict[str, Any], path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every scalar of a parsed TOML document by its key path."""
    out: dict[tuple[str, ...], Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out |= leaves(value, (*path, key))
        else:
            out[(*path, key)] = value
    return out


def test_fake_containerd_default_config_is_a_subset_of_the_real_one(tmp_path: Path) -> None:
    # The fake prints fewer keys than containerd 1.7.28 `config default`; each one it prints has 1.7's value
    # (runc with SystemdCgroup = false, the pause image, runc as the default runtime).
    real, fake = real_guest(tmp_path / "real", "containerd-1.7"), FakeGuest(tmp_path / "fake")
    want = leaves(tomllib.loads(chrooted(real, "/usr/bin/containerd", "config", "default")))
    got = leaves(tomllib.loads(fake.run_stdin("containerd config default\n").stdout))
    assert {k: want.get(k) for k in got} == got


PARTIAL = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
"""


def effective(config: dict[str, Any]) -> dict[str, Any]:
    """What the steps rely on in containerd's effective CRI config."""
    table = cri(config)
    runtimes = table["containerd"]["runtimes"]
    return {
        "runtimes": sorted(runtimes),
        "SystemdCgroup": {n: r.get("options", {}).get("SystemdCgroup", False) for n, r in runtimes.items()},
        "default": table["containerd"].get("default_runtime_name", "runc"),
        "sandbox_image": table.get("sandbox_image"),
        "enable_cdi": table.get("enable_cdi", False),
    }


@pytest.mark.parametrize("drop_in", [PARTIAL, None], ids=["partial-drop-in", "no-drop-in"])
def test_fake_containerd_applies_imports_as_containerd_1_7_does(tmp_path: Path, drop_in: str | None) -> None:
    # containerd 1.7 services/server/config/config.go mergeConfig: an imported file's plugin table replaces the
    # whole table, so a drop-in with only the nvidia runtime loses runc, its SystemdCgroup and the sandbox image.
    real, fake = real_guest(tmp_path / "real", "containerd-1.7"), FakeGuest(tmp_path / "fake")
    main = 'imports = ["/etc/containerd/conf.d/*.toml"]\n' + CONFIGS["default"].replace("pause:3.8", "site/pause:1")
    for guest in (real, fake):
        guest.write("etc/containerd/config.toml", main)
        if drop_in:
            guest.write("etc/containerd/conf.d/50-partial.toml", drop_in)
    real_view = effective(dump(real))
    assert effective(tomllib.loads(fake.run_stdin("containerd config dump\n").stdout)) == real_view
    if drop_in:
        assert real_view["SystemdCgroup"].get("runc") in (None, False)
        assert real_view["sandbox_image"] != "site/pause:1"
    # crictl info (the running daemon's CRI config, as the verify step reads it) shows the same merge.
    fake.write("var/lib/fake-dpkg/cri-tools", "1.34.0-1.1")
    assert fake.run_stdin("systemctl restart containerd\n").returncode == 0
    info = json.loads(fake.run_stdin("crictl info\n").stdout)["config"]
    runtimes = info["containerd"]["runtimes"]
    assert sorted(runtimes) == [r for r in real_view["runtimes"] if r in runtimes] == sorted(runtimes)
    assert {n: r["options"].get("SystemdCgroup", False) for n, r in runtimes.items()} == {
        n: real_view["SystemdCgroup"][n] for n in runtimes
    }


def test_real_cdi_generate_needs_nvml_so_it_stays_a_fake(tmp_path: Path) -> None:
    # nvidia-ctk 1.18.2 `cdi generate --output=F` (as the runtime step calls it) accepts the flag and, without
    # NVIDIA's driver libraries, fails ("failed to initialize NVML") and writes nothing: a spec needs a GPU.
    real = real_guest(tmp_path / "real", None)
    r = subprocess.run(
        ["chroot", str(real.root), "/usr/bin/nvidia-ctk", "cdi", "generate", "--output=/nvidia.yaml.pgc-new"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 1 and "failed to initialize NVML" in r.stderr
    assert not (real.root / "nvidia.yaml.pgc-new").exists()
