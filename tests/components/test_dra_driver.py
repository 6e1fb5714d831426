"""DRA: the nvidia-dra-driver-gpu release, DRA node labels, ordering, and the capacity table."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from proxmox_gpu_cluster.cluster.adapters import gpu_stack
from proxmox_gpu_cluster.core.capacity import capacity_table, worker_capacity
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.gpu.gpu_node import GpuNodeLabels, GpuNodeLabelsArgs
from proxmox_gpu_cluster.stacks.plan import render_text
from proxmox_gpu_cluster.testing import run
from tests.support import base_spec, plan_stack, without_operator

RELEASE = "kubernetes:helm.sh/v3:Release"


def with_dra_worker() -> dict[str, Any]:
    raw = base_spec()
    raw["workers"][1]["dra"] = True  # mig-2: custom MIG geometry, allocated through DRA
    return raw


def test_no_dra_no_release() -> None:
    assert [r.name for r in plan_stack(base_spec()).of_type(RELEASE)] == ["cluster-gpu-operator-release"]


def test_dra_release() -> None:
    rec = plan_stack(with_dra_worker())
    component = rec.one("proxmox-gpu-cluster:dra_driver:DraDriver")
    assert {r.name for r in rec.children(component)} == {"cluster-dra-driver-namespace", "cluster-dra-driver-release"}
    release = rec.named("cluster-dra-driver-release").plain_inputs
    assert release["chart"] == "nvidia-dra-driver-gpu" and release["version"] == "25.12.0"
    assert release["namespace"] == "nvidia-dra-driver-gpu"
    assert release["repositoryOpts"] == {"repo": "https://helm.ngc.nvidia.com/nvidia"}
    assert release["values"]["kubeletPlugin"]["nodeSelector"] == {"nvidia.com/dra-kubelet-plugin": "true"}
    ns = rec.named("cluster-dra-driver-namespace").plain_inputs
    assert ns["metadata"]["labels"] == {"pod-security.kubernetes.io/enforce": "privileged"}


def test_dra_release_waits_for_labels_and_operator() -> None:
    rec = plan_stack(with_dra_worker())
    dra = rec.named("cluster-dra-driver-release")
    assert rec.depends_on(dra, rec.named("cluster-gpu-nodes-mig-2"))
    assert rec.depends_on(dra, rec.named("cluster-gpu-operator-release"))
    assert not rec.depends_on(rec.named("cluster-gpu-operator-release"), dra)


def test_dra_without_operator_still_labels_nodes() -> None:
    rec = plan_stack(without_operator(with_dra_worker()))
    assert [r.name for r in rec.of_type(RELEASE)] == ["cluster-dra-driver-release"]
    assert rec.depends_on(rec.named("cluster-dra-driver-release"), rec.named("cluster-gpu-nodes-mig-2"))
    # Without the operator only the stack's own labels: none of the operator's config labels.
    labels = rec.named("cluster-gpu-nodes-mig-2").plain_inputs["metadata"]["labels"]
    assert labels == {"nvidia.com/dra-kubelet-plugin": "true", "proxmox-gpu-cluster.io/accelerator": "A100-PCIE-40GB"}


def test_dra_node_labels() -> None:
    rec = plan_stack(with_dra_worker())
    labels = rec.named("cluster-gpu-nodes-mig-2").plain_inputs["metadata"]["labels"]
    assert labels["nvidia.com/dra-kubelet-plugin"] == "true"
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "false"
    assert "nvidia.com/device-plugin.config" not in labels
    assert labels["nvidia.com/mig.config"].startswith("custom-")  # MIG partitioning still applies
    other = rec.named("cluster-gpu-nodes-mig-1").plain_inputs["metadata"]["labels"]
    assert "nvidia.com/dra-kubelet-plugin" not in other and "nvidia.com/gpu.deploy.device-plugin" not in other
    # the device plugin stays on for the other nodes (no cluster-wide switch in a mixed cluster)
    assert "enabled" not in rec.named("cluster-gpu-operator-release").plain_inputs["values"]["devicePlugin"]


def test_capacity_lists_dra_devices_not_extended_resources() -> None:
    spec = load_spec(with_dra_worker())
    row = worker_capacity(spec, spec.workers[1])
    assert row.resources == {}
    assert row.devices == {"mig.nvidia.com": 4}  # 3g.20gb + 2g.10gb + 2 x 1g.5gb
    raw = base_spec()
    raw["workers"][0].update(dra=True, sharing="none", mig=None)
    spec = load_spec(raw)
    assert worker_capacity(spec, spec.workers[0]).devices == {"gpu.nvidia.com": 1}


def test_plan_text_shows_dra_devices() -> None:

    spec = load_spec(with_dra_worker())
    text = render_text("t", plan_stack(with_dra_worker()), capacity_table(spec))
    assert "mig.nvidia.com: 4 (DRA)" in text


def test_node_patch_waits_for_its_own_node_only() -> None:
    raw = base_spec()

    def program() -> None:
        spec = load_spec(raw)
        provider = kubernetes.Provider("k8s", kubeconfig="{}")
        joins = {w.name: pulumi.CustomResource("test:index:Join", f"join-{w.name}", {}) for w in spec.workers}
        args = GpuNodeLabelsArgs(stack=gpu_stack(spec), node_ready={name: [join] for name, join in joins.items()})
        GpuNodeLabels("nodes", args, pulumi.ResourceOptions(provider=provider))

    rec = run(program)
    for w in ("mig-1", "mig-2", "ts-1"):
        patch = rec.named(f"nodes-{w}")
        assert rec.depends_on(patch, rec.named(f"join-{w}"))
        others = [n for n in ("mig-1", "mig-2", "ts-1") if n != w]
        assert not any(rec.depends_on(patch, rec.named(f"join-{o}")) for o in others)
