"""The change matrix run in the fake world (issue 31, section 3; a first slice: the fields that reach the guests'
bootstrap steps). A cluster of three time-sliced A10 workers is planned by the real program under the mock engine,
old and new; the guest steps' commands are taken from the two plans as registered (not rebuilt here) and run in the
fake world as ``pulumi up`` runs them: first every step of the old plan on fresh guests (the first up), then, as the
engine would, only the steps whose command changed, each worker's in dependency order and the three workers at
once (the second up), with one fake API server behind them. Asserted: the steps succeed; the end state is the new
spec's; at no point of the API server's event log are more than ``maxUnavailable`` nodes cordoned; the nodes that
were cordoned are exactly those the plan's diff says it drains; and every step run once more changes nothing and
reboots nothing."""

from __future__ import annotations

import copy
import shlex
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from proxmox_gpu_cluster.core.capacity import capacity_table
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.stacks.plan import plan_document
from proxmox_gpu_cluster.stacks.plan.diff import cluster_prefix, diff
from proxmox_gpu_cluster.stacks.plan.report import summary
from proxmox_gpu_cluster.testing import Recording
from tests.components.scripts.fakeguest import FakeGuest, mutating
from tests.components.scripts.fakekube import FakeCluster, Pod
from tests.components.scripts.test_guest_fault_injection import SECRETS
from tests.components.scripts.test_rollout import KUBECONFIG
from tests.stacks.test_critical_path import only_a10_workers
from tests.support import plan_stack

pytestmark = pytest.mark.slow

GUEST_STEPS = ("cloud-init", "driver", "runtime", "join", "verify")
"""The bootstrap steps that run on the guest, in their dependency order (GuestBootstrap)."""
OLD_DRIVER, NEW_DRIVER = "580.95.05", "580.105.08"


def base() -> dict[str, Any]:
    spec = only_a10_workers(3)
    spec["gpuOperator"]["driverVersion"] = OLD_DRIVER
    spec["kubernetes"]["drain"] = {"maxUnavailable": 1, "timeoutSeconds": 60}
    return spec


def steps(rec: Recording, worker: str) -> list[tuple[str, list[str]]]:
    """The worker's guest steps as the plan registered them: (bundle step, arguments) from each command."""
    out = []
    for step in GUEST_STEPS:
        words = shlex.split(rec.named(f"cluster-{worker}-bootstrap-{step}").plain_inputs["create"])
        at = next(i for i, w in enumerate(words) if w.endswith("/step.sh"))
        assert words[at].split("/")[-2].rsplit("-", 1)[0] == step, words[at]
        out.append((step, words[at + 1 :]))
    return out


class World:
    """One fake guest per worker, all joined to one fake API server, each worker running a pod."""

    def __init__(self, root: Path, spec: dict[str, Any]) -> None:
        workers = load_spec(spec).workers
        self.cluster = FakeCluster(root / "api.json", KUBECONFIG, nodes=[w.name for w in workers])
        self.cluster.pods = [Pod("ml", f"train-{w.name}", w.name) for w in workers]
        self.cluster.save()
        self.guests = {w.name: FakeGuest(root / w.name) for w in workers}
        for w in workers:
            guest = self.guests[w.name]
            self.cluster.install(guest)
            # Slot waits and drain polls: short, but real, as the other workers' steps take real time meanwhile.
            guest.stub_script("sleep", "exec /bin/sleep 0.05")
            # The VM's hardware as Proxmox creates it from the spec (the kernel keeps about 3% of the RAM).
            guest.write("proc/cpuinfo", "".join(f"processor\t: {i}\n\n" for i in range(w.cores)))
            guest.write("proc/meminfo", f"MemTotal: {w.memory_mib * 1024 * 97 // 100} kB\n")

    def run(self, worker: str, chain: list[tuple[str, list[str]]]) -> list[str]:
        """Run the steps in order (rebooting where one scheduled it); every call they made."""
        guest, calls = self.guests[worker], []
        for step, args in chain:
            r = guest.step(step, *args, secrets=SECRETS if step == "join" else None)
            assert r.returncode == 0, f"{worker} {step}: {r.stderr.strip()[-800:]}"
            calls += [*r.calls, *(["reboot"] if guest.reboot_scheduled() else [])]
            if guest.reboot_scheduled():
                guest.reboot()
        return calls

    def up(self, chains: dict[str, list[tuple[str, list[str]]]]) -> dict[str, list[str]]:
        """Every worker's chain at once, as the engine runs independent resources."""
        with ThreadPoolExecutor(len(chains)) as pool:
            futures = {w: pool.submit(self.run, w, chain) for w, chain in chains.items()}
        failed = [str(f.exception()) for f in futures.values() if f.exception() is not None]
        assert not failed, "\n".join(failed)
        return {w: f.result() for w, f in futures.items()}

    def cordons(self, since: int) -> tuple[set[str], int]:
        """Nodes cordoned after event ``since``, and the most cordoned at once over the whole log."""
        cordoned: set[str] = set()
        most, nodes = 0, set()
        for i, (_, what, node) in enumerate(self.cluster.state()["events"]):
            cordoned = cordoned | {node} if what == "cordon" else cordoned - {node} if what == "uncordon" else cordoned
            most = max(most, len(cordoned))
            if what == "cordon" and i >= since:
                nodes.add(node)
        return nodes, most


def drained_by_the_diff(old: dict[str, Any], new: dict[str, Any], old_rec: Recording, new_rec: Recording) -> set[str]:
    before = plan_document("t", old_rec, capacity_table(load_spec(old)), load_spec(old))
    after = plan_document("t", new_rec, capacity_table(load_spec(new)), load_spec(new))
    limit = new["kubernetes"]["drain"]["maxUnavailable"]
    report = summary(diff(before, after), limit, cluster_prefix(after), before=before, after=after)
    return set(report["nodesRolled"])


Edit = Callable[[dict[str, Any]], object]
Check = Callable[[FakeGuest], object]


def driver_is(version: str) -> Check:
    return lambda g: g.installed("nvidia-headless-580-server-open").startswith(version)  # type: ignore[union-attr]


def toolkit_is(version: str) -> Check:
    return lambda g: g.installed("nvidia-container-toolkit") == version


CASES: dict[str, tuple[Edit, Check]] = {
    "gpuOperator.driverVersion up": (
        lambda s: s["gpuOperator"].update(driverVersion=NEW_DRIVER), driver_is(NEW_DRIVER)
    ),
    "gpuOperator.driverVersion unpinned": (
        lambda s: s["gpuOperator"].pop("driverVersion"), driver_is(OLD_DRIVER)  # the branch pin keeps what runs
    ),
    "gpuOperator.kernelModuleType proprietary": (
        lambda s: s["gpuOperator"].update(kernelModuleType="proprietary"),
        lambda g: g.installed("nvidia-headless-580-server") and not g.installed("nvidia-headless-580-server-open"),
    ),
    "guest.toolkitVersion down": (
        lambda s: s["guest"].update(toolkitVersion="1.18.1-1"), toolkit_is("1.18.1-1")
    ),
    "kubernetes.drain.timeoutSeconds": (
        lambda s: s["kubernetes"]["drain"].update(timeoutSeconds=120), driver_is(OLD_DRIVER)
    ),
    "kubernetes.drain.maxUnavailable": (
        lambda s: s["kubernetes"]["drain"].update(maxUnavailable=2), driver_is(OLD_DRIVER)
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_change_runs_in_the_fake_world_as_the_diff_says(case: str, tmp_path: Path) -> None:
    edit, check = CASES[case]
    old = base()
    new = copy.deepcopy(old)
    edit(new)
    old_rec, new_rec = plan_stack(copy.deepcopy(old)), plan_stack(copy.deepcopy(new))
    workers = [w["name"] for w in old["workers"]]
    world = World(tmp_path, old)
    world.up({w: steps(old_rec, w) for w in workers})  # the first pulumi up
    first_events = len(world.cluster.state()["events"])
    assert world.cordons(0) == (set(), 0)  # a first provisioning drains nothing
    # The second pulumi up: a step runs again exactly when its command changed.
    changed = {
        w: [new for old_step, new in zip(steps(old_rec, w), steps(new_rec, w), strict=True) if old_step != new]
        for w in workers
    }
    assert any(changed.values()), "the edit reached no guest step"
    world.up(changed)
    cordoned, most = world.cordons(first_events)
    limit = new["kubernetes"]["drain"]["maxUnavailable"]
    assert most <= limit, f"{most} nodes cordoned at once (maxUnavailable {limit})"
    assert cordoned == drained_by_the_diff(old, new, old_rec, new_rec)
    state = world.cluster.state()
    assert state["cordoned"] == [] and not any(a for a in state["annotations"].values())
    assert not [cm for cm in state["configmaps"].values() if cm.get("data", {}).get("holder")]
    for w in workers:
        assert check(world.guests[w]), f"{w}: not in the new spec's state"
    # A further run of every step changes nothing and reboots nothing.
    again = world.up({w: steps(new_rec, w) for w in workers})
    assert {w: mutating(calls) for w, calls in again.items()} == {w: [] for w in workers}
    assert len(world.cluster.state()["events"]) == len(state["events"])
