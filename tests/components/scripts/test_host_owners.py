"""Several owners (stacks, or clusters of one program) on one Proxmox node: each host prep records its owner's
claim in its own drop-in and writes the host-wide files (vfio.conf, the blacklist, the kernel command line) from
the union of all drop-ins, so neither unbinds the other's GPUs; a conflicting claim is refused naming both; a
release removes one drop-in only. A node an earlier version prepared keeps its files byte for byte."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

from tests.components.scripts.fakehost import A10, A100, CLAIMS, GRUB, OWNER, FakeHost, mutating
from tests.components.scripts.test_host_iommu import CONSOLE, console_node

DEV, PROD = "dev-1a2b3c4d", "prod-5e6f7a8b-teama"
VFIO = "etc/modprobe.d/vfio.conf"
BLACKLIST = "etc/modprobe.d/blacklist-gpu-passthrough.conf"
FUNCTIONS = ("0000:41:00.0", "0000:81:00.0", "0000:81:00.1")


def vfio_functions(host: FakeHost) -> list[str]:
    """The functions vfio.conf's install command hands to vfio-pci."""
    match = re.search(r"^install vfio-pci for f in ([^;]*);", host.read(VFIO), re.M)
    assert match is not None, host.read(VFIO)
    return match[1].split()


def quiet(host: FakeHost, *gpus: tuple[str, str], owner: str, pt: bool = False) -> None:
    """A third run changes nothing and reboots nothing."""
    r = host.prep(*gpus, owner=owner, pt=pt)
    assert (r.returncode, r.stdout, mutating(r.calls)) == (0, "reboot: not-needed\n", []), r.stdout + r.stderr
    assert not host.reboot_if_scheduled()


def test_two_owners_in_either_order_both_end_bound(tmp_path: Path) -> None:
    ends = []
    for order in ((DEV, PROD), (PROD, DEV)):
        host = FakeHost(tmp_path / "-".join(order))
        claims = {DEV: A10, PROD: A100}
        for owner in order:
            r = host.prep(claims[owner], owner=owner)
            assert r.returncode == 0 and r.stdout.splitlines()[-1] == "reboot: not-needed", r.stdout + r.stderr
        # The first owner's GPU is still in vfio.conf: the second run composed both claims.
        assert sorted(vfio_functions(host)) == list(FUNCTIONS)
        assert {host.driver_of(f) for f in FUNCTIONS} == {"vfio-pci"}
        assert (host.root / BLACKLIST).exists()  # every NVIDIA card is claimed by one owner or the other
        for owner in order:
            quiet(host, claims[owner], owner=owner)
        host.reboot()  # the next boot binds both owners' GPUs from the configuration
        assert {host.driver_of(f) for f in FUNCTIONS} == {"vfio-pci"}
        assert host.verify(A10[0], A100[0]).returncode == 0
        ends.append(host.state())
    # Whichever owner ran last, the node ends the same (the union's order is the owners' names, not who ran).
    assert ends[0] == ends[1]


def test_two_clusters_of_one_program_planned_then_host_prepped_in_either_order(tmp_path: Path) -> None:
    # examples/two-teams: vision passes pve1's A10 through, speech its A100. Each cluster's host prep runs with
    # exactly the arguments the plan gives it (its own scope token as owner) on a node like pve1.
    from tests.examples.test_two_teams import planned

    preps = {r.name: r.plain_inputs for r in planned().of_type("command:remote:Command") if r.name.endswith("-prep")}
    assert len(preps) == 2
    args = {}
    for name, inputs in preps.items():
        words = shlex.split(inputs["create"])
        args[name] = words[next(i for i, w in enumerate(words) if w.endswith("/step.sh")) + 1 :]
        assert shlex.split(inputs["delete"])[-3:] == ["--owner", args[name][1], "--release"]
    assert len({a[1] for a in args.values()}) == 2  # two owners
    ends = []
    for order in (sorted(args), sorted(args, reverse=True)):
        host = FakeHost(tmp_path / order[0])
        for name in order:
            r = host.run("host_prep.sh", *args[name])
            assert r.returncode == 0 and r.stdout.splitlines()[-1] == "reboot: not-needed", r.stdout + r.stderr
        assert {host.driver_of(f) for f in FUNCTIONS} == {"vfio-pci"} and sorted(vfio_functions(host)) == list(
            FUNCTIONS
        )
        for name in order:
            r = host.run("host_prep.sh", *args[name])
            assert (r.stdout, mutating(r.calls)) == ("reboot: not-needed\n", []), r.stdout + r.stderr
        host.reboot()
        assert {host.driver_of(f) for f in FUNCTIONS} == {"vfio-pci"}
        ends.append(host.state())
    assert ends[0] == ends[1]


def test_the_same_slot_with_another_model_is_refused_naming_both(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "root")
    assert host.prep(A10, owner=DEV).returncode == 0
    before = host.state()
    r = host.prep(("0000:41:00", "10de:20b5"), owner=PROD)
    assert r.returncode == 1 and mutating(r.calls) == []
    assert r.stderr == (
        "host-prep: gpu-claims: expected one vendor:device for GPU 0000:41:00 on this node, saw 10de:2236 declared "
        f"by owner {DEV} and 10de:20b5 by owner {PROD}; remove it from one of them\n"
    )
    assert host.state() == before  # refused before its claim was recorded: the first owner's runs go on
    quiet(host, A10, owner=DEV)


def test_the_same_gpu_declared_by_two_owners_is_shared(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "root")
    assert host.prep(A10, owner=DEV).returncode == 0
    r = host.prep(A10, A100, owner=PROD)
    assert r.returncode == 0, r.stderr
    assert vfio_functions(host) == list(FUNCTIONS)  # listed once
    quiet(host, A10, owner=DEV)
    quiet(host, A10, A100, owner=PROD)


def test_a_kernel_argument_one_owner_wants_is_kept_when_the_other_runs(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "root")
    r = host.prep(A10, owner=DEV, pt=True)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "reboot: scheduled (the running kernel lacks iommu=pt)"
    assert host.reboot_if_scheduled()
    r = host.prep(A100, owner=PROD)  # wants no iommu=pt: the union still does
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "reboot: not-needed", r.stdout + r.stderr
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt"' in host.read("etc/default/grub")
    assert not any(c.startswith("update-grub") for c in r.calls)
    assert host.verify(A10[0], A100[0], pt=True).returncode == 0
    quiet(host, A10, owner=DEV, pt=True)
    quiet(host, A100, owner=PROD)


def test_a_release_leaves_the_gpu_to_the_next_run_of_another_owner(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "root")
    assert host.prep(A10, owner=DEV).returncode == 0 and host.prep(A100, owner=PROD).returncode == 0
    assert (host.root / BLACKLIST).exists()
    files = host.state()["files"]
    r = host.release(PROD)
    assert r.returncode == 0 and r.calls == [], r.stderr
    assert r.stdout.splitlines()[0] == f"changed: /{CLAIMS}/{PROD}.conf (removed)"
    after = host.state()["files"]
    assert isinstance(files, dict) and isinstance(after, dict)
    assert set(files) - set(after) == {f"{CLAIMS}/{PROD}.conf"}  # nothing else: no file, no unbinding, no reboot
    assert all(after[k] == files[k] for k in after if not k.startswith("run/lock/"))
    assert host.release(PROD).stdout.startswith("released: ")  # again: nothing to remove
    # The other owner's next run composes without it: the A100 leaves vfio.conf and, as it is now an NVIDIA card
    # no owner claims, the blacklist goes too. It stays on vfio-pci until the next boot (nothing unbinds it).
    r = host.prep(A10, owner=DEV)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "reboot: not-needed", r.stderr
    assert vfio_functions(host) == ["0000:41:00.0"] and not (host.root / BLACKLIST).exists()
    assert host.driver_of("0000:81:00.0") == "vfio-pci"
    quiet(host, A10, owner=DEV)
    host.reboot()
    assert (host.driver_of("0000:41:00.0"), host.driver_of("0000:81:00.1")) == ("vfio-pci", "snd_hda_intel")
    # Claimed again: the blacklist reappears with the union.
    assert host.prep(A100, owner=PROD).returncode == 0 and (host.root / BLACKLIST).exists()
    assert sorted(vfio_functions(host)) == list(FUNCTIONS)


def test_a_console_gpu_of_the_same_model_no_owner_declares_keeps_its_driver(tmp_path: Path) -> None:
    host = console_node(tmp_path / "root")
    assert host.prep(A10, owner=DEV).returncode == 0 and host.prep(A100, owner=PROD).returncode == 0
    assert CONSOLE not in vfio_functions(host) and not (host.root / BLACKLIST).exists()
    host.reboot()
    assert host.driver_of(CONSOLE) == "nouveau"
    assert {host.driver_of(f) for f in FUNCTIONS} == {"vfio-pci"}


def test_a_malformed_drop_in_fails_naming_its_file(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "root")
    cases = {
        "gpu 0000:41:00=10de:2236\niommu-pt 1\nacs-override 0\nrm -rf /\n": "'rm -rf /'",
        "gpu 0000:41:00=10DE:2236\niommu-pt 1\nacs-override 0\n": "'gpu 0000:41:00=10DE:2236'",
        "gpu 0000:41:00=10de:2236\niommu-pt 1\niommu-pt 0\nacs-override 0\n": "'iommu-pt 0'",
        "gpu 0000:41:00=10de:2236\niommu-pt 1\n": "1 no acs-override",
        "iommu-pt 1\nacs-override 0\n": "none",
    }
    for text, saw in cases.items():
        host.write(f"{CLAIMS}/{PROD}.conf", text)
        r = host.prep(A10, owner=DEV)
        assert r.returncode == 1 and mutating(r.calls) == [], r.stdout
        assert r.stderr.startswith("host-prep: claims: expected ") and r.stderr.endswith(f", saw {saw}\n"), r.stderr
        assert f"/{CLAIMS}/{PROD}.conf" in r.stderr
    host.write(f"{CLAIMS}/{PROD}.conf", "# a comment\ngpu 0000:81:00=10de:20f1\niommu-pt 0\nacs-override 0\n")
    assert host.prep(A10, owner=DEV).returncode == 0 and sorted(vfio_functions(host)) == list(FUNCTIONS)
    host.write(f"{CLAIMS}/Prod.conf", "")
    r = host.prep(A10, owner=DEV)
    assert r.returncode == 1 and "saw 'Prod.conf'" in r.stderr and f"/{CLAIMS}" in r.stderr


def test_owner_and_release_arguments(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "root")
    r = host.run("host_prep.sh", "--cpu-vendor", "amd", "--gpu", "0000:41:00=10de:2236")
    assert r.returncode == 1
    assert r.stderr == "host-prep: arguments: expected --owner like ^[a-z0-9][a-z0-9-]{0,62}$, saw ''\n"
    for bad in ("Prod", "-prod", "a" * 64, "prod/../x"):
        assert host.prep(A10, owner=bad).returncode == 1
        assert host.release(bad).returncode == 1
    assert host.prep(A10, owner="a" * 63).returncode == 0
    assert host.release("a" * 63).returncode == 0 and not any((host.root / CLAIMS).iterdir())


# What the previous version (without owners) wrote for `--gpu 0000:81:00=10de:20f1 --gpu 0000:41:00=10de:2236
# --iommu-pt 1` on this fake AMD node, byte for byte.
PREVIOUS = {
    VFIO: "# Managed by proxmox-gpu-cluster: vfio-pci takes exactly these PCI functions (driver_override), the host "
    "drivers everything else\ninstall vfio-pci for f in 0000:81:00.0 0000:81:00.1 0000:41:00.0; do [ ! -e "
    "/sys/bus/pci/devices/$f/driver_override ] || echo vfio-pci > /sys/bus/pci/devices/$f/driver_override; done; "
    "modprobe --ignore-install vfio-pci $CMDLINE_OPTS\nsoftdep nouveau pre: vfio-pci\nsoftdep nvidia pre: vfio-pci\n"
    "softdep nvidiafb pre: vfio-pci\nsoftdep nvidia_drm pre: vfio-pci\nsoftdep snd_hda_intel pre: vfio-pci\n",
    BLACKLIST: "# Managed by proxmox-gpu-cluster: every NVIDIA GPU of this node is passed through, host drivers must "
    "not load\nblacklist nouveau\nblacklist nvidia\nblacklist nvidiafb\nblacklist nvidia_drm\n",
    "etc/modules-load.d/vfio.conf": "# Managed by proxmox-gpu-cluster\nvfio\nvfio_iommu_type1\nvfio_pci\n",
    "etc/default/grub": GRUB.replace("quiet iommu=soft", "quiet iommu=pt"),
}


def test_one_owner_writes_what_the_previous_version_wrote_and_migrates_without_a_change(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "root")
    assert host.prep(A100, A10, pt=True).returncode == 0 and host.reboot_if_scheduled()
    assert {f: host.read(f) for f in PREVIOUS} == PREVIOUS  # one owner: its own order, byte for byte
    quiet(host, A100, A10, owner=OWNER, pt=True)  # settled (the reboot's record cleared)
    # A node the previous version prepared: the same files and bookkeeping, no drop-in directory. The first run
    # with an owner records its claim and changes nothing else: no initramfs or boot loader refresh, no reboot.
    claim = host.read(f"{CLAIMS}/{OWNER}.conf")
    shutil.rmtree(host.root / "etc/proxmox-gpu-cluster")
    before = host.state()
    r = host.prep(A100, A10, pt=True)
    assert (r.returncode, mutating(r.calls)) == (0, []), r.stderr
    assert r.stdout == f"changed: /{CLAIMS}/{OWNER}.conf\nreboot: not-needed\n"
    files = host.state()["files"]
    assert isinstance(files, dict) and files.pop(f"{CLAIMS}/{OWNER}.conf") == claim
    assert {k: v for k, v in files.items() if not k.startswith("run/lock/")} == {
        k: v
        for k, v in before["files"].items()  # type: ignore[union-attr]
        if not k.startswith("run/lock/")
    }
    assert claim == (
        f"# proxmox-gpu-cluster host prep: what owner {OWNER} passes through on this node (data: see host_prep.sh)\n"
        "gpu 0000:81:00=10de:20f1\ngpu 0000:41:00=10de:2236\niommu-pt 1\nacs-override 0\n"
    )
