"""NodeStepAccess and render/node_rbac.py: the slot namespace and the RBAC the node steps act with, as Kubernetes
takes them, field for field what the renderer says, and only what the node agent uses."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pulumi_kubernetes as kubernetes
import pytest

from proxmox_gpu_cluster.gpu.node_access import NodeStepAccess
from proxmox_gpu_cluster.render import node_rbac
from proxmox_gpu_cluster.testing import run
from tests.support import base_spec, plan_stack

AGENT = Path(__file__).resolve().parents[2] / "components" / "agent"


def program(namespace: str = "pgc-team-a") -> None:
    NodeStepAccess("access", namespace, provider=kubernetes.Provider("k8s", kubeconfig="{}"))


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
