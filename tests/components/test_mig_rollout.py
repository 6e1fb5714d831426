"""MigDrain and MigSettle in the plan: two steps per MIG worker around its label patch, the geometry in their commands, no
credential in their inputs (they act as the node); alone, it refuses a bootstrap without rollout settings."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_command as command
import pytest
import yaml

from proxmox_gpu_cluster.cluster.builders import OPERATOR_MIG_CONFIG
from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec, RolloutSpec
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.guest.mig_rollout import MigDrain, MigDrainArgs, MigSettle, MigSettleArgs
from proxmox_gpu_cluster.testing import redact, run
from tests.stacks.test_urns import old_urns, recorded
from tests.support import ROOT, base_spec, plan_stack, shared_reference

DRAIN = "proxmox-gpu-cluster:mig_rollout:MigDrain"
SETTLE = "proxmox-gpu-cluster:mig_rollout:MigSettle"
MIG = DRAIN
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
        # The label first (the operator labels an unlabelled node all-disabled), then the release, which brings a
        # new geometry's ConfigMap to mig-manager, then the wait; the end step names that ConfigMap.
        release = rec.named("cluster-gpu-operator-release")
        assert rec.depends_on(release, patch) and rec.depends_on(end, release) and not rec.depends_on(begin, release)
        config_map = rec.named("cluster-gpu-operator-mig-config").plain_inputs["metadata"]["name"]
        assert f" --mig-config-map {config_map} " in end.plain_inputs["create"]
        assert "--mig-config-map" not in begin.plain_inputs["create"]
        assert rec.depends_on(begin, rec.named(f"cluster-{worker}-bootstrap-verify"))
        for step in (begin, end):
            assert "stdin" not in step.inputs and "CANARY-KUBECONFIG" not in json.dumps(step.plain_inputs)
            assert rec.depends_on(step, rec.named("cluster-node-access-role-binding"))


def test_a_geometry_change_reruns_that_workers_mig_steps_and_the_others_end_steps_for_the_new_config_map() -> None:
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
    # The other MIG worker's end step runs again (a no-op on a node no change cordoned): only the name of the
    # custom ConfigMap, now with the new geometry, changed in its command.
    others = {n for n in changed if not n.startswith(f"cluster-{worker}-")}
    assert others == {"cluster-mig-1-mig-end"}
    old, new = (r.named("cluster-mig-1-mig-end").plain_inputs["create"].split() for r in (before, after))
    assert (
        [(a, b) for a, b in zip(old, new, strict=True) if a != b]
        == [(a, b) for a, b in zip(old, new, strict=True) if a.startswith("mig-parted-config-")]
        != []
    )


def test_no_mig_rollout_for_nodes_joined_elsewhere() -> None:
    raw = base_spec()
    raw["kubernetes"]["joinMethod"] = "none"  # no admin path into the node's steps: the operator applies it alone
    assert not plan_stack(raw).of_type(MIG)


def args(bootstrap: GuestBootstrapSpec = B, **changes: object) -> dict[str, Any]:
    base = {
        "bootstrap": bootstrap, "mig_config": "all-1g.5gb", "operator_namespace": "gpu-operator",
        "timeout_seconds": 60, "host": "h", "user": "root", "ssh_private_key": "k",
    }  # fmt: skip
    return base | changes


def test_alone_it_needs_rollout_settings() -> None:
    with pytest.raises(InvalidComponentArgs) as err:
        MigDrainArgs(**args())
    assert err.value.lines == ["MigDrainArgs.bootstrap.rollout: a MIG rollout needs rollout settings"]
    with pytest.raises(InvalidComponentArgs) as err:
        MigSettleArgs(**args(mig_config="all 1g", timeout_seconds=0, vm={"vmid": 1}))
    assert err.value.lines == [
        "MigSettleArgs.mig_config: String should match pattern '^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$'",
        "MigSettleArgs.timeout_seconds: Input should be greater than or equal to 1",
        "MigSettleArgs.vm.guest_user: required field is missing",
        "MigSettleArgs.vm.host: required field is missing",
        "MigSettleArgs.vm.ssh_user: required field is missing",
    ]
    rolling = B.model_copy(update={"rollout": RolloutSpec()})
    provider = command.Provider("c")

    def program() -> None:
        drain = MigDrain("m", MigDrainArgs(**args(rolling)), pulumi.ResourceOptions(provider=provider))
        patch = command.local.Command("label-patch", command.local.CommandArgs(create="true"))
        MigSettle(
            "s",
            MigSettleArgs(**args(rolling), child_prefix="m"),
            pulumi.ResourceOptions(provider=provider, depends_on=[drain, patch]),
        )

    rec = run(program)
    begin, end = rec.named("m-begin"), rec.named("m-end")
    assert [r.name for r in rec.of_type("command:remote:Command")] == ["m-begin", "m-end"]
    assert end.custom_timeouts == {"create": "360s", "update": "360s"}
    assert rec.named("label-patch").urn in end.dependencies and rec.depends_on(end, begin)
    assert begin.provider == end.provider and begin.provider.endswith("pulumi:providers:command::c")


def test_the_steps_keep_the_urns_they_had_under_the_two_phase_component() -> None:
    """Before MigDrain and MigSettle one MigRollout (the drain's name) held all three steps; aliases lead the engine
    from those URNs to the steps now, so `pulumi up` neither replaces nor re-runs a step (pins: tests/stacks/urns)."""
    rec = plan_stack(base_spec())
    former = "proxmox-gpu-cluster:mig_rollout:MigRollout"
    drain, settle = rec.named("cluster-mig-1-mig"), rec.named("cluster-mig-1-mig-settle")
    assert (drain.type, settle.type) == (DRAIN, SETTLE)
    assert {"name": "", "type": former, "parentUrn": ""} in drain.aliases  # its own parent; begin inherits it
    old_parent = drain.urn.replace(f"{DRAIN}::", f"{former}::")
    for step in ("cluster-mig-1-mig-restart", "cluster-mig-1-mig-end"):
        assert rec.named(step).parent == settle.urn
        assert [a.get("parentUrn") for a in rec.named(step).aliases] == [old_parent], step


def test_the_pin_check_would_catch_a_step_without_its_alias() -> None:
    recording = recorded(ROOT, "dev")
    former = (
        "::proxmox-gpu-cluster:cluster:GpuCluster$proxmox-gpu-cluster:mig_rollout:MigRollout$command:remote:Command::"
    )
    old_end = f"urn:pulumi:dev::proxmox-gpu-cluster{former}cluster-gpu-a100-1-mig-end"
    assert old_end in old_urns(recording, "dev", "proxmox-gpu-cluster")
    recording.named("cluster-gpu-a100-1-mig-end").aliases = []  # as if the step had moved without one
    assert old_end not in old_urns(recording, "dev", "proxmox-gpu-cluster")


@pytest.mark.parametrize("tag", ["v25.10.1", "v26.7.0"])
def test_the_operators_own_mig_config_map_is_the_one_its_chart_ships(tag: str) -> None:
    # Without a custom ConfigMap the operator mounts its own into mig-manager (GetConfigMapName's default,
    # MigPartedDefaultConfigMapName): the end step waits for that name.
    shipped = yaml.safe_load(shared_reference(tag, "default-mig-parted-config.yaml").read_text())
    assert shipped["metadata"]["name"] == OPERATOR_MIG_CONFIG
    raw = base_spec()
    for worker in raw["workers"]:
        for gpu in worker["gpus"]:
            if isinstance(gpu, dict) and "mig" in gpu:
                gpu["mig"] = "all-1g.5gb"
    rec = plan_stack(raw)
    assert not rec.of_type("kubernetes:core/v1:ConfigMap") or all(
        not r.name.endswith("-mig-config") for r in rec.of_type("kubernetes:core/v1:ConfigMap")
    )
    ends = [r for r in rec.resources if r.name.endswith("-mig-end")]
    assert ends and all(f" --mig-config-map {OPERATOR_MIG_CONFIG} " in e.plain_inputs["create"] for e in ends)
