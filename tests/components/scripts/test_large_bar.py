"""large_bar.sh with a stateful fake `qm`: sets the OVMF MMIO window once, restarts a running VM once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.components.scripts.fakeroot import FakeRoot

QM = """
state="$PGC_ROOT/vm-args"
case "$1" in
config) echo "boot: order=scsi0"; if [ -f "$state" ]; then echo "args: $(cat "$state")"; fi ;;
set) printf '%s' "$4" > "$state" ;;
status) echo "status: running" ;;
esac
"""


@pytest.fixture
def host(tmp_path: Path) -> FakeRoot:
    h = FakeRoot(tmp_path / "root")
    h.stub_script("qm", QM)
    h.stub("id", "0")
    return h


def test_sets_args_and_restarts_once(host: FakeRoot) -> None:
    first = host.run("large_bar.sh", "2102", "65536")
    assert first.returncode == 0, first.stderr
    assert first.stdout == "large-bar: set and restarted\n"
    assert host.read("vm-args") == "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=65536"
    assert [c for c in first.calls if not c.startswith(("qm config", "id"))] == [
        "qm set 2102 --args -fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=65536",
        "qm status 2102",
        "qm shutdown 2102 --timeout 180",
        "qm start 2102",
    ]
    second = host.run("large_bar.sh", "2102", "65536")
    assert second.returncode == 0 and second.stdout == "large-bar: unchanged\n"
    assert [c for c in second.calls if c.startswith("qm") and not c.startswith("qm config")] == []


def test_needs_root(host: FakeRoot) -> None:
    host.stub("id", "1000")
    r = host.run("large_bar.sh", "2102", "65536")
    assert r.returncode == 1 and "needs root" in r.stderr and "authMode: password" in r.stderr
