"""The critical-path benchmark: it walks the real program's graph, a precompiled module shortens the path by the
DKMS build exactly, and a weighted path picks the heaviest chain, not the longest."""

from __future__ import annotations

import re
import subprocess
import sys

from proxmox_gpu_cluster.recording import RecordedResource, Recording, critical_path
from tests.support import ROOT


def _resource(name: str, deps: tuple[str, ...] = ()) -> RecordedResource:
    return RecordedResource(
        type="command:remote:Command", name=name, urn=f"urn:{name}", parent="", custom=True, provider="",
        dependencies=[f"urn:{d}" for d in deps], property_dependencies={}, inputs={}, protect=False,
        ignore_changes=[], replace_on_changes=[], additional_secret_outputs=[], delete_before_replace=False,
        retain_on_delete=False,
    )  # fmt: skip


def test_a_weighted_path_is_the_heaviest_chain() -> None:
    recording = Recording()
    recording.resources += [_resource("a"), _resource("b", ("a",)), _resource("c", ("b",)), _resource("slow")]
    assert [r.name for r in critical_path(recording)] == ["a", "b", "c"]
    heavy = {"slow": 100.0}
    assert [r.name for r in critical_path(recording, lambda r: heavy.get(r.name, 1.0))] == ["slow"]


def test_the_benchmark_models_the_dkms_build_off_the_path() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "critical_path.py"), "--set", "dkms-build=300"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout  # fmt: skip
    totals = dict(re.findall(r"^(dkms|precompiled): (\d+) s", out, re.MULTILINE))
    assert int(totals["dkms"]) - int(totals["precompiled"]) == 300 - 10  # the build, less the module package
    for step in ("-vm", "-bootstrap-driver", "-bootstrap-join", "-gpu-operator-release", "-capacity-check"):
        assert re.search(rf"^\s+\d+ s  cluster\S*{step}$", out, re.MULTILINE), step
