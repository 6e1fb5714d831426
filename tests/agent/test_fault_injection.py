"""Fault injection for the steps whose logic is the agent's cluster.py: the MIG rollout (begin, the label patch that
mig-manager acts on, end) and the retirement drain. For each injection point (every stubbed command the chain runs,
kubectl included) and each mode (fail; SIGKILL of the whole run before, or after, the command), the chain runs with
the fault, then again as the next ``pulumi up`` would (the failed step and those after it); the cluster must end as
an uninterrupted run leaves it, and a third run must change nothing. The assertion message counts the points and
the converged cases per chain. Both act as the node itself (kubelet's kubeconfig), with nothing on stdin."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from proxmox_gpu_cluster.core.spec import DrainSpec
from proxmox_gpu_cluster.render.guest_scripts import drain_args
from tests.agent.agent import ENDPOINT, held
from tests.components.scripts.fakeguest import FakeGuest
from tests.components.scripts.fakekube import FakeCluster, Pod, kubelet_conf
from tests.components.scripts.fakeroot import FAULT_MODES, Result
from tests.components.scripts.test_mig_rollout import KUBECONFIG, NEW, NODE, OLD, phase

MUTATING = (" cordon ", " uncordon ", " annotate ", " create ", " replace ", " delete ")  # create: slots, evictions
Chain = Callable[[FakeGuest, FakeCluster, list[str]], list[str]]


def setup(tmp: Path) -> tuple[FakeGuest, FakeCluster]:
    tmp.mkdir(parents=True)
    cluster = FakeCluster(tmp / "api.json", KUBECONFIG, nodes=[NODE, "gpu-b"])
    cluster.pods = [Pod("ml", "train-0", NODE), Pod("ml", "serve-0", "gpu-b")]
    cluster.labels = {NODE: {"nvidia.com/mig.config": OLD, "nvidia.com/mig.config.state": "success"}}
    cluster.save()
    guest = FakeGuest(tmp / "guest")
    cluster.install(guest)
    guest.write("etc/kubernetes/kubelet.conf", kubelet_conf(NODE)).chmod(0o600)  # as kubeadm join leaves it
    guest.stub_script("sleep", "/bin/sleep 0.05")  # no exec: a kill-after fault needs the shell alive
    return guest, cluster


def mig_chain(guest: FakeGuest, cluster: FakeCluster, steps: list[str]) -> list[str]:
    for i, step in enumerate(steps):
        if phase(guest, step, timeout=2).returncode:
            return steps[i:]
        if step == "begin":  # the NodePatch changes the label; mig-manager repartitions and reports success
            cluster.set_labels(NODE, **{"nvidia.com/mig.config": NEW, "nvidia.com/mig.config.state": "success"})
    return []


def retire(guest: FakeGuest) -> Result:
    spec = DrainSpec.model_validate({"timeoutSeconds": 60})
    args = drain_args(NODE, ENDPOINT, spec, kubeadm_reset=True)
    return guest.run_bundle("drain", *args)


def retire_chain(guest: FakeGuest, cluster: FakeCluster, steps: list[str]) -> list[str]:
    return steps if steps and retire(guest).returncode else []


def end_state(guest: FakeGuest, cluster: FakeCluster) -> dict[str, Any]:
    state = cluster.state()
    keep = ("nodes", "cordoned", "annotations", "pods", "labels")
    return {
        **{k: state[k] for k in keep}, "held": held(cluster), "kubelet.conf": (guest.root / "etc/kubernetes/kubelet.conf").exists(),
        "left under /run": sorted(str(p.relative_to(guest.root)) for p in (guest.root / "run").rglob("*") if p.is_file()),
    }  # fmt: skip


def mutations(result: list[str]) -> list[str]:
    return [c for c in result if c.startswith("kubectl") and any(m in f"{c} " for m in MUTATING)]


def inject(tmp: Path, chain: Chain, steps: list[str], third: Callable[[FakeGuest], list[Result]]) -> str:
    guest, cluster = setup(tmp / "reference")
    assert chain(guest, cluster, steps) == []
    reference = end_state(guest, cluster)
    points, cases, converged, failures = 0, 0, 0, []
    for mode in FAULT_MODES:
        for at in range(1, 200):
            guest, cluster = setup(tmp / f"{mode}-{at}")
            guest.fault(at, mode)
            left = chain(guest, cluster, steps)
            hit = guest.fault_hit()
            guest.fault(None)
            if hit is None:
                points = max(points, at - 1)
                break
            cases += 1
            again = chain(guest, cluster, left)
            seen = end_state(guest, cluster)
            quiet = [
                m for r in third(guest) for m in ([f"exit {r.returncode}"] if r.returncode else mutations(r.calls))
            ]
            if again == [] and seen == reference and not quiet:
                converged += 1
            else:
                failures.append(f"{mode} at {at} ({hit}): left {again}, third run {quiet}, state {json.dumps(seen)}")
    report = f"{points} injection points x {len(FAULT_MODES)} modes: {converged}/{cases} converged"
    assert points > 0 and converged == cases, report + "\n" + "\n".join(failures[:5])
    return report


@pytest.mark.slow
def test_the_mig_rollout_converges_from_every_fault(tmp_path: Path) -> None:
    def third(guest: FakeGuest) -> list[Result]:
        return [phase(guest, "begin"), phase(guest, "end")]

    print("mig:", inject(tmp_path, mig_chain, ["begin", "end"], third))


@pytest.mark.slow
def test_the_retirement_drain_converges_from_every_fault(tmp_path: Path) -> None:
    print("retire:", inject(tmp_path, retire_chain, ["drain"], lambda guest: [retire(guest)]))
