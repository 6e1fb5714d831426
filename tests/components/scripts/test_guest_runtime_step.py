"""The runtime step (guest_runtime.sh) on the fake guest: containerd's config (systemd cgroups, the toolkit's
drop-in and what would hide it), the toolkit's repository, CDI. The same config work against the real containerd and
nvidia-ctk: test_real_containerd.py."""

from __future__ import annotations

from proxmox_gpu_cluster.render.guest_scripts import runtime_args
from tests.components.scripts.fakeguest import DEFAULT_CONTAINERD, FakeGuest
from tests.components.scripts.test_guest_bootstrap_scripts import guest, spec

__all__ = ["guest"]  # the fixture, shared with the bootstrap tests


def test_containerd_config_keeps_its_content_and_gets_systemd_cgroups(guest: FakeGuest) -> None:
    guest.write("var/lib/fake-dpkg/containerd", "1.7.28-0ubuntu1~24.04.1")
    guest.write(
        "etc/containerd/config.toml",
        'version = 2\noom_score = -999\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "site/pause:3.10"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n  SystemdCgroup = false\n',
    )
    r = guest.step("runtime", *runtime_args(spec()))
    assert r.returncode == 0, r.stderr
    config = guest.read("etc/containerd/config.toml")
    assert "oom_score = -999" in config
    assert "SystemdCgroup = true" in config and "SystemdCgroup = false" not in config
    assert not [c for c in r.calls if c.endswith(" containerd") and c.startswith("apt-get install")]
    drop_in = guest.read("etc/containerd/conf.d/99-nvidia.toml")
    # containerd 1.7 replaces whole plugin tables on import: the drop-in carries the site's CRI settings too.
    assert 'default_runtime_name = "nvidia"' in drop_in and 'sandbox_image = "site/pause:3.10"' in drop_in


def test_docker_containerd_stub_config_is_replaced_by_the_defaults(guest: FakeGuest) -> None:
    guest.write("var/lib/fake-dpkg/containerd.io", "1.7.28-1")
    guest.write("etc/containerd/config.toml", 'disabled_plugins = ["cri"]\n')
    r = guest.step("runtime", *runtime_args(spec(driverMode="operator", toolkit=False)))
    assert r.returncode == 0, r.stderr
    config = guest.read("etc/containerd/config.toml")
    assert "disabled_plugins" not in config and "SystemdCgroup = true" in config
    assert not [c for c in r.calls if c.startswith("apt-get install")]


def test_a_config_without_a_runc_runtime_is_refused(guest: FakeGuest) -> None:
    guest.write("var/lib/fake-dpkg/containerd", "1.7.28-0ubuntu1~24.04.1")
    guest.write("etc/containerd/config.toml", "version = 2\n")
    r = guest.step("runtime", *runtime_args(spec()))
    assert r.returncode == 1
    assert r.stderr.strip() == (
        "runtime: /etc/containerd/config.toml: expected a runc runtime to set SystemdCgroup on, saw none"
    )


def test_runc_options_without_the_systemd_cgroup_line_get_one(guest: FakeGuest) -> None:
    # containerd 2.0.0-2.0.6 print runc's options without SystemdCgroup (internal/cri/config/config_unix.go).
    guest.write("var/lib/fake-dpkg/containerd", "2.0.5-1")
    guest.write(
        "etc/containerd/config.toml",
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  BinaryName = ''\n",
    )
    r = guest.step("runtime", *runtime_args(spec()))
    assert r.returncode == 0, r.stderr
    assert "SystemdCgroup = true" in guest.read("etc/containerd/config.toml")
    assert "SystemdCgroup = true" in guest.read("etc/containerd/conf.d/99-nvidia.toml")  # copied to nvidia


def test_a_site_drop_in_with_a_cri_table_is_refused_before_the_toolkits_drop_in_hides_it(guest: FakeGuest) -> None:
    # The toolkit's drop-in carries config.toml's whole CRI table and loads last (test_real_containerd.py shows
    # containerd 1.7 then dropping the site file's sandbox image).
    guest.write("etc/containerd/config.toml", DEFAULT_CONTAINERD + '\nimports = ["site.d/*.toml"]\n')
    guest.write("etc/containerd/site.d/50-site.toml", '[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "x"\n')
    r = guest.step("runtime", *runtime_args(spec()))
    assert r.returncode == 1
    assert r.stderr.splitlines()[0].startswith("runtime: /etc/containerd/site.d/50-site.toml: expected the CRI")
    # Without the host toolkit nothing hides it: the step goes on.
    assert guest.step("runtime", *runtime_args(spec(driverMode="operator", toolkit=False))).returncode == 0


def test_the_new_repository_is_fetched_before_its_packages_are_installed(guest: FakeGuest) -> None:
    r = guest.step("runtime", *runtime_args(spec()))
    assert r.returncode == 0, r.stderr
    key = r.calls.index("curl -fsSL --retry 3 https://nvidia.github.io/libnvidia-container/gpgkey")
    install = next(i for i, c in enumerate(r.calls) if "nvidia-container-toolkit=1.18.2-1" in c)
    assert "apt-get -o DPkg::Lock::Timeout=600 update -q --error-on=any" in r.calls[key:install]
    assert guest.read("etc/apt/sources.list.d/nvidia-container-toolkit.list") == (
        "deb [signed-by=/etc/apt/keyrings/nvidia-container-toolkit.gpg] "
        "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
    )


def test_cdi_spec_is_generated_once(guest: FakeGuest) -> None:
    b = spec(cdi=True)
    first = guest.step("runtime", *runtime_args(b))
    second = guest.step("runtime", *runtime_args(b))
    assert first.returncode == second.returncode == 0
    assert [c for c in first.calls if c.startswith("nvidia-ctk cdi generate")]
    assert not [c for c in second.calls if c.startswith("nvidia-ctk cdi")]
    assert guest.read("var/run/cdi/nvidia.yaml").startswith("cdiVersion")


def test_cdi_turns_on_containerds_cdi_support_in_the_running_service(guest: FakeGuest) -> None:
    # containerd 1.7 resolves CDI device names only with enable_cdi; without it the device plugin's CDI names fail.
    def running_cdi() -> bool:  # the drop-in containerd was last restarted with (what crictl info reports)
        running = guest.root / "fake-running/containerd/conf.d/99-nvidia.toml"
        return running.exists() and "enable_cdi = true" in running.read_text()

    assert guest.step("runtime", *runtime_args(spec(cdi=False))).returncode == 0
    assert not running_cdi()
    assert guest.step("runtime", *runtime_args(spec(cdi=True))).returncode == 0
    assert running_cdi()  # the file, and containerd restarted with it


def test_operator_managed_toolkit_leaves_containerd_to_the_operator(guest: FakeGuest) -> None:
    b = spec(driverMode="operator", toolkit=False)
    r = guest.step("runtime", *runtime_args(b))
    assert r.returncode == 0, r.stderr
    assert "SystemdCgroup = true" in guest.read("etc/containerd/config.toml")
    # It only asks whether a host toolkit is left to remove (none on a new node).
    assert not [c for c in r.calls if "nvidia" in c and not c.startswith("dpkg-query")]
