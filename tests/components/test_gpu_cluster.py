"""GpuCluster built directly: children named after it and parented to it, the caller's providers used as given,
two clusters in one program never collide, and the outputs callers compose with."""

from __future__ import annotations

import pulumi
import pulumi_command as command
import pulumi_kubernetes as kubernetes
import pulumi_proxmoxve as proxmoxve
import pytest

from proxmox_gpu_cluster import GpuCluster, GpuClusterArgs, Providers, Secrets
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.testing import Recording, RecordingMocks, run
from proxmox_gpu_cluster.testing_pci import pci_invokes
from tests.support import base_spec, two_team_specs

CLUSTER = "proxmox-gpu-cluster:cluster:GpuCluster"


def secrets() -> Secrets:
    s = pulumi.Output.secret
    return Secrets(
        ssh_private_key=s("k"), kubeconfig=s("{}"), proxmox_api_token=s("t"), join_token=s("j"), ca_cert_hash=s("h")
    )


def test_children_are_prefixed_and_parented() -> None:
    spec = load_spec(base_spec())
    rec = run(
        lambda: GpuCluster("lab", GpuClusterArgs(spec=spec, secrets=secrets())),
        mocks=RecordingMocks(invokes=pci_invokes(spec)),
    )
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
        GpuCluster("lab", GpuClusterArgs(spec=spec, secrets=secrets(), providers=providers))

    rec = run(program, mocks=RecordingMocks(invokes=pci_invokes(spec)))
    assert {r.name for r in rec.resources if r.type.startswith("pulumi:providers:")} == {
        "mine-pve",
        "mine-k8s",
        "mine-ssh",
    }
    assert rec.one("kubernetes:helm.sh/v3:Release").provider == rec.named("mine-k8s").urn


def test_two_clusters_share_a_proxmox_node_and_kubernetes_without_colliding() -> None:
    a, b = (load_spec(raw) for raw in two_team_specs())

    def program() -> None:
        GpuCluster("east", GpuClusterArgs(spec=a, secrets=secrets()))
        GpuCluster("west", GpuClusterArgs(spec=b, secrets=secrets()))

    rec = run(program, mocks=RecordingMocks(invokes=pci_invokes([a, b])))  # duplicate URNs would raise
    assert len(rec.of_type(CLUSTER)) == 2
    mappings = [r.plain_inputs["name"] for r in rec.of_type("proxmoxve:hardware/mapping/pci:Pci")]
    assert len(mappings) == len(set(mappings)) and all(m.startswith("pgc_test-") for m in mappings)
    snippets = [r.plain_inputs["sourceRaw"]["fileName"] for r in rec.of_type("proxmoxve:index/fileLegacy:FileLegacy")
                if "sourceRaw" in r.plain_inputs]  # fmt: skip
    assert len(snippets) == len(set(snippets)) == 3  # east on pve1 and pve2, west on pve1
    images = [r.plain_inputs["fileName"] for r in rec.of_type("proxmoxve:download/file:File")]
    assert len(images) == len(set(images)) == 3


def test_a_second_cluster_claiming_what_the_first_owns_is_refused_before_it_registers() -> None:
    spec = load_spec(base_spec())

    def program() -> None:
        GpuCluster("east", GpuClusterArgs(spec=spec, secrets=secrets()))
        GpuCluster("west", GpuClusterArgs(spec=spec, secrets=secrets()))

    rec = Recording()
    with pytest.raises(InvalidComponentArgs) as err:
        run(program, mocks=RecordingMocks(invokes=pci_invokes(spec)), recording=rec)
    assert isinstance(err.value, pulumi.RunError)
    assert err.value.lines and all(line.startswith("GpuCluster(west): GpuCluster 'west' and GpuCluster 'east' ")
                                   for line in err.value.lines)  # fmt: skip
    assert not [r for r in rec.resources if r.name.startswith("west")]


def test_the_secrets_a_spec_needs_are_checked_with_the_stack_files_rule() -> None:
    spec = load_spec(base_spec())  # token auth, kubeadm, an SSH key
    with pytest.raises(InvalidComponentArgs) as err:
        GpuClusterArgs(spec=spec, secrets=Secrets(ssh_private_key=None, kubeconfig=pulumi.Output.secret("k")))
    assert [line.split(":")[0] for line in err.value.lines] == [
        "GpuClusterArgs.secrets.ca_cert_hash", "GpuClusterArgs.secrets.proxmox_api_token", "GpuClusterArgs.secrets.ssh_private_key",
    ]  # fmt: skip


def test_outputs_callers_compose_with() -> None:
    spec = load_spec(base_spec())
    rec = run(
        lambda: GpuCluster("lab", GpuClusterArgs(spec=spec, secrets=secrets())),
        mocks=RecordingMocks(invokes=pci_invokes(spec)),
    )
    outputs = rec.one(CLUSTER).outputs
    assert set(outputs["capacity"]) == {w.name for w in spec.workers}  # workers' addresses are unknown in a preview
    assert outputs["capacity"]["mig-1"]["resources"] == {"nvidia.com/mig-1g.5gb": 7}
    assert outputs["nodeLabels"]["ts-1"]["nvidia.com/gpu.workload.config"] == "container"
    assert outputs["iommuChecks"] == {"pve1": "plan", "pve2": "plan"}
