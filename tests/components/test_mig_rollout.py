"""MigRollout in the plan: two steps per MIG worker around its label patch, the geometry in their commands, no
credential in their inputs (they act as the node); alone, it refuses a bootstrap without rollout settings."""

from __future__ import annotations

import json

import pulumi_command as command
import pytest

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec, RolloutSpec
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.guest.mig_rollout import MigRollout
from proxmox_gpu_cluster.testing import redact, run
from tests.support import base_spec, plan_stack

MIG = "proxmox-gpu-cluster:mig_rollout:MigRollout"
B = GuestBootstrapSpec.model_validate(
    {
        "nodeName": "bm-1", "gpus": [{"vendorDevice": "10de:20f1", "product": "NVIDIA-A100-PCIE-40GB"}],
        "driverMode": "host", "driverBranch": "580", "kernelModules": "open", "toolkit": True,
        "apiEndpoint": "k8s.example.test:6443", "kubernetesMinor": 34,
    }
)  # fmt: skip


def test_each_mig_worker_drains_before_its_label_changes() -> None:
    rec = plan_stack(base_spec())
    assert sorted(r.name for r in rec.of_type(MIG)) == ["cluster-mig-1-mig", "cluster-mig-2-mig"]  # not ts-1
    for worker in ("mig-1", "mig-2"):
        begin, end = rec.named(f"cluster-{worker}-mig-begin"), rec.named(f"cluster-{worker}-mig-end")
        patch = rec.named(f"cluster-gpu-nodes-{worker}")
        geometry = patch.plain_inputs["metadata"]["labels"]["nvidia.com/mig.config"]
        assert f"--phase begin --mig-config {geometry} " in begin.plain_inputs["create"]
        assert f"--phase end --mig-config {geometry} " in end.plain_inputs["create"]
        assert rec.depends_on(patch, begin) and rec.depends_on(end, begin) and not rec.depends_on(begin, patch)
        assert rec.depends_on(begin, rec.named(f"cluster-{worker}-bootstrap-verify"))
        for step in (begin, end):
            assert "stdin" not in step.inputs and "CANARY-KUBECONFIG" not in json.dumps(step.plain_inputs)
            assert rec.depends_on(step, rec.named("cluster-node-access-role-binding"))


def test_a_geometry_change_reruns_only_that_workers_mig_steps() -> None:
    before = plan_stack(base_spec())
    raw = base_spec()
    raw["workers"][1]["gpus"][0]["mig"] = {"7g.40gb": 1}
    after = plan_stack(raw)
    changed = {
        r.name for r in after.resources
        if r.name.startswith("cluster-mig-") and redact(r.inputs) != redact(before.named(r.name).inputs)
    }  # fmt: skip
    worker = raw["workers"][1]["name"]
    assert {f"cluster-{worker}-mig-begin", f"cluster-{worker}-mig-end"} <= changed
    assert not any("-bootstrap-" in n or "-vm" in n for n in changed)


def test_no_mig_rollout_for_nodes_joined_elsewhere() -> None:
    raw = base_spec()
    raw["kubernetes"]["joinMethod"] = "none"  # no admin path into the node's steps: the operator applies it alone
    assert not plan_stack(raw).of_type(MIG)


def test_alone_it_needs_rollout_settings() -> None:
    def program() -> None:
        MigRollout(
            "m", B, mig_config="all-1g.5gb", operator_namespace="gpu-operator", timeout_seconds=60,
            provider=command.Provider("c"), host="h", user="root", ssh_private_key="k",
        )  # fmt: skip

    with pytest.raises(InvalidComponentArgs) as err:
        run(program)
    assert err.value.lines == ["m.bootstrap.rollout: a MIG rollout needs rollout settings"]
    rolling = B.model_copy(update={"rollout": RolloutSpec()})

    def program_ok() -> None:
        MigRollout(
            "m", rolling, mig_config="all-1g.5gb", operator_namespace="gpu-operator", timeout_seconds=60,
            provider=command.Provider("c"), host="h", user="root", ssh_private_key="k",
        )  # fmt: skip

    rec = run(program_ok)
    assert [r.name for r in rec.of_type("command:remote:Command")] == ["m-begin", "m-end"]
    assert rec.named("m-end").custom_timeouts == {"create": "360s", "update": "360s"}
