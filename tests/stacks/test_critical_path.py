"""The depth of a first ``pulumi up`` does not grow with the number of workers: workers never wait for each other,
so 4 workers (one of each shape) and 50 have the same critical path length; the plan prints it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proxmox_gpu_cluster.recording import critical_path
from proxmox_gpu_cluster.stacks.plan import plan, plan_document
from tests.support import ROOT, plan_scale


def make_spec(workers: int) -> dict[str, Any]:
    result: dict[str, Any] = plan_scale().make_spec(workers)
    return result


def depth(workers: int) -> tuple[int, list[str]]:
    document = {"config": {"proxmox-gpu-cluster:cluster": make_spec(workers)}}
    recording, capacity = plan("t", document, ROOT / "__main__.py", placeholder_secrets=True)
    names = plan_document("t", recording, capacity)["criticalPath"]
    assert names == [r.name for r in critical_path(recording)]
    return len(names), names


def test_first_up_depth_is_the_same_for_4_and_50_workers() -> None:
    four, chain = depth(4)
    fifty, _ = depth(50)
    assert four == fifty == 22
    # the node agent's copy to the host, host prep, the worker's own mapping and VM, its large-BAR step, the agent's copy to
    # the guest, its VM-restart step (a no-op on a first up: nothing pending), the bootstrap (with its join-token step and Secret
    # before the join), its MIG drain step (a no-op on
    # a first up), its labels, the operator, then a MIG worker's VM restart step (issue 24 part 3: a no-op on a first
    # up unless a MIG mode stays pending) and its MIG end step, which wait for the release: it brings a new custom
    # geometry's ConfigMap to mig-manager (in time the capacity gate, one step, takes longer: benchmarks/critical_path.py).
    assert chain[0].endswith("-host-prep-agent") and chain[1].endswith("-host-prep-prep")
    assert chain[-4].startswith("cluster-gpu-nodes-") and chain[-3] == "cluster-gpu-operator-release"
    assert chain[-2].endswith("-mig-restart") and chain[-1].endswith("-mig-end")


def test_the_plan_text_prints_it(tmp_path: Path) -> None:
    from proxmox_gpu_cluster.stacks.plan import render_text

    document = {"config": {"proxmox-gpu-cluster:cluster": make_spec(2)}}
    recording, capacity = plan("t", document, ROOT / "__main__.py", placeholder_secrets=True)
    text = render_text("t", recording, capacity)
    assert "Critical path of a first pulumi up (22 steps, one after the other):" in text


def only_a10_workers(count: int) -> dict[str, Any]:
    """``count`` A10 time-sliced workers (the benchmark's first shape), on the nodes the benchmark gives them."""
    spec = make_spec(count * 4)
    spec["workers"] = [w for w in spec["workers"] if w.get("sharing") == "time-slicing"][:count]
    return spec


def test_first_up_depth_is_the_same_for_1_and_50_workers_of_one_shape() -> None:
    depths = []
    for count in (1, 50):
        recording, _ = plan(
            "t",
            {"config": {"proxmox-gpu-cluster:cluster": only_a10_workers(count)}},
            ROOT / "__main__.py",
            placeholder_secrets=True,
        )
        assert len([r for r in recording.resources if r.type.endswith("VmLegacy")]) == count
        depths.append(len(critical_path(recording)))
    # With the node agent's copies to the host and to the guest, the VM-restart step and the join-token step.
    assert depths == [19, 19]


def test_the_plan_names_every_reboot_point() -> None:
    recording, capacity = plan(
        "t", {"config": {"proxmox-gpu-cluster:cluster": make_spec(4)}}, ROOT / "__main__.py", placeholder_secrets=True
    )
    points = plan_document("t", recording, capacity)["rebootPoints"]
    assert sorted(n for n in points if n.endswith("-bootstrap-driver")) == [
        f"cluster-w{i}-bootstrap-driver" for i in range(4)
    ]
    assert "cluster-pve0-host-prep-prep" in points
    assert sorted(n for n in points if n.endswith("-large-bar")) == ["cluster-w1-large-bar", "cluster-w3-large-bar"]
    assert sorted(n for n in points if n.endswith("-mig-restart")) == [
        "cluster-w1-mig-restart",
        "cluster-w3-mig-restart",
    ]
