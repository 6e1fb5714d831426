"""Offline-plan scale benchmark: wall time and peak memory for 1, 10, 100 and 1000 workers.

Each size runs in a fresh interpreter (so peak RSS is that plan's alone) and goes through the same path as
``make plan``: validate the spec, run ``__main__`` under the mock engine, build the capacity table, render JSON.

    python benchmarks/plan_scale.py              # all sizes
    python benchmarks/plan_scale.py --sizes 1 100
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
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

    document = {"config": {"proxmox-gpu-cluster:cluster": make_spec(workers)}}
    start = time.perf_counter()
    recording, capacity = plan("bench", document, ROOT / "__main__.py")
    rendered = json.dumps(plan_document("bench", recording, capacity))
    seconds = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"workers": workers, "resources": len(recording.resources), "seconds": round(seconds, 3),
            "peak_mib": round(peak_mib, 1), "json_kib": round(len(rendered) / 1024, 1)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure_one(args.one)))
        return 0
    print(f"{'workers':>8} {'resources':>10} {'seconds':>9} {'peak MiB':>9} {'s/worker':>9}")
    for size in args.sizes:
        proc = subprocess.run(
            [sys.executable, __file__, "--one", str(size)], capture_output=True, text=True, check=True, cwd=ROOT
        )
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        per = row["seconds"] / size
        print(f"{size:>8} {row['resources']:>10} {row['seconds']:>9.3f} {row['peak_mib']:>9.1f} {per:>9.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
