"""Offline-plan scale benchmark: wall time, CPU time and peak memory for 1, 10, 100 and 1000 workers, against a
fair floor: the same cluster written by hand as a competent Pulumi user would (``benchmarks/fair_floor``).

Each size runs in a fresh interpreter (so peak RSS is that plan's alone) and goes through the same path as
``make plan``: validate the spec, run ``__main__`` under the mock engine, build the capacity table, render JSON.
The fair floor runs the hand-written program for the same spec under the same mocks, also in a fresh interpreter
(typed ``*Args``, the same providers, components, options, secret Outputs and Output wiring; a test keeps its
resources and dependency edges equal to the plan's); the ratio says how much the project adds on top of what a
well-written Pulumi program costs for that graph. Each figure is the minimum of ``--repeat`` runs (2 shared cores
are noisy). The "replay floor" is the former floor, kept as a column for reference: the recorded plan registered
again through bare resource classes (no typed Args, no providers, secrets as the literal "[secret]", no Outputs
or options), about 1.8x cheaper than any real program, so no program can come near it.

    python benchmarks/plan_scale.py              # all sizes
    python benchmarks/plan_scale.py --sizes 1 100 --repeat 3
"""

from __future__ import annotations

import argparse
import contextlib
import io
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
WARM_UP = 35
"""Resources the floor registers untimed first, about a one-worker plan's (which the plan measurement runs first)."""
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
            address = f"10.{n // 250}.{n % 250}.1"
            nodes.append({"name": f"pve{n}", "sshAddress": address, "cpuVendor": "amd", "hostPrep": True, "gpus": []})
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
    """Plan one generated stack in this process exactly as ``python -m proxmox_gpu_cluster.plan bench --config
    FILE --json`` does (``main``), printing into memory; returns the figures and keeps the resources for the
    floor."""
    sys.path.insert(0, str(ROOT))
    import proxmox_gpu_cluster.stacks.plan.run as cli  # noqa: PLC0415 (import time is part of the measurement)
    from proxmox_gpu_cluster.testing import unwrap  # noqa: PLC0415

    recordings: list[Any] = []
    plan = cli.plan

    def keep(*args: Any, **kwargs: Any) -> Any:  # the recording main() plans, for the state size below
        result = plan(*args, **kwargs)
        recordings.append(result[0])
        return result

    cli.plan = keep  # type: ignore[assignment]
    main = cli.main

    with tempfile.TemporaryDirectory() as tmp:
        # A one-worker plan first, untimed: it imports the providers' SDKs and the modules the program uses (the
        # floor imports no provider; both warm up the same way).
        for size in (1, workers):
            stack_file = Path(tmp) / f"Pulumi.bench-{size}.yaml"
            stack_file.write_text(json.dumps({"config": {"proxmox-gpu-cluster:cluster": make_spec(size)}}))
            out = io.StringIO()
            start, cpu = time.perf_counter(), time.process_time()
            with contextlib.redirect_stdout(out):
                code = main(["bench", "--config", str(stack_file), "--json", "--placeholder-secrets"])
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
            assert code == 0, f"the plan failed with exit code {code}"
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rendered = out.getvalue()
    resources = json.loads(rendered)["resources"]
    components = {r["parent"] for r in resources}
    replay = [
        {"type": r["type"], "name": r["name"], "urn": r["urn"], "parent": r["parent"], "inputs": r["inputs"],
         "component": r["urn"] in components and not r["type"].startswith("pulumi:providers:"),
         "dependencies": r["dependencies"]}
        for r in resources if r["type"] != "pulumi:pulumi:Stack"
    ]  # fmt: skip
    REPLAY.write_text(json.dumps(replay))
    return {"workers": workers, "resources": len(resources), "seconds": round(seconds, 3),
            "cpu_seconds": round(cpu_seconds, 3), "peak_mib": round(peak_mib, 1),
            "json_kib": round(len(rendered) / 1024, 1),
            "inputs_kib": worker_inputs_kib([{"name": r.name, "inputs": unwrap(r.inputs)}
                                             for r in recordings[-1].resources], workers)}  # fmt: skip


def worker_inputs_kib(resources: list[dict[str, Any]], workers: int) -> float:
    """The largest total, over workers, of the JSON of the inputs of that worker's own resources (named
    ``cluster-w<i>-...``), secrets counted at their plain size: what one worker adds to the stack's state."""
    sizes: dict[str, int] = {}
    for r in resources:
        worker = r["name"].split("-")[1] if r["name"].startswith("cluster-w") else ""
        if worker:
            sizes[worker] = sizes.get(worker, 0) + len(json.dumps(r["inputs"]))
    assert len(sizes) == workers, f"expected {workers} workers' resources, found {len(sizes)}"
    return round(max(sizes.values()) / 1024, 1)


def registration_order(recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Parents and dependencies before what needs them (the plan lists resources as a tree)."""
    by_urn = {r["urn"]: r for r in recorded}
    done: set[str] = set()
    ordered: list[dict[str, Any]] = []
    for first in recorded:
        todo = [first]
        while todo:
            r = todo[-1]
            if r["urn"] in done:
                todo.pop()
                continue
            waiting = [by_urn[u] for u in [r["parent"], *r["dependencies"]] if u in by_urn and u not in done]
            if waiting:
                todo.extend(waiting)
                continue
            done.add(r["urn"])
            ordered.append(todo.pop())
    return ordered


def measure_floor(replay: Path) -> dict[str, Any]:
    """The replay floor: register the recorded resources again (same types, names, parents, inputs and
    dependencies) through bare resource classes under the same recording mocks."""
    import pulumi  # noqa: PLC0415 (import time is part of the measurement, as above)

    from proxmox_gpu_cluster.testing import RecordingMocks, run  # noqa: PLC0415

    recorded = registration_order(json.loads(replay.read_text()))

    def register(resources: list[dict[str, Any]]) -> None:
        made: dict[str, pulumi.Resource] = {}
        for r in resources:
            deps = [made[urn] for urn in r["dependencies"] if urn in made]
            opts = pulumi.ResourceOptions(parent=made.get(r["parent"]), depends_on=deps)
            if r["component"]:
                made[r["urn"]] = pulumi.ComponentResource(r["type"], r["name"], None, opts)
            else:
                made[r["urn"]] = pulumi.CustomResource(r["type"], r["name"], r["inputs"], opts)

    warm_up = recorded[:WARM_UP]
    run(lambda: register(warm_up), project="bench", stack="warm-up", mocks=RecordingMocks())
    start, cpu = time.perf_counter(), time.process_time()
    run(lambda: register(recorded), project="bench", stack="bench", mocks=RecordingMocks())
    return {"seconds": round(time.perf_counter() - start, 3), "cpu_seconds": round(time.process_time() - cpu, 3)}


def measure_fair_floor(workers: int) -> dict[str, Any]:
    """The fair floor (``benchmarks/fair_floor``) for the same spec, after a one-worker run that imports the
    providers' SDKs as the plan measurement's does; the mocks (``get_pci`` answers) are built before the clock
    starts, the program's own work (reading its config, registering, exporting) is timed."""
    from fair_floor import program  # noqa: PLC0415 (benchmarks/ is this script's directory)
    from fair_floor.cluster import floor_config  # noqa: PLC0415

    from proxmox_gpu_cluster.core.spec import load_spec  # noqa: PLC0415
    from proxmox_gpu_cluster.testing import RecordingMocks, run  # noqa: PLC0415
    from proxmox_gpu_cluster.testing_pci import pci_invokes  # noqa: PLC0415

    for size in (1, workers):
        spec = make_spec(size)
        config, secret_keys = floor_config(spec)
        mocks = RecordingMocks(invokes=pci_invokes(load_spec(spec)))
        start, cpu = time.perf_counter(), time.process_time()
        run(program, project="proxmox-gpu-cluster", stack="bench", config=config, secret_keys=secret_keys, mocks=mocks)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    return {"seconds": round(seconds, 3), "cpu_seconds": round(cpu_seconds, 3)}


def _child(flag: str, value: object) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, flag, str(value)], capture_output=True, text=True, check=True, cwd=ROOT
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _best(flag: str, value: object, repeat: int) -> dict[str, Any]:
    """The run with the least CPU time of ``repeat`` fresh interpreters (the least disturbed by other load)."""
    return min((_child(flag, value) for _ in range(repeat)), key=lambda r: float(r["cpu_seconds"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 100, 1000])
    parser.add_argument("--repeat", type=int, default=2, help="runs per figure; the least CPU time counts")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--floor", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--fair-floor", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure_one(args.one)))
        return 0
    if args.floor is not None:
        print(json.dumps(measure_floor(args.floor)))
        return 0
    if args.fair_floor is not None:
        print(json.dumps(measure_fair_floor(args.fair_floor)))
        return 0
    header = ("workers", "resources", "seconds", "cpu s", "fair floor s", "fair cpu s", "ratio", "cpu ratio",
              "replay floor s", "replay ratio", "peak MiB", "plan JSON KiB/worker", "inputs KiB/worker")  # fmt: skip
    print(" ".join(f"{h:>{max(len(h), 9)}}" for h in header))
    for size in args.sizes:
        row = _best("--one", size, args.repeat)
        floor = _best("--fair-floor", size, args.repeat)
        replay = _child("--floor", REPLAY)  # the resources of the last --one run (this size)
        ratios = (row["seconds"] / floor["seconds"], row["cpu_seconds"] / floor["cpu_seconds"])
        cells = (size, row["resources"], row["seconds"], row["cpu_seconds"], floor["seconds"], floor["cpu_seconds"],
                 *ratios, replay["seconds"], row["seconds"] / replay["seconds"], row["peak_mib"],
                 row["json_kib"] / size, row["inputs_kib"])  # fmt: skip
        print(
            " ".join(
                f"{c:>{max(len(h), 9)}.{0 if isinstance(c, int) else 2}f}" for c, h in zip(cells, header, strict=True)
            ),
            flush=True,
        )
    # What a worker of the repository's own stacks puts into state, secrets at plain and at realistic sizes.
    print()
    sys.stdout.flush()
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "state_size.py"), "--top", "0"], check=True, cwd=ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
