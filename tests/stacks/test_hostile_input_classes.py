"""The input classes that got through before (issue 33): each refused with its path, or handled, from the stack file
(plan CLI, exit 2) and under ``pulumi up`` alike; the two-cluster ones through the two-teams example program."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.input_safety import escape_lines
from proxmox_gpu_cluster.core.iommu import preflight
from proxmox_gpu_cluster.core.names import StackScope
from proxmox_gpu_cluster.core.quoting import MAX_MESSAGE, MAX_PATH
from proxmox_gpu_cluster.core.shared_estate import ClusterClaim, estate_conflicts
from proxmox_gpu_cluster.core.spec import HostGpu, load_spec
from proxmox_gpu_cluster.core.vgpu_manager import VgpuManagerSpec, vgpu_version_problem
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.proxmox.pci_mapping import IommuPreflightError
from proxmox_gpu_cluster.stacks.plan import plan
from proxmox_gpu_cluster.stacks.plan.inputs import find_program
from proxmox_gpu_cluster.testing_pci import GET_PCI, pci_invokes, spec_shaped_pci
from tests.stacks.test_hostile_input_spec import both
from tests.support import ROOT, base_spec, two_team_specs

KEY = "proxmox-gpu-cluster:cluster"
TWO_TEAMS = ROOT / "examples" / "two-teams"
SLOT = f"{KEY}.kubernetes.drain.slotNamespace"
RISK = (
    "the stack creates the rollout slots' namespace, owns it (a destroy deletes it) and lets every node (group "
    "system:nodes) write every ConfigMap in it; use a namespace of its own"
)


# -- 1. the rollout slots' namespace is the stack's own ---------------------------------------------------------


@pytest.mark.parametrize("namespace", ["kube-system", "kube-public", "kube-node-lease", "default"])
def test_slot_namespace_that_every_cluster_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], namespace: str
) -> None:
    spec = base_spec()
    spec["kubernetes"]["drain"] = {"slotNamespace": namespace}
    assert both(tmp_path, capsys, spec) == [f"{SLOT}: {namespace} exists in every Kubernetes cluster, and {RISK}"]


@pytest.mark.parametrize(
    ("namespace", "used_as", "edit"),
    [
        ("gpu-operator", "gpuOperator.namespace", {}),
        ("kubevirt", "kubevirt.namespace", {}),
        ("nvidia-dra-driver-gpu", "gpuOperator.dra.namespace", {}),
        ("team-a", "quotas[0].namespace", {"quotas": [{"namespace": "team-a", "resources": {"nvidia.com/gpu": 1}}]}),
    ],
)
def test_slot_namespace_the_spec_uses_for_something_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], namespace: str, used_as: str, edit: dict[str, Any]
) -> None:
    spec = {**base_spec(), **edit}
    spec["kubernetes"]["drain"] = {"slotNamespace": namespace}
    assert both(tmp_path, capsys, spec) == [f"{SLOT}: {namespace} is also {used_as}, and {RISK}"]


def test_slot_namespace_component_refuses_a_namespace_every_cluster_has() -> None:
    from proxmox_gpu_cluster.gpu.node_access import NodeStepAccessArgs

    with pytest.raises(InvalidComponentArgs) as info:
        NodeStepAccessArgs(slot_namespace="kube-system")
    assert [line.split(": ", 1)[0] for line in info.value.lines] == ["NodeStepAccessArgs.slot_namespace"]
    assert "exists in every Kubernetes cluster" in info.value.lines[0]
    assert NodeStepAccessArgs(slot_namespace="gpu-rollouts").slot_namespace == "gpu-rollouts"


# -- 2. iommuPassthrough needs host prep ------------------------------------------------------------------------


def test_iommu_passthrough_without_host_prep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = base_spec()
    spec["proxmox"]["nodes"][0].update(hostPrep=False, iommuPassthrough=True)
    spec["proxmox"]["nodes"][1].update(hostPrep=True, iommuPassthrough=True)  # applied there: fine
    assert both(tmp_path, capsys, spec) == [
        f"{KEY}.proxmox.nodes[0].iommuPassthrough: only host prep adds iommu=pt; set hostPrep: true (or drop it)"
    ]


# -- 3. one GPU claimed twice however the endpoint is spelled ---------------------------------------------------


def claim(name: str, raw: dict[str, Any]) -> ClusterClaim:
    return ClusterClaim(name, StackScope("p", "s", name), load_spec(raw))


@pytest.mark.parametrize(
    "endpoint",
    ["https://PVE1.lab.internal:8006/", "https://pve1.lab.internal:8006", "HTTPS://pve1.LAB.internal:8006/"],
)
def test_two_clusters_claiming_one_gpu_through_differently_spelled_endpoints(endpoint: str) -> None:
    a, b = two_team_specs()
    a["proxmox"]["endpoint"] = "https://pve1.lab.internal:8006/"
    b["proxmox"]["endpoint"] = endpoint
    b["proxmox"]["nodes"] = copy.deepcopy(a["proxmox"]["nodes"])
    b["workers"][0]["gpus"] = [a["workers"][0]["gpus"][0]]  # a's GPU
    lines = estate_conflicts(claim("a", a), claim("b", b))
    assert any("both claim the GPU at " in line for line in lines), lines


@pytest.mark.parametrize(
    ("first", "second"),
    [("https://pve1.lab.internal/", "https://pve1.lab.internal:443"), ("http://pve1:80/", "http://PVE1")],
)
def test_an_explicit_default_port_is_the_same_datacenter(first: str, second: str) -> None:
    a, b = two_team_specs()
    a["proxmox"]["endpoint"], b["proxmox"]["endpoint"] = first, second
    b["workers"][0]["vmid"] = a["workers"][0]["vmid"]
    assert any("both claim VM id" in line for line in estate_conflicts(claim("a", a), claim("b", b)))


def test_another_port_or_host_is_another_datacenter() -> None:
    a, b = two_team_specs()
    b["workers"][0]["vmid"] = a["workers"][0]["vmid"]
    for endpoint in ("https://pve1.lab.internal:8007/", "https://pve2.lab.internal:8006/"):
        a["proxmox"]["endpoint"], b["proxmox"]["endpoint"] = "https://pve1.lab.internal:8006/", endpoint
        b["kubernetes"]["apiEndpoint"] = "k8s-other.lab.internal:6443"
        assert estate_conflicts(claim("a", a), claim("b", b)) == []


def test_kubernetes_api_endpoint_spelled_in_another_case_is_the_same_cluster() -> None:
    a, b = two_team_specs()
    a["kubernetes"]["apiEndpoint"], b["kubernetes"]["apiEndpoint"] = "k8s.lab.internal:6443", "K8S.Lab.Internal:6443"
    b["workers"][0]["name"] = a["workers"][0]["name"]
    assert any("both claim Kubernetes node" in line for line in estate_conflicts(claim("a", a), claim("b", b)))


# -- 4. preflight errors of a two-cluster program name the cluster and state no made-up facts ---------------------


def two_teams_document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((TWO_TEAMS / "Pulumi.dev.yaml").read_text())
    return loaded


def plan_two_teams(document: dict[str, Any], pci: dict[str, list[dict[str, Any]]] | None = None) -> Any:
    program = find_program(TWO_TEAMS)
    return plan("dev", document, program.main, pci, project=program.project, placeholder_secrets=True)


def test_preflight_problems_of_a_two_cluster_program_name_the_cluster() -> None:
    doc = two_teams_document()
    config = doc["config"]
    vision = load_spec(config["vision:cluster"])
    devices = pci_invokes([vision])[GET_PCI]({"nodeName": "pve1"})["devices"]  # vision's GPU only, not speech's
    with pytest.raises(IommuPreflightError) as info:
        plan_two_teams(doc, {"pve1": devices})
    speech_gpu = config["speech:cluster"]["proxmox"]["nodes"][0]["gpus"][0]["pciPath"]
    assert info.value.lines == [
        f"GpuCluster(speech).spec.proxmox.nodes[0].gpus[0].pciPath: no PCI device at {speech_gpu}.0 on node pve1"
    ]


def test_an_empty_device_list_is_not_reported_as_a_missing_gpu() -> None:
    # No running host lists no PCI device at all: such an answer was never read from a host (a mock or an offline
    # plan given nothing for the node), and the preflight says so instead of claiming the GPU is absent.
    result = preflight(load_spec(base_spec()), "pve2", [])
    assert [p.render() for p in result.problems] == [
        "cluster.proxmox.nodes[1]: the PCI device list answered for node pve2 is empty, which no running host "
        "reports (it lists at least its host bridge), so the preflight cannot check its GPUs; under mocks answer "
        "get_pci for this node (testing.pci_invokes), in the offline plan give --pci pve2=FILE"
    ]


def test_the_stack_programs_one_cluster_keeps_the_stack_file_root() -> None:
    from tests.support import plan_stack

    raw = base_spec()
    devices = [d for d in spec_shaped_pci(load_spec(raw), "pve2") if not d["id"].startswith("0000:18:00")]
    with pytest.raises(IommuPreflightError) as info:
        plan_stack(raw, {"pve2": devices})
    assert info.value.lines == ["cluster.proxmox.nodes[1].gpus[1].pciPath: no PCI device at 0000:18:00.0 on node pve2"]


# -- 5. capacity only for the clusters the program builds -------------------------------------------------------


def test_capacity_lists_only_the_clusters_the_program_builds() -> None:
    doc = two_teams_document()
    config = doc["config"]
    unused = copy.deepcopy(config["speech:cluster"])
    unused["workers"][0]["name"] = "never-built-1"
    config["unused:cluster"] = unused  # a namespace the program never loads
    _, capacity = plan_two_teams(doc)
    assert sorted(row.worker for row in capacity) == ["gpu-a10-1", "speech-a100-1"]


# -- 6. a PriorityClass named as a DNS subdomain ----------------------------------------------------------------


def test_dotted_priority_class_names_pass_the_components_too(tmp_path: Path) -> None:
    # Kubernetes validates a PriorityClass name as a DNS subdomain (pkg/apis/scheduling/validation,
    # ValidatePriorityClass: ValidateObjectMeta with NameIsDNSSubdomain): dots allowed.
    from tests.support import plan_stack

    spec = base_spec()
    spec["priorityClasses"] = [{"name": "gpu.high", "value": 1000}]
    spec["quotas"] = [{"namespace": "team-a", "resources": {"nvidia.com/gpu": 1}, "priorityClass": "gpu.high"}]
    rec = plan_stack(spec)
    quota = rec.one("kubernetes:core/v1:ResourceQuota")
    assert quota.plain_inputs["spec"]["scopeSelector"]["matchExpressions"][0]["values"] == ["gpu.high"]
    assert [
        r.plain_inputs["metadata"]["name"] for r in rec.of_type("kubernetes:scheduling.k8s.io/v1:PriorityClass")
    ] == ["gpu.high"]


# -- 7. a huge value is never echoed whole ----------------------------------------------------------------------

HUGE = "a" * 200_000


def test_a_huge_value_is_quoted_truncated_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = base_spec()
    spec["proxmox"]["nodes"][0]["gpus"][0]["pciPath"] = HUGE
    spec["proxmox"]["nodes"][0]["gpus"][1]["model"] = HUGE
    spec["workers"][0][HUGE] = 1
    spec["workers"][2]["network"] = {"ipv4": "dhcp", "dns": [HUGE]}
    spec["kubevirt"] = {"nodes": [{"name": "bm-1", "workload": "vm-passthrough", "gpus": {HUGE: 1}}]}
    lines = both(tmp_path, capsys, spec)
    assert len(lines) == 5
    assert all(len(line) < len(KEY) + MAX_PATH + MAX_MESSAGE + 100 for line in lines), [len(x) for x in lines]
    assert all("(200000 characters)" in line or "more characters" in line for line in lines), lines
    assert f"{KEY}.proxmox.nodes[0].gpus[0].pciPath: expected a PCI path" in "\n".join(lines)


def test_a_huge_value_from_python_is_quoted_truncated() -> None:
    with pytest.raises(SpecError) as info:
        HostGpu(name="g", pci_path=HUGE, model=HUGE)
    assert len(info.value.lines) == 2
    assert all(len(line) < 400 for line in escape_lines(info.value.lines)), info.value.lines


# -- 8. vgpuManager.version without the OS tag the operator appends ---------------------------------------------


def vgpu_spec(version: str) -> dict[str, Any]:
    from tests.support import make_vm_worker

    spec = make_vm_worker(base_spec(), 2, "vm-vgpu", "A10-12Q")
    spec["kubevirt"]["vgpuManager"]["version"] = version
    return spec


@pytest.mark.parametrize(
    ("version", "os_tag"), [("580.95.02-ubuntu22.04", "ubuntu22.04"), ("570.1-rhel9.4", "rhel9.4")]
)
def test_vgpu_manager_version_with_an_os_tag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], version: str, os_tag: str
) -> None:
    bare = version.removesuffix(f"-{os_tag}")
    assert both(tmp_path, capsys, vgpu_spec(version)) == [
        f"{KEY}.kubevirt.vgpuManager.version: {version} ends in the OS tag -{os_tag}, which the GPU Operator appends "
        f"itself (it would pull {version}-{os_tag}); give the driver version only: {bare}"
    ]


def test_the_documented_vgpu_manager_example_is_valid() -> None:
    docs = (ROOT / "docs" / "kubevirt.md").read_text()
    example = docs[docs.index("    kubevirt:\n      vgpuManager:") :].split("\n\n", 1)[0]
    manager = yaml.safe_load(example)["kubevirt"]["vgpuManager"]
    spec = vgpu_spec(manager["version"])
    spec["kubevirt"]["vgpuManager"].update(manager)
    assert load_spec(spec).kubevirt.vgpu_manager is not None
    # The field's own example (the JSON schema and docs/spec.md carry its description) is a valid version too.
    described = VgpuManagerSpec.model_fields["version"].description or ""
    documented = re.search(r"e\.g\. ``([^`]+)``", described)
    assert documented is not None and vgpu_version_problem(documented[1]) is None, described


# -- 9. IPv6 zone ids and kernel arguments that are not kernel parameters ---------------------------------------


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("proxmox.nodes[0].sshAddress", "fe80::1%eth0"),
        ("workers[2].network.dns[0]", "fe80::53%vmbr0"),
        ("kubernetes.apiEndpoint", "[fe80::1%eth0]:6443"),
        ("proxmox.endpoint", "https://[fe80::1%25eth0]:8006/"),
    ],
)
def test_ipv6_zone_ids_are_refused_where_an_address_is_expected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str, value: str
) -> None:
    spec = base_spec()
    if where.startswith("workers"):
        spec["workers"][2]["network"] = {"ipv4": "dhcp", "dns": [value]}
    elif where == "proxmox.nodes[0].sshAddress":
        spec["proxmox"]["nodes"][0]["sshAddress"] = value
    elif where == "kubernetes.apiEndpoint":
        spec["kubernetes"]["apiEndpoint"] = value
    else:
        spec["proxmox"]["endpoint"] = value
    lines = both(tmp_path, capsys, spec)
    assert len(lines) == 1 and lines[0].startswith(f"{KEY}.{where}: "), lines
    assert "carries an IPv6 zone id (%...), which names an interface of one machine" in lines[0]


@pytest.mark.parametrize("arg", ["--help", "-s", "--", ".x=1", "a..b", "init=/bin/sh -s", "x y", "a=b c", ""])
def test_guest_kernel_args_that_are_not_kernel_parameters(arg: str) -> None:
    from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec

    with pytest.raises(SpecError) as info:
        GuestBootstrapSpec(**{**bootstrap_fields(), "kernel_args": (arg,)})
    assert any(line.startswith("GuestBootstrapSpec.kernel_args[0]: ") for line in info.value.lines), info.value.lines


@pytest.mark.parametrize("arg", ["intel_iommu=on", "iommu=pt", "8250.nr_uarts=4", "vfio-pci.ids=10de:2236,10de:1aef"])
def test_guest_kernel_args_that_are_kernel_parameters(arg: str) -> None:
    from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec

    assert GuestBootstrapSpec(**{**bootstrap_fields(), "kernel_args": (arg,)}).kernel_args == (arg,)


def bootstrap_fields() -> dict[str, Any]:
    """A valid GuestBootstrapSpec's fields: the stack's own for the base spec's first worker."""
    from proxmox_gpu_cluster.core.guest_spec import bootstrap_spec

    spec = load_spec(base_spec())
    return bootstrap_spec(spec, spec.workers[0]).model_dump(by_alias=False)
