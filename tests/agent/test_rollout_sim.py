"""Proof by simulation: six fake nodes roll a change at once through the real shell steps (guest_lib.sh,
guest_rollout.sh) and the agent against one fake API server, with random delays, steps failed or killed (SIGKILL of
the whole run) at random commands, and API requests failing at random. At no moment are more than maxUnavailable
nodes cordoned by a rollout (checked by the fake after every request); once the failed steps are run again as the
next ``pulumi up`` would (the failed step and those after it), every node has the change, none is cordoned, every
slot is free and nothing is left under /run but the machine's lock. Every node acts as itself (its kubelet's
kubeconfig; no credential in the step). Also one node's step run twice at once."""

from __future__ import annotations

import concurrent.futures
import random
from pathlib import Path

import pytest

from proxmox_gpu_cluster.render.host_scripts import script
from tests.agent.agent import ENDPOINT, KUBECONFIG, held
from tests.components.scripts.fakekube import SLOT_NAMESPACE, FakeCluster, kubelet_conf
from tests.components.scripts.fakeroot import FakeRoot, Result

NODES = [f"gpu-{i}" for i in range(6)]
MAX_UNAVAILABLE = 2
# The two steps of a rolling change, reduced to their rollout calls: "change" takes a slot, cordons, drains and
# changes the machine (the `apply-change` stub); "verify" checks it (`node-check`, which fails while the node is
# broken), then uncordons and gives the slot back.
BODY = """STEP={step}
while (($#)); do
  rollout_arg "$1" "$2" || die "unknown argument $1"
  shift 2
done
rollout_check_args
main() {{
  guest_begin
  if rollout_joined; then
{work}
  fi
}}
main "$@" </dev/null
"""
WORK = {
    "change": '    rollout_begin "sim change"\n    apply-change',
    "verify": "    rollout_resume\n    node-check\n    rollout_end",
}


def step_text(step: str) -> str:
    body = BODY.format(step=step, work=WORK[step])
    return script("guest_lib.sh") + "\n" + script("guest_rollout.sh") + "\n" + body


def rollout_args(node: str) -> list[str]:
    return ["--rollout", "1", "--rollout-node", node, "--rollout-api", ENDPOINT, "--rollout-namespace", SLOT_NAMESPACE,
            "--rollout-max-unavailable", str(MAX_UNAVAILABLE), "--rollout-wait-seconds", "150",
            "--rollout-drain-timeout", "60"]  # fmt: skip


def machine(tmp_path: Path, fake: FakeCluster, node: str, rng: random.Random) -> FakeRoot:
    root = FakeRoot(tmp_path / node)
    fake.install(root)
    root.write("etc/kubernetes/kubelet.conf", kubelet_conf(node)).chmod(0o600)  # joined as ``node``
    root.stub_script("sleep", f"exec /bin/sleep 0.0{rng.randint(1, 9)}")  # the slot poll, shortened and jittered
    root.stub_script("apply-change", f'/bin/sleep 0.{rng.randint(0, 3)}; echo done > "$PGC_ROOT/changed"')
    root.stub_script("node-check", '[ ! -e "$PGC_ROOT/broken" ] || { echo "node-check: GPU missing" >&2; exit 1; }')
    return root


def chain(root: FakeRoot, node: str, steps: list[str]) -> list[str]:
    """Run ``steps`` in order, stopping at the first that fails; the steps still to run (the failed one first)."""
    for i, step in enumerate(steps):
        result: Result = root.run_stdin(step_text(step), *rollout_args(node))
        if result.returncode:
            return steps[i:]
    return []


@pytest.mark.slow
def test_six_nodes_with_faults_never_exceed_max_unavailable_and_end_with_every_slot_free(tmp_path: Path) -> None:
    rng = random.Random(23)
    fake = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=NODES)
    fake.save()
    roots = {n: machine(tmp_path, fake, n, rng) for n in NODES}
    roots[NODES[1]].write("broken", "")  # its verify fails: it stays cordoned and keeps its slot until fixed
    faults = {n: (rng.randint(1, 12), rng.choice(["fail", "kill", "kill-after"])) for n in NODES[2:]}
    for node, (at, mode) in faults.items():
        roots[node].fault(at, mode)
    fake.flaky(0.03, seed=23)
    todo = {n: ["change", "verify"] for n in NODES}
    rounds, hit = [], {}
    for _ in range(6):
        runs = [(roots[n], n, steps) for n, steps in todo.items()]
        with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
            left = dict(zip(todo, pool.map(lambda run: chain(*run), runs), strict=True))
        rounds.append({n: steps for n, steps in left.items() if steps})
        todo = rounds[-1]
        if not todo:
            break
        # The next pulumi up: the faults are gone, the broken node was fixed.
        hit = hit or {n: roots[n].fault_hit() for n in faults}
        fake.flaky(0.0)
        for root in roots.values():
            root.fault(None)
        (roots[NODES[1]].root / "broken").unlink(missing_ok=True)
    report = f"rounds left to run: {rounds}; faults: {faults}; hit: {hit}"
    assert not todo, report
    state = fake.state()
    assert state["peak"] <= MAX_UNAVAILABLE, report
    assert state["peak"] >= 1 and any(hit.values()) and NODES[1] in rounds[0], report  # it rolled, and failed
    assert held(fake) == {} and state["cordoned"] == [], report
    assert all(not a for a in state["annotations"].values()), report
    for node, root in roots.items():
        assert root.read("changed") == "done\n", node
        left = {str(p.relative_to(root.root)) for p in (root.root / "run").rglob("*") if p.is_file()}
        assert left <= {"run/lock/proxmox-gpu-cluster.lock"}, (node, left)
    assert set(fake.modes()) == {"0o600"}  # kubelet's kubeconfig, the only credential any step used


def test_one_nodes_step_run_twice_at_once(tmp_path: Path) -> None:
    fake = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=["gpu-0", "gpu-1"])
    fake.save()
    root = machine(tmp_path, fake, "gpu-0", random.Random(1))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: root.run_stdin(step_text("change"), *rollout_args("gpu-0")), range(2)))
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert list(held(fake).values()) == ["gpu-0"]  # one slot, whichever run took it
    verify = root.run_stdin(step_text("verify"), *rollout_args("gpu-0"))
    assert verify.returncode == 0, verify.stderr
    assert held(fake) == {} and fake.state()["cordoned"] == [] and fake.state()["peak"] == 1
