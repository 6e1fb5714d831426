"""Offline-plan scale benchmark: wall time, CPU time and peak memory for 1, 10, 100 and 1000 workers, against
the Pulumi SDK's own floor.

Each size runs in a fresh interpreter (so peak RSS is that plan's alone) and goes through the same path as
``make plan``: validate the spec, run ``__main__`` under the mock engine, build the capacity table, render JSON.
The floor is a minimal program that registers the same number of resources under the same mocks, also in a fresh
interpreter; the ratio says how much the project adds on top of what the SDK itself costs.

    python benchmarks/plan_scale.py              # all sizes
    python benchmarks/plan_scale.py --sizes 1 100
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPLAY = Path(tempfile.gettempdir()) / "pgc-bench-replay.json"
"""The last plan's resources, for the floor measurement to register again."""
GPUS_PER_NODE = 8
PATTERNS: list[dict[str, Any]] = [
    {"model": "A10", "worker": {"sharing": "time-slicing", "timeSlicing": {"replicas": 4}}},
    {"model": "A100-PCIE-40GB", "worker": {"sharing": "mig", "mig": "all-1g.5gb"}},
    {"model": "L4", "worker": {}},
    {"model": "A100-PCIE-80GB", "worker": {"sharing": "mig", "mig": {"3g.40gb": 1, "4g.40gb": 1}}},
]


def make_spec(workers: int) -> dict[str, Any]:
    """A valid spec with ``workers`` one-GPU workers spread over as many 8-GPU Proxmox nodes as needed."""
    nodes: list[dict[str, Any]] = []
    spec_workers: list[dict[str, Any]] = []
    for i in range(workers):
        n, slot = divmod(i, GPUS_PER_NODE)
        if slot == 0:
            nodes.append(
                {"name": f"pve{n}", "sshAddress": f"10.{n // 250}.{n % 250}.1", "cpuVendor": "amd", "gpus": []}
            )
        pattern = PATTERNS[i % len(PATTERNS)]
        nodes[-1]["gpus"].append(
            {"name": f"gpu{slot}", "pciPath": f"0000:{0x41 + slot:02x}:00", "model": pattern["model"]}
        )
        spec_workers.append(
            {"name": f"w{i}", "vmid": 1000 + i, "node": f"pve{n}", "gpus": [f"gpu{slot}"], **pattern["worker"]}
        )
    return {
        "proxmox": {"endpoint": "https://pve.example.test:8006/", "nodes": nodes},
        "workers": spec_workers,
        "kubernetes": {"apiEndpoint": "k8s.example.test:6443", "version": "1.34"},
        "guest": {
            "sshPublicKeys": [
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBxYhxkAFq8yGtzKQpNLT3ZN0r6Jw1c0Kf3z8lL0Q1u1 ops@example"
            ]
        },
        "gpuOperator": {"migStrategy": "mixed"},
    }


def measure_one(workers: int) -> dict[str, Any]:
    """Plan one generated stack in this process; returns the figures."""
    sys.path.insert(0, str(ROOT))
    from proxmox_gpu_cluster.stacks.plan import plan, plan_document  # noqa: PLC0415 (import time is part of the measurement)
    from proxmox_gpu_cluster.testing import redact  # noqa: PLC0415

    document = {"config": {"proxmox-gpu-cluster:cluster": make_spec(workers)}}
    start, cpu = time.perf_counter(), time.process_time()
    recording, capacity = plan("bench", document, ROOT / "__main__.py")
    rendered = json.dumps(plan_document("bench", recording, capacity))
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    components = {r.urn for r in recording.resources if any(c.parent == r.urn for c in recording.resources)}
    replay = [
        {"type": r.type, "name": r.name, "urn": r.urn, "parent": r.parent, "component": r.urn in components and not
         r.type.startswith("pulumi:providers:"), "inputs": redact(r.inputs)}
        for r in recording.resources if r.type != "pulumi:pulumi:Stack"
    ]  # fmt: skip
    REPLAY.write_text(json.dumps(replay))
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"workers": workers, "resources": len(recording.resources), "seconds": round(seconds, 3),
            "cpu_seconds": round(cpu_seconds, 3), "peak_mib": round(peak_mib, 1),
            "json_kib": round(len(rendered) / 1024, 1)}  # fmt: skip


def measure_floor(replay: Path) -> dict[str, Any]:
    """Register the recorded resources again (same types, names, parents and inputs) from a minimal program under
    the same recording mocks: what the SDK itself costs for this plan, without any of the project's code."""
    import pulumi  # noqa: PLC0415 (import time is part of the measurement, as above)

    from proxmox_gpu_cluster.testing import RecordingMocks, run  # noqa: PLC0415

    recorded = json.loads(replay.read_text())

    def program() -> None:
        made: dict[str, pulumi.Resource] = {}
        for r in recorded:
            opts = pulumi.ResourceOptions(parent=made.get(r["parent"]))
            if r["component"]:
                made[r["urn"]] = pulumi.ComponentResource(r["type"], r["name"], None, opts)
            else:
                made[r["urn"]] = pulumi.CustomResource(r["type"], r["name"], r["inputs"], opts)

    start, cpu = time.perf_counter(), time.process_time()
    run(program, project="bench", stack="bench", mocks=RecordingMocks())
    return {"seconds": round(time.perf_counter() - start, 3), "cpu_seconds": round(time.process_time() - cpu, 3)}


def _child(flag: str, value: object) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, flag, str(value)], capture_output=True, text=True, check=True, cwd=ROOT
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--floor", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure_one(args.one)))
        return 0
    if args.floor is not None:
        print(json.dumps(measure_floor(args.floor)))
        return 0
    header = ("workers", "resources", "seconds", "cpu s", "floor s", "ratio", "peak MiB", "JSON KiB/worker")
    print(" ".join(f"{h:>{max(len(h), 9)}}" for h in header))
    for size in args.sizes:
        row = _child("--one", size)
        floor = _child("--floor", REPLAY)
        cells = (size, row["resources"], row["seconds"], row["cpu_seconds"], floor["seconds"],
                 row["seconds"] / floor["seconds"], row["peak_mib"], row["json_kib"] / size)  # fmt: skip
        print(
            " ".join(
                f"{c:>{max(len(h), 9)}.{0 if isinstance(c, int) else 2}f}" for c, h in zip(cells, header, strict=True)
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
