"""Host prep killed between ``chmod`` and ``mv`` of an atomic write (put_file: mktemp, write, chmod, sync, mv):
the temporary ``<file>.pgc-XXXXXX`` stays. The next run must remove it, whichever file it was for, also one no
later run writes again (a reboot record, a released owner's drop-in). The kill lands where the fault harness
(test_host_faults.py) cannot reach: ``sync`` of the temporary file is the one command between chmod and mv, so a
``sync`` stub that SIGKILLs the step's process group there (as a dropped SSH session would) places it exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.components.scripts.fakehost import A10, CLAIMS, OLD_KERNEL, FakeHost

# Kills the step at the n-th sync of a temporary file (the count in the fake root), syncs anything else.
KILL_AT_TEMP_SYNC = """case "$1" in *.pgc-??????)
  n=$(( $(cat "$PGC_ROOT/sync.count" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$PGC_ROOT/sync.count"
  [ "$n" = "$(cat "$PGC_ROOT/sync.kill-at")" ] && { echo "$1" > "$PGC_ROOT/sync.killed"; kill -KILL 0; } ;;
esac
/bin/sync "$@\""""


def leftovers(host: FakeHost) -> list[str]:
    return sorted(str(p.relative_to(host.root)) for p in host.root.rglob("*.pgc-*"))


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> FakeHost:
    """Intel on kernel 6.5: host prep writes every file it manages, its records, and schedules a reboot."""
    host = FakeHost(tmp_path_factory.mktemp("leftovers") / "template", cpu="intel", kernel=OLD_KERNEL)
    host.stub_script("sync", KILL_AT_TEMP_SYNC)
    return host


def temp_syncs(template: FakeHost, tmp_path: Path) -> int:
    """How many atomic writes an uninterrupted first run makes."""
    host = template.clone(tmp_path / "count")
    host.write("sync.kill-at", "0\n")
    assert host.prep(A10).returncode == 0
    return int(host.read("sync.count"))


@pytest.mark.slow
def test_every_temporary_file_a_kill_leaves_is_removed_by_the_next_run(template: FakeHost, tmp_path: Path) -> None:
    writes = temp_syncs(template, tmp_path)
    assert writes >= 7  # drop-in, grub, vfio.conf, modules-load.d, initramfs record, reboot marker and record
    killed: list[str] = []
    for n in range(1, writes + 1):
        host = template.clone(tmp_path / str(n))
        host.write("sync.kill-at", f"{n}\n")
        r = host.prep(A10)
        assert r.returncode == -9, (n, r.stderr)  # SIGKILL
        left = leftovers(host)
        assert left, f"kill #{n} left no temporary file"
        killed.append(host.read("sync.killed").strip())
        host.write("sync.kill-at", "0\n")
        r = host.prep(A10)
        assert r.returncode == 0, r.stderr
        host.reboot_if_scheduled()
        assert leftovers(host) == [], f"kill #{n} at {killed[-1]}: the next run left {left}"
    # The kills hit the step's own records too, not only the files host prep compares with what it wants.
    assert any("/var/lib/proxmox-gpu-cluster/" in k for k in killed) and any("/run/" in k for k in killed)


def test_a_released_owners_leftover_drop_in_is_removed(template: FakeHost, tmp_path: Path) -> None:
    # Owner "other" was killed while writing its drop-in, then released: nothing writes that file again.
    host = template.clone(tmp_path / "released")
    host.write("sync.kill-at", "0\n")
    host.write(f"{CLAIMS}/other.conf.pgc-a1B2c3", "# proxmox-gpu-cluster host prep: what owner other ...\n")
    assert host.release("other").returncode == 0
    assert leftovers(host) == []
    host.write(f"{CLAIMS}/other.conf.pgc-a1B2c3", "partial")
    host.write("var/lib/proxmox-gpu-cluster/reboot-scheduled.pgc-Zz9Yy8", "partial")
    assert host.prep(A10).returncode == 0
    assert leftovers(host) == []
    # Only the step's own temporary names: anything else in those directories stays.
    host.write("etc/default/grub.pgc-old", "not ours (not mktemp's six characters)")
    assert host.prep(A10).returncode == 0
    assert leftovers(host) == ["etc/default/grub.pgc-old"]
