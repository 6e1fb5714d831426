"""GpuCluster built directly: children named after it and parented to it, the caller's providers used as given,
two clusters in one program never collide, and the outputs callers compose with."""

from __future__ import annotations

import pulumi
import pulumi_command as command
import pulumi_kubernetes as kubernetes
import pulumi_proxmoxve as proxmoxve

from proxmox_gpu_cluster import GpuCluster, Providers, Secrets
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.testing import RecordingMocks, run
from proxmox_gpu_cluster.testing_pci import pci_invokes
from tests.support import base_spec

CLUSTER = "proxmox-gpu-cluster:cluster:GpuCluster"


def secrets() -> Secrets:
    s = pulumi.Output.secret
    return Secrets(
        ssh_private_key=s("k"), kubeconfig=s("{}"), proxmox_api_token=s("t"), join_token=s("j"), ca_cert_hash=s("h")
    )


def test_children_are_prefixed_and_parented() -> None:
    spec = load_spec(base_spec())
    rec = run(lambda: GpuCluster("lab", spec, secrets()), mocks=RecordingMocks(invokes=pci_invokes(spec)))
    cluster = rec.one(CLUSTER)
    assert all(c.name.startswith("lab-") for c in rec.children(cluster))
    assert {r.name for r in rec.of_type("pulumi:providers:kubernetes")} == {"lab-kubernetes"}
    component_types = {r.type for r in rec.resources if r.parent == cluster.urn}
    assert "proxmox-gpu-cluster:gpu_operator:GpuOperator" in component_types


def test_the_callers_providers_are_used_and_no_others_created() -> None:
    spec = load_spec(base_spec())

    def program() -> None:
        providers = Providers(
            proxmox=proxmoxve.Provider("mine-pve"),
            kubernetes=kubernetes.Provider("mine-k8s", kubeconfig="{}"),
            command=command.Provider("mine-ssh"),
        )
        GpuCluster("lab", spec, secrets(), providers=providers)

    rec = run(program, mocks=RecordingMocks(invokes=pci_invokes(spec)))
    assert {r.name for r in rec.resources if r.type.startswith("pulumi:providers:")} == {
        "mine-pve",
        "mine-k8s",
        "mine-ssh",
    }
    assert rec.one("kubernetes:helm.sh/v3:Release").provider == rec.named("mine-k8s").urn


def test_two_clusters_in_one_program_do_not_collide() -> None:
    spec = load_spec(base_spec())

    def program() -> None:
        GpuCluster("east", spec, secrets())
        GpuCluster("west", spec, secrets())

    rec = run(program, mocks=RecordingMocks(invokes=pci_invokes(spec)))  # duplicate URNs would raise
    assert len(rec.of_type(CLUSTER)) == 2


def test_outputs_callers_compose_with() -> None:
    spec = load_spec(base_spec())
    rec = run(lambda: GpuCluster("lab", spec, secrets()), mocks=RecordingMocks(invokes=pci_invokes(spec)))
    outputs = rec.one(CLUSTER).outputs
    assert set(outputs["capacity"]) == {w.name for w in spec.workers}  # workers' addresses are unknown in a preview
    assert outputs["capacity"]["mig-1"]["resources"] == {"nvidia.com/mig-1g.5gb": 7}
    assert outputs["nodeLabels"]["ts-1"]["nvidia.com/gpu.workload.config"] == "container"
    assert outputs["iommuChecks"] == {"pve1": "plan", "pve2": "plan"}
