"""Rolling driver bump simulation: N joined nodes (fake guests running the real driver and verify steps against
one fake API server that keeps the slots), all started at once as Pulumi would, for each maxUnavailable.

Prints, per maxUnavailable: the most nodes cordoned at once (must equal maxUnavailable; the fake API server checks
the nodes cordoned by a rollout after every request, and the cordon/uncordon events must agree), how many slot rounds
the roll took, the simulation's own wall time, and the modelled wall time of a real roll from assumed step
durations. Every slot must be free at the end.

    python benchmarks/rollout_sim.py                 # N = 10, maxUnavailable 1 and 3
    python benchmarks/rollout_sim.py --nodes 6 --max-unavailable 2
"""

from __future__ import annotations

import argparse
import concurrent.futures
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.components.scripts.fakekube import FakeCluster, Pod  # noqa: E402
from tests.components.scripts.test_rollout import KUBECONFIG, NEW, joined_guest, roll  # noqa: E402

ASSUMED = {"take slot": 1, "drain": 120, "driver install (apt + DKMS build)": 180, "reboot": 90, "verify": 20,
           "uncordon, release": 1}  # fmt: skip
"""Seconds per node step assumed for the modelled wall time (a drain with a graceful pod shutdown, a 580 driver
download and DKMS build on a small VM, a VM reboot with OVMF and cloud-init, the verify checks)."""


def simulate(nodes: int, max_unavailable: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        names = [f"gpu-{i}" for i in range(nodes)]
        cluster = FakeCluster(Path(tmp) / "api.json", KUBECONFIG, nodes=names)
        cluster.pods = [Pod("ml", f"job-{n}", n) for n in names]
        cluster.save()
        guests = {n: joined_guest(Path(tmp) / n, cluster, n) for n in names}
        for guest in guests.values():
            guest.stub_script("sleep", "exec /bin/sleep 0.2")  # the slot poll, shortened
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(nodes) as pool:
            results = list(pool.map(lambda n: roll(guests[n], n, NEW, max_unavailable), names))
        seconds = time.perf_counter() - start
        failed = [n for n, (d, v) in zip(names, results, strict=True) if d.returncode or v.returncode]
        if failed:
            raise SystemExit(f"nodes failed: {failed}")
        state = cluster.state()
        held = {name: slot["data"].get("holder") for name, slot in state["configmaps"].items()}
        if any(held.values()) or state["cordoned"]:
            raise SystemExit(f"left behind: slots {held}, cordoned {state['cordoned']}")
        out: set[str] = set()
        peak, events = 0, sorted(state["events"])
        for _, what, node in events:
            if what == "cordon":
                out.add(node)
            elif what == "uncordon":
                out.discard(node)
            peak = max(peak, len(out))
        if peak != state["peak"]:
            raise SystemExit(f"cordon/uncordon events say {peak} at once, the API server saw {state['peak']}")
        rounds = math.ceil(nodes / max_unavailable)
        return {"peak": peak, "rounds": rounds, "sim_seconds": seconds,
                "model_minutes": rounds * sum(ASSUMED.values()) / 60}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--max-unavailable", type=int, nargs="+", default=[1, 3])
    args = parser.parse_args()
    print(f"assumed per node: {ASSUMED} = {sum(ASSUMED.values())} s")
    header = ("nodes", 6), ("maxUnavailable", 15), ("max cordoned", 13), ("rounds = ceil(N/K)", 19), ("sim s", 7)
    print(" ".join(f"{h:>{w}}" for h, w in header), f"{'modelled min':>13}")
    for k in args.max_unavailable:
        r = simulate(args.nodes, k)
        print(f"{args.nodes:>6} {k:>15} {r['peak']:>13} {r['rounds']:>19} {r['sim_seconds']:>7.1f} "
              f"{r['model_minutes']:>13.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
