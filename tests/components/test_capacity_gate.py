"""The capacity gate in the plan: one per joined worker, expecting its capacity-table row, after the operator and
that node's own labels; the smoke test waits for the gates and re-runs when what it tests changes."""

from __future__ import annotations

import pulumi_command as command
from pulumi import ResourceOptions

from proxmox_gpu_cluster.core.capacity import capacity_table
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.guest.capacity_gate import NodeCapacityGate, NodeCapacityGateArgs
from proxmox_gpu_cluster.render.agent_bundle import step_command
from proxmox_gpu_cluster.testing import run
from tests.support import base_spec, make_vm_worker, plan_stack

GATE = "proxmox-gpu-cluster:capacity_gate:NodeCapacityGate"


def smoke(raw: dict) -> dict:  # type: ignore[type-arg]
    raw["gpuOperator"]["smokeTest"] = {"enabled": True}
    return raw


def test_each_worker_gate_expects_its_row_and_waits_for_its_own_labels() -> None:
    raw = base_spec()
    rec = plan_stack(raw)
    rows = {row.worker: row for row in capacity_table(load_spec(raw))}
    gates = {g.name.removeprefix("cluster-").removesuffix("-capacity") for g in rec.of_type(GATE)}
    assert set(gates) == {w["name"] for w in raw["workers"]}
    for worker in gates:
        check = rec.named(f"cluster-{worker}-capacity-check")
        create = check.plain_inputs["create"]
        for resource, count in rows[worker].resources.items():
            assert f"--expect {resource}={count}" in create
        assert rec.depends_on(check, rec.named("cluster-gpu-operator-release"))  # through the group, its parent
        assert rec.depends_on(check, rec.named(f"cluster-gpu-nodes-{worker}"))
        # (through the operator release, which waits for every node's labels, it also follows the other nodes)
        assert rec.named(f"cluster-gpu-nodes-{worker}").urn in check.dependencies  # directly
    assert "--device-plugin-config time-slicing-4-" in rec.named("cluster-ts-1-capacity-check").plain_inputs["create"]


def test_one_edge_to_the_operator_release_however_many_workers() -> None:
    """The SDK walks everything behind the release for each edge into it; the gates' group takes one for all."""

    def edges_into_release(workers: int) -> int:
        raw = base_spec()
        node = raw["proxmox"]["nodes"][0]
        for i in range(workers):
            node["gpus"].append({"name": f"extra-{i}", "pciPath": f"0000:{0xA0 + i:02x}:00", "model": "L4"})
            raw["workers"].append(
                {"name": f"extra-{i}", "vmid": 4000 + i, "node": node["name"], "gpus": [f"extra-{i}"]}
            )
        rec = plan_stack(raw)
        release = rec.named("cluster-gpu-operator-release").urn
        return sum(release in r.dependencies for r in rec.resources)

    assert len(plan_stack(base_spec()).of_type(GATE)) >= 2
    assert edges_into_release(0) == edges_into_release(5)
    group = plan_stack(base_spec()).one("proxmox-gpu-cluster:capacity_gate:NodeCapacityGates")
    assert group.name == "cluster-capacity-gates"


def test_kubevirt_workers_expect_their_sandbox_resources() -> None:
    rec = plan_stack(make_vm_worker(base_spec(), 2, "vm-passthrough"))
    assert "--expect nvidia.com/GA102GL_A10=2" in rec.named("cluster-ts-1-capacity-check").plain_inputs["create"]


def test_no_gate_when_switched_off_or_when_nodes_join_elsewhere() -> None:
    off = base_spec()
    off["gpuOperator"]["capacityGateSeconds"] = 0
    assert not plan_stack(off).of_type(GATE)
    elsewhere = base_spec()
    elsewhere["kubernetes"]["joinMethod"] = "none"
    assert not plan_stack(elsewhere).of_type(GATE)


def test_smoke_test_waits_for_the_gates_and_reruns_when_what_it_tests_changes() -> None:
    def key(raw: dict) -> str:  # type: ignore[type-arg]
        job = plan_stack(raw).one("kubernetes:batch/v1:Job").plain_inputs
        return str(job["spec"]["template"]["metadata"]["annotations"]["proxmox-gpu-cluster.io/depends-on"])

    rec = plan_stack(smoke(base_spec()))
    job = rec.one("kubernetes:batch/v1:Job")
    assert all(rec.depends_on(job, g) for g in rec.of_type(GATE))
    base = key(smoke(base_spec()))
    replicas = smoke(base_spec())
    replicas["workers"][2]["timeSlicing"]["replicas"] = 8
    geometry = smoke(base_spec())
    geometry["workers"][1]["gpus"][0]["mig"] = {"7g.40gb": 1}
    driver = smoke(base_spec())
    driver["gpuOperator"]["driverVersion"] = "580.95.05"
    quota = smoke(base_spec())
    quota["quotas"][0]["resources"]["nvidia.com/gpu"] = 2
    assert len({base, key(replicas), key(geometry), key(driver)}) == 4
    assert key(quota) == base  # a quota is not something the test exercises


def test_gate_component_alone() -> None:
    def program() -> None:
        args = NodeCapacityGateArgs(
            node_name="bm-1", resources={"nvidia.com/gpu": 2}, host="10.0.0.5", user="ubuntu", ssh_private_key="k",
            timeout_seconds=120,
        )  # fmt: skip
        NodeCapacityGate("gate", args, ResourceOptions(provider=command.Provider("ssh")))

    rec = run(program)
    check = rec.named("gate-check")
    assert (
        check.plain_inputs["create"]
        == f"{step_command('ubuntu', 'capacity', [])} --node bm-1 --timeout 120 --expect nvidia.com/gpu=2"
    )
    assert "stdin" not in check.inputs  # no script and no secret: kubelet's own credential is on the node
    # Alone on a bare-metal node, the gate installs the node agent itself and runs after it.
    agent = rec.named("gate-agent")
    assert agent.type == "command:remote:CopyToRemote" and agent.urn in check.dependencies
    assert agent.plain_inputs["remotePath"] == ".proxmox-gpu-cluster"
