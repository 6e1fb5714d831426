"""The runtime step against the real containerd (1.7, 2.0.5, 2.2; tools/recipes/) and the real nvidia-ctk 1.18.2,
both chrooted into a fake guest: the config the step leaves is what the real containerd loads (``containerd config
dump``, the effective merged config) with runc and nvidia on the systemd cgroup driver, the nvidia runtime present,
the default runtime the spec asks for, and nothing of the CRI settings dropped by the toolkit's drop-in.
Each runs the step in a fake guest, so all are slow."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.render.guest_scripts import runtime_args
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.realcontainerd import VERSIONS, chrooted, cri, dump, real_guest, sandbox_image

pytestmark = pytest.mark.slow


def spec(**overrides: object) -> GuestBootstrapSpec:
    data: dict[str, object] = {
        "nodeName": "gpu-a10-1",
        "gpus": [{"vendorDevice": "10de:2236", "product": "NVIDIA-A10"}],
        "driverMode": "host",
        "driverBranch": "580",
        "kernelModules": "open",
        "toolkit": True,
        "apiEndpoint": "k8s-api.lab.internal:6443",
        "kubernetesMinor": 34,
    }
    data.update(overrides)
    return GuestBootstrapSpec.model_validate(data)


def leaves(table: dict[str, Any], path: str = "") -> dict[str, Any]:
    """Every scalar of a parsed TOML document by its dotted key path (a readable difference)."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        out |= leaves(value, f"{path}.{key}") if isinstance(value, dict) else {f"{path}.{key}": value}
    return out


def runtimes(config: dict[str, Any]) -> dict[str, Any]:
    table: dict[str, Any] = cri(config)["containerd"]["runtimes"]
    return table


def default_config(guest: FakeGuest) -> dict[str, Any]:
    return tomllib.loads(chrooted(guest, "/usr/bin/containerd", "config", "default"))


SPECS = {
    "toolkit-default": {},
    "toolkit-not-default": {"defaultRuntime": False},
    "toolkit-cdi": {"cdi": True},
    "operator": {"driverMode": "operator", "toolkit": False},
}


@pytest.mark.parametrize("overrides", SPECS.values(), ids=SPECS.keys())
@pytest.mark.parametrize("containerd", VERSIONS)
def test_the_real_containerd_loads_the_steps_config_with_systemd_cgroups(
    tmp_path: Path, containerd: str, overrides: dict[str, object]
) -> None:
    guest = real_guest(tmp_path / "root", containerd)
    b = spec(**overrides)
    r = guest.step("runtime", *runtime_args(b))
    assert r.returncode == 0, r.stderr  # containerd 2.0.0-2.0.6 print no SystemdCgroup line: still converges
    config, defaults = dump(guest), default_config(guest)
    found = runtimes(config)
    assert found["runc"]["options"]["SystemdCgroup"] is True
    assert sandbox_image(config) == sandbox_image(defaults)  # nothing of the CRI table dropped
    ctd = cri(config)["containerd"]
    if b.toolkit:
        assert found["nvidia"]["options"]["SystemdCgroup"] is True
        assert found["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
        assert ctd["default_runtime_name"] == ("nvidia" if b.default_runtime else "runc")
        if b.cdi:
            assert cri(config)["enable_cdi"] is True
    else:
        assert "nvidia" not in found and ctd["default_runtime_name"] == "runc"
    # A second run changes and restarts nothing.
    again = guest.step("runtime", *runtime_args(b))
    assert again.returncode == 0, again.stderr
    assert "runtime: containerd unchanged" in again.stdout and "changed:" not in again.stdout


@pytest.mark.parametrize("containerd", VERSIONS)
def test_site_settings_of_the_cri_table_survive_the_toolkits_drop_in(tmp_path: Path, containerd: str) -> None:
    # containerd 1.7 replaces a whole plugin table on import (services/server/config/config.go mergeConfig; 2.0.5
    # and later merge them key by key): the toolkit's drop-in must carry the site's CRI settings with it.
    guest = real_guest(tmp_path / "root", containerd)
    site = chrooted(guest, "/usr/bin/containerd", "config", "default")
    assert "SystemdCgroup = true" not in site
    for old, new in (("registry.k8s.io/pause:", "site.example/pause:"), ("max_conf_num = 1", "max_conf_num = 7")):
        assert old in site, old
        site = site.replace(old, new)
    guest.write("etc/containerd/config.toml", site)
    r = guest.step("runtime", *runtime_args(spec()))
    assert r.returncode == 0, r.stderr
    config = dump(guest)
    assert sandbox_image(config).startswith("site.example/pause:")
    assert cri(config)["cni"]["max_conf_num"] == 7
    assert runtimes(config)["runc"]["options"]["SystemdCgroup"] is True
    assert runtimes(config)["nvidia"]["options"]["SystemdCgroup"] is True
    assert cri(config)["containerd"]["default_runtime_name"] == "nvidia"


SITE_DROP_IN = """version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "site.example/pause:3.10"
"""


def test_a_site_drop_in_with_cri_settings_would_be_lost_so_the_step_refuses_it(tmp_path: Path) -> None:
    # Why: with containerd 1.7 the toolkit's drop-in (the whole CRI table of config.toml, loaded last) replaces the
    # site file's CRI table, so its sandbox image silently does not apply.
    guest = real_guest(tmp_path / "root", "containerd-1.7")
    main = chrooted(guest, "/usr/bin/containerd", "config", "default")
    assert "imports = []" in main
    main = main.replace("SystemdCgroup = false", "SystemdCgroup = true")
    guest.write(
        "etc/containerd/config.toml", main.replace("imports = []", 'imports = ["/etc/containerd/conf.d/*.toml"]')
    )
    guest.write("etc/containerd/conf.d/50-site.toml", SITE_DROP_IN)
    assert sandbox_image(dump(guest)) == "site.example/pause:3.10"
    chrooted(guest, "/usr/bin/nvidia-ctk", "runtime", "configure", "--runtime=containerd")
    assert sandbox_image(dump(guest)) != "site.example/pause:3.10"
    # The step refuses such a file, naming it, before the toolkit writes its drop-in.
    guest.root.joinpath("etc/containerd/conf.d/99-nvidia.toml").unlink()
    r = guest.step("runtime", *runtime_args(spec()))
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == (
        "runtime: /etc/containerd/conf.d/50-site.toml: expected the CRI settings in /etc/containerd/config.toml "
        "(the toolkit's drop-in replaces other files' CRI table), saw a CRI plugin table"
    )
    assert not [c for c in r.calls if c.startswith("nvidia-ctk")]


@pytest.mark.parametrize("mode", ["kill", "kill-after"])
def test_the_step_converges_with_the_real_tools_from_a_kill_at_every_command(tmp_path: Path, mode: str) -> None:
    # The fault-injection harness (guest_harness.py) runs the fakes; here the runtime step alone, with the real
    # containerd 1.7 and nvidia-ctk, killed at each command, then run again: the same files and effective config.
    b = spec(cdi=True)
    want = real_guest(tmp_path / "want", "containerd-1.7")
    calls = want.step("runtime", *runtime_args(b)).calls
    files = ("etc/containerd/config.toml", "etc/containerd/conf.d/99-nvidia.toml")
    expected = ([want.read(f) for f in files], dump(want))
    for i in range(1, len(calls) + 1):
        guest = real_guest(tmp_path / f"{mode}-{i}", "containerd-1.7")
        guest.fault(i, mode)
        assert guest.step("runtime", *runtime_args(b)).returncode != 0 or mode == "kill-after"
        guest.fault(None)
        again = guest.step("runtime", *runtime_args(b))
        assert again.returncode == 0, f"killed at {calls[i - 1]!r}: {again.stderr}"
        got = ([guest.read(f) for f in files], dump(guest))
        assert got[0] == expected[0], f"killed at {calls[i - 1]!r}"
        # config dump lists the files it loaded (`imports`) in map order (1.7.28 services/server/config/config.go
        # LoadConfig: `for path := range loaded`), which Go does not fix.
        for config in (got[1], expected[1]):
            config["imports"] = sorted(config["imports"])
        assert leaves(got[1]) == leaves(expected[1]), f"killed at {calls[i - 1]!r}"
        third = guest.step("runtime", *runtime_args(b))
        assert "runtime: containerd unchanged" in third.stdout, f"killed at {calls[i - 1]!r}"


@pytest.mark.parametrize("containerd", VERSIONS)
def test_host_to_operator_mode_takes_the_host_toolkit_out_of_containerd(tmp_path: Path, containerd: str) -> None:
    # driverMode host -> operator: the real nvidia-ctk's drop-in and the toolkit packages go; the real containerd
    # then loads runc as the default runtime on the systemd cgroup driver, with nothing of the CRI table lost.
    guest = real_guest(tmp_path / "root", containerd)
    assert guest.step("runtime", *runtime_args(spec())).returncode == 0
    assert "nvidia" in runtimes(dump(guest))
    operator = spec(driverMode="operator", toolkit=False)
    r = guest.step("runtime", *runtime_args(operator))
    assert r.returncode == 0, r.stderr
    assert "toolkit: host toolkit removed" in r.stdout and "runtime: containerd restarted" in r.stdout
    config = dump(guest)
    assert "nvidia" not in runtimes(config) and cri(config)["containerd"]["default_runtime_name"] == "runc"
    assert runtimes(config)["runc"]["options"]["SystemdCgroup"] is True
    assert sandbox_image(config) == sandbox_image(default_config(guest))
    assert guest.installed("nvidia-container-toolkit") is None and guest.holds() == []
    again = guest.step("runtime", *runtime_args(operator))
    assert again.returncode == 0 and "runtime: containerd unchanged" in again.stdout, again.stderr
    assert "changed:" not in again.stdout and "removed" not in again.stdout


def test_a_kill_at_every_command_of_the_toolkit_removal_converges(tmp_path: Path) -> None:
    host, operator = spec(), spec(driverMode="operator", toolkit=False)

    def at_host(root: Path) -> FakeGuest:
        guest = real_guest(root, "containerd-1.7")
        assert guest.step("runtime", *runtime_args(host)).returncode == 0
        return guest

    want = at_host(tmp_path / "want")
    calls = want.step("runtime", *runtime_args(operator)).calls
    expected = (want.read("etc/containerd/config.toml"), leaves(dump(want)), want.installed("nvidia-container-toolkit"))
    assert expected[2] is None
    for i in range(1, len(calls) + 1):
        guest = at_host(tmp_path / f"kill-{i}")
        guest.fault(i, "kill")
        guest.step("runtime", *runtime_args(operator))
        guest.fault(None)
        again = guest.step("runtime", *runtime_args(operator))
        assert again.returncode == 0, f"killed at {calls[i - 1]!r}: {again.stderr}"
        got = (
            guest.read("etc/containerd/config.toml"),
            leaves(dump(guest)),
            guest.installed("nvidia-container-toolkit"),
        )
        assert got == expected, f"killed at {calls[i - 1]!r}"
        assert not (guest.root / "etc/containerd/conf.d/99-nvidia.toml").exists()
        third = guest.step("runtime", *runtime_args(operator))
        assert "runtime: containerd unchanged" in third.stdout, f"killed at {calls[i - 1]!r}"
