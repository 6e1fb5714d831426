"""The components under Pulumi's own mocks (``pulumi.runtime.set_mocks``, inputs echoed, every call answered
``{}``), preview on and off; ``testing.run`` and ``pci_invokes`` answering the PCI lookup for whatever the
program builds, from device lists in the provider's or the Proxmox API's field names; the preflight of a node
alone; the quota loader."""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_proxmoxve as proxmoxve
import pytest

from proxmox_gpu_cluster import GpuCluster, GpuClusterArgs, Secrets
from proxmox_gpu_cluster.core.spec import HostGpu, ProxmoxNode, load_spec
from proxmox_gpu_cluster.proxmox.pci_mapping import IommuPreflightError, run_preflight
from proxmox_gpu_cluster.stacks.config import InvalidStackConfig, load_quotas
from proxmox_gpu_cluster.testing import RecordingMocks, run
from proxmox_gpu_cluster.testing_pci import GET_PCI, pci_invokes, spec_shaped_pci
from tests.support import base_spec, two_team_specs

NODE = ProxmoxNode(
    name="pve1",
    ssh_address="192.0.2.11",
    cpu_vendor="amd",
    gpus=(HostGpu(name="a10-0", pci_path="0000:41:00", model="A10"),),
)


class GuideMocks(pulumi.runtime.Mocks):
    """Pulumi's testing guide's mocks: inputs echoed as outputs, every call answered ``{}``."""

    def __init__(self) -> None:
        self.types: list[str] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.types.append(args.typ)
        return args.name + "_id", args.inputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        return {}


def secrets() -> Secrets:
    s = pulumi.Output.secret
    return Secrets(
        ssh_private_key=s("k"), kubeconfig=s("{}"), proxmox_api_token=s("t"), join_token=s("j"), ca_cert_hash=s("h")
    )


@pytest.mark.parametrize("preview", [True, False])
def test_a_whole_cluster_under_the_guides_mocks(preview: bool) -> None:
    # Before: the PCI lookup's {} was iterated ('NoneType' object is not iterable); with preview off the operator's
    # release status (None when echoed) and host prep's stdout crashed callbacks.
    mocks = GuideMocks()
    pulumi.runtime.set_mocks(mocks, preview=preview)
    spec = load_spec(base_spec())

    @pulumi.runtime.test  # type: ignore[untyped-decorator]
    def program() -> pulumi.Output[Any]:
        cluster = GpuCluster("lab", GpuClusterArgs(spec=spec, secrets=secrets()))
        return pulumi.Output.all(cluster.urn, cluster.operator.release_status)

    program()
    assert "proxmoxve:index/vmLegacy:VmLegacy" in mocks.types
    assert "kubernetes:helm.sh/v3:Release" in mocks.types


def test_run_answers_the_pci_lookup_for_every_cluster_of_the_program() -> None:
    a, b = two_team_specs()

    def program() -> None:
        for team in ("vision", "speech"):
            spec = load_spec(pulumi.Config(team).require_object("cluster"))
            GpuCluster(team, GpuClusterArgs(spec=spec, secrets=secrets()))

    rec = run(program, config={"vision:cluster": a, "speech:cluster": b})
    looked_up = [i.args["nodeName"] for i in rec.invokes if i.token == GET_PCI]
    assert sorted(set(looked_up)) == ["pve1", "pve2"]
    assert len(rec.of_type("proxmoxve:hardware/mapping/pci:Pci")) >= 2


def test_run_answers_for_a_spec_built_in_python() -> None:
    # No spec in config at all: the preflight checks each node as the program describes it.
    rec = run(lambda: GpuCluster("lab", GpuClusterArgs(spec=load_spec(base_spec()), secrets=secrets())))
    assert rec.of_type("proxmoxve:hardware/mapping/pci:Pci")


def test_pci_invokes_take_the_proxmox_apis_field_names() -> None:
    api = [
        {"id": d["id"], "class": d["class"], "vendor": d["vendor"], "device": d["device"],
         "iommugroup": 7, "subsystem_vendor": d["subsystemVendor"], "subsystem_device": d["subsystemDevice"],
         "device_name": d["deviceName"]}
        for d in spec_shaped_pci(NODE)
    ]  # fmt: skip
    nic = {"id": "0000:42:00.0", "class": "0x020000", "vendor": "0x8086", "device": "0x1533", "iommugroup": 7,
           "device_name": "I210 Gigabit"}  # fmt: skip
    answer = pci_invokes(None, {"pve1": [*api, nic]})[GET_PCI]({"nodeName": "pve1"})
    assert all("iommuGroup" in d and "iommugroup" not in d for d in answer["devices"])

    def program() -> None:
        run_preflight(NODE, proxmoxve.Provider("pve"))

    with pytest.raises(IommuPreflightError) as err:
        run(program, mocks=RecordingMocks(invokes=pci_invokes(None, {"pve1": [*api, nic]})))
    # The group came through (7, shared with the NIC), not as a missing value.
    assert any("IOMMU group 7 of 0000:41:00" in line for line in err.value.lines)


def test_the_preflight_takes_a_node_and_names_it() -> None:
    bridges_only = [d for d in spec_shaped_pci(NODE) if d["vendor"] != "0x10de"]  # the host without its GPU

    def program() -> None:
        run_preflight(NODE, proxmoxve.Provider("pve"))

    with pytest.raises(IommuPreflightError) as err:
        run(program, mocks=RecordingMocks(invokes=pci_invokes(None, {"pve1": bridges_only})))
    assert err.value.lines == ["ProxmoxNode (pve1).gpus[0].pciPath: no PCI device at 0000:41:00.0 on node pve1"]
    result = {}

    def good() -> None:
        result.update(run_preflight(NODE, proxmoxve.Provider("pve")))

    run(good)  # no device list given: the node as its spec describes it
    assert [g.gpu for g in result["pve1"].gpus] == ["a10-0"]


def test_quotas_load_from_config_every_problem_at_once() -> None:
    good = [{"namespace": "team-a", "resources": {"nvidia.com/gpu": 2}}]
    loaded: list[Any] = []
    run(lambda: loaded.extend(load_quotas()), config={"proxmox-gpu-cluster:quotas": good})
    assert loaded[0].namespace == "team-a" and loaded[0].resources == {"nvidia.com/gpu": 2}
    bad = [{"namespace": "Team A", "resources": {}}, {"namespace": "b", "resources": {"nvidia.com/gpu": -1}}]
    with pytest.raises(InvalidStackConfig) as err:
        run(load_quotas, config={"proxmox-gpu-cluster:quotas": bad})
    assert [line.split(":", 2)[1] for line in err.value.lines] == [
        "quotas[0].namespace", "quotas[0].resources", "quotas[1].resources.nvidia.com/gpu",
    ]  # fmt: skip
