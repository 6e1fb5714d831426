"""NodeStepAccess and render/node_rbac.py: the slot namespace and the RBAC the node steps act with, as Kubernetes
takes them, field for field what the renderer says, and only what the node agent uses."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pulumi
import pulumi_kubernetes as kubernetes
import pytest

from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.gpu.node_access import NodeStepAccess, NodeStepAccessArgs
from proxmox_gpu_cluster.render import node_rbac
from proxmox_gpu_cluster.testing import run
from tests.components.gpu_opts import check_opts
from tests.support import base_spec, plan_stack

AGENT = Path(__file__).resolve().parents[2] / "components" / "agent"


def program(namespace: str = "pgc-team-a") -> None:
    k8s = kubernetes.Provider("k8s", kubeconfig="{}")
    NodeStepAccess("access", NodeStepAccessArgs(slot_namespace=namespace), pulumi.ResourceOptions(provider=k8s))


def test_opts_carry_the_provider_and_what_it_waits_for() -> None:
    check_opts(
        lambda opts: NodeStepAccess("access", NodeStepAccessArgs(slot_namespace="slots"), opts),
        "access",
        first=("access-namespace", "access-cluster-role", "access-cluster-role-binding"),
    )


def test_a_bad_namespace_is_one_line() -> None:
    with pytest.raises(InvalidComponentArgs) as err:
        NodeStepAccessArgs(slot_namespace="Team_A")
    assert err.value.lines == [
        "NodeStepAccessArgs.slot_namespace: String should match pattern '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'"
    ]


@pytest.mark.parametrize("version", ["1.32", "1.34"])
def test_the_objects_are_what_kubernetes_takes_and_what_the_renderer_says(version: str) -> None:
    rec = run(program)
    component = rec.one("proxmox-gpu-cluster:node_access:NodeStepAccess")
    children = {r.name: r for r in rec.children(component)}
    assert set(children) == {f"access-{role}" for role in
                             ("namespace", "role", "role-binding", "cluster-role", "cluster-role-binding")}  # fmt: skip
    registered = sorted((r.plain_inputs for r in children.values()), key=lambda o: (o["kind"], o["metadata"]["name"]))
    rendered = sorted(node_rbac.objects("pgc-team-a"), key=lambda o: (o["kind"], o["metadata"]["name"]))
    assert registered == rendered
    for obj in registered:
        kubernetes_validate.validate(obj, version, strict=True)
    assert {o["metadata"]["name"] for o in registered if o["kind"].startswith("Cluster")} == {
        "proxmox-gpu-cluster-node-steps:pgc-team-a"
    }  # two clusters with different slot namespaces do not share it


def test_the_bindings_wait_for_the_namespace() -> None:
    rec = run(program)
    namespace = rec.named("access-namespace")
    for role in ("role", "role-binding"):
        assert rec.depends_on(rec.named(f"access-{role}"), namespace)


def test_the_grants_are_exactly_what_the_agent_asks_for() -> None:
    # Every kubectl verb on a configmap or another node in the agent has a grant, and nothing is granted that no
    # code uses: no get or delete of configmaps (one list reads them all; a release writes an empty holder), no list
    # of nodes. A replace sends the resourceVersion read, so kubectl does not GET the object first.
    source = (AGENT / "cluster.py").read_text() + (AGENT / "kubeapi.py").read_text()
    used = {"configmaps": {"list"} if '"get", "configmaps"' in source else set(), "nodes": set()}
    used["configmaps"] |= {v for v, verb in (("create", '"create"'), ("update", '"replace"')) if verb in source}
    used["nodes"] |= {"delete"} if re.search(r'kube\("delete", "node"', source) else set()
    used["nodes"] |= {"get"} if "self.node_object(slot.holder" in source else set()
    slot_rules = {r["resources"][0]: set(r["verbs"]) for r in node_rbac.SLOT_RULES}
    node_rules = {r["resources"][0]: set(r["verbs"]) for r in node_rbac.NODE_RULES}
    assert slot_rules == {"configmaps": used["configmaps"]} and node_rules == {"nodes": used["nodes"]}


def test_the_cluster_creates_it_in_the_slot_namespace_of_its_spec() -> None:
    raw = base_spec()
    raw["kubernetes"]["drain"] = {"slotNamespace": "gpu-rollouts"}
    rec = plan_stack(raw)
    assert rec.named("cluster-node-access-namespace").plain_inputs["metadata"]["name"] == "gpu-rollouts"
    verify = rec.named("cluster-ts-1-bootstrap-verify").plain_inputs["create"]
    assert verify.endswith("--rollout-namespace gpu-rollouts")
