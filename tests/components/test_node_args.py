"""The Proxmox and guest components' args, whichever door a value comes through: every problem at once as
``<Args>.<path>: message`` lines (no pydantic traceback), the provider only through ``opts`` (every child, at any
depth, uses the caller's), ``opts.depends_on`` reaching the first children, and values from other resources
(``pulumi.Output``) taken where callers get them from resources."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pulumi
import pulumi_command as command
import pulumi_proxmoxve as proxmoxve
import pytest

from proxmox_gpu_cluster.args import ComponentArgs
from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.core.iommu import GpuPlacement, NodePreflight
from proxmox_gpu_cluster.core.names import short_hash
from proxmox_gpu_cluster.core.spec import DrainSpec, ProxmoxNode
from proxmox_gpu_cluster.core.worker_spec import Image
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.guest.capacity_gate import (
    GateTarget,
    NodeCapacityGate,
    NodeCapacityGateArgs,
    NodeCapacityGates,
    NodeCapacityGatesArgs,
)
from proxmox_gpu_cluster.guest.guest_bootstrap import GuestBootstrap, GuestBootstrapArgs
from proxmox_gpu_cluster.guest.mig_rollout import MigDrain, MigDrainArgs
from proxmox_gpu_cluster.proxmox.boot_files import WorkerBootFiles, WorkerBootFilesArgs
from proxmox_gpu_cluster.proxmox.host_gpu_prep import ProxmoxHostGpuPrep, ProxmoxHostGpuPrepArgs
from proxmox_gpu_cluster.proxmox.pci_mapping import GpuPciMappings, GpuPciMappingsArgs
from proxmox_gpu_cluster.proxmox.worker_retirement import WorkerRetirement, WorkerRetirementArgs
from proxmox_gpu_cluster.testing import Recording, run

URL = "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"
NODE = ProxmoxNode(
    name="pve9",
    ssh_address="192.0.2.19",
    cpu_vendor="amd",
    gpus=({"name": "l4-0", "pciPath": "0000:c1:00", "model": "L4"},),  # type: ignore[arg-type]
)
PREFLIGHT = NodePreflight(node="pve9", check="plan", gpus=[GpuPlacement("l4-0", "0000:c1:00", 42, "10de:16c1")])
BOOTSTRAP = GuestBootstrapSpec.model_validate(
    {
        "nodeName": "bm-1", "gpus": [{"vendorDevice": "10de:20f1", "product": "NVIDIA-A100-PCIE-40GB"}],
        "driverMode": "host", "driverBranch": "580", "kernelModules": "open", "toolkit": True,
        "apiEndpoint": "k8s.example.test:6443", "kubernetesMinor": 34, "rollout": {},
    }
)  # fmt: skip
DRAIN = DrainSpec()
RETIREMENT: dict[str, Any] = {
    "node_name": "w1", "vmid": 2001, "host": "192.0.2.11", "ssh_user": "root", "guest_user": "ubuntu",
    "ssh_private_key": None, "api_endpoint": "k8s.example.test:6443", "drain": DRAIN, "kubeadm_reset": True,
}  # fmt: skip
GATE: dict[str, Any] = {
    "node_name": "bm-1", "resources": {"nvidia.com/gpu": 2}, "host": "10.0.0.5", "user": "ubuntu",
    "ssh_private_key": None,
}  # fmt: skip
MIG: dict[str, Any] = {
    "bootstrap": BOOTSTRAP, "mig_config": "all-1g.5gb", "operator_namespace": "gpu-operator", "timeout_seconds": 60,
    "host": "10.0.0.5", "user": "ubuntu", "ssh_private_key": None,
}  # fmt: skip


@pytest.mark.parametrize(
    ("args", "values", "lines"),
    [
        (WorkerBootFilesArgs, {"node_name": "pve9", "images": [1], "snippet_store": "local"},
         ["WorkerBootFilesArgs.images[0]: Input should be a valid dictionary or instance of Image",
          "WorkerBootFilesArgs.snippet_store: unknown field (check the spelling)"]),
        (GpuPciMappingsArgs,
         {"node": NODE, "result": NodePreflight(node="pve8", check="plan", gpus=[GpuPlacement("a10", "0000:01:00", 1, None)])},
         ["GpuPciMappingsArgs.result.gpus[0].gpu: node pve9 passes through no GPU 'a10' (known: l4-0)",
          "GpuPciMappingsArgs.result.node: expected 'pve9' (node.name), saw 'pve8'"]),
        (WorkerRetirementArgs, {**RETIREMENT, "node_name": "W_1", "host": "no host!", "vmid": "x", "api_endpoint": "k8s"},
         ["WorkerRetirementArgs.api_endpoint: expected host:port or [IPv6]:port, got 'k8s'",
          "WorkerRetirementArgs.host: expected a host name or IP address, got 'no host!'",
          "WorkerRetirementArgs.node_name: String should match pattern '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'",
          "WorkerRetirementArgs.vmid: Input should be a valid integer, unable to parse string as an integer"]),
        (NodeCapacityGateArgs, {**GATE, "resources": {}, "timeout_seconds": 0, "port": 70000},
         ["NodeCapacityGateArgs.port: Input should be less than or equal to 65535",
          "NodeCapacityGateArgs.resources: Value should have at least 1 item after validation, not 0",
          "NodeCapacityGateArgs.timeout_seconds: Input should be greater than or equal to 1"]),
        (NodeCapacityGateArgs, {**GATE, "resources": {"gpu": 1, "nvidia.com/gpu": -1}},
         ["NodeCapacityGateArgs.resources.gpu: key 'gpu': String should match pattern "
          "'^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$'",
          "NodeCapacityGateArgs.resources.nvidia.com/gpu: Input should be greater than or equal to 0"]),
        (NodeCapacityGatesArgs,
         {"targets": {"BM": {"resources": {"nvidia.com/gpu": 1}, "host": "h", "user": "u", "ready": [1]}},
          "ssh_private_key": None},
         ["NodeCapacityGatesArgs.targets.BM: key 'BM': String should match pattern "
          "'^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'",
          "NodeCapacityGatesArgs.targets.BM.ready[0]: Input should be an instance of Resource"]),
        (GuestBootstrapArgs, {"bootstrap": BOOTSTRAP, "host": "h", "user": "u", "ssh_private_key": None, "port": 0},
         ["GuestBootstrapArgs.port: Input should be greater than or equal to 1"]),
        (ProxmoxHostGpuPrepArgs, {"node": NODE, "owner": "Dev Stack", "ssh_user": "root", "ssh_private_key": None},
         ["ProxmoxHostGpuPrepArgs.owner: String should match pattern '^[a-z0-9][a-z0-9-]{0,62}$'"]),
        (ProxmoxHostGpuPrepArgs, {"node": {"name": "pve9"}, "owner": "dev", "ssh_user": "root"},
         ["ProxmoxHostGpuPrepArgs.node.cpu_vendor: required field is missing",
          "ProxmoxHostGpuPrepArgs.node.ssh_address: required field is missing",
          "ProxmoxHostGpuPrepArgs.ssh_private_key: required field is missing"]),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else "",
)  # fmt: skip
def test_every_problem_at_once_in_the_callers_terms(
    args: type[ComponentArgs], values: dict[str, Any], lines: list[str]
) -> None:
    with pytest.raises(InvalidComponentArgs) as err:
        args(**values)
    assert isinstance(err.value, pulumi.RunError)
    assert [_same_words(line) for line in err.value.lines] == lines
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_a_preflight_with_problems_is_refused() -> None:
    from proxmox_gpu_cluster.core.errors import Problem

    found = NodePreflight(node="pve9", check="plan", problems=[Problem("proxmox.nodes[0]", "x")])
    with pytest.raises(InvalidComponentArgs) as err:
        GpuPciMappingsArgs(node=NODE, result=found)
    assert err.value.lines == [
        "GpuPciMappingsArgs.result.problems: the preflight found 1 problem(s); run_preflight raises them"
    ]


def build(
    make: Callable[[pulumi.ResourceOptions], object], provider: Callable[[], pulumi.ProviderResource]
) -> tuple[Recording, str]:
    """Run ``make`` with the provider ``provider()`` makes and a dependency in its opts; the recording and the
    dependency's URN. The provider registers inside the program, where the mocks are (outside, an older SDK's
    registration fails unless an earlier test left its mocks behind)."""

    def program() -> None:
        before = command.local.Command("before", command.local.CommandArgs(create="true"))
        make(pulumi.ResourceOptions(provider=provider(), depends_on=[before]))

    rec = run(program)
    return rec, rec.named("before").urn


CMD = "pulumi:providers:command::ssh"
PVE = "pulumi:providers:proxmoxve::pve"
CASES: list[tuple[str, Callable[[pulumi.ResourceOptions], object], str, list[str]]] = [
    ("boot files", lambda o: WorkerBootFiles("f", WorkerBootFilesArgs(node_name="pve9", images=(Image(cloud_image_url=URL),)), o),
     PVE, ["f-vendor-data", f"f-image-{short_hash(URL, 8)}"]),
    ("pci mappings", lambda o: GpuPciMappings("p", GpuPciMappingsArgs(node=NODE, result=PREFLIGHT), o),
     PVE, ["p-0000:c1:00"]),
    ("retirement", lambda o: WorkerRetirement("r", WorkerRetirementArgs(**RETIREMENT), o), CMD,
     ["r-host-agent", "r-drain"]),
    ("gate", lambda o: NodeCapacityGate("g", NodeCapacityGateArgs(**GATE), o), CMD, ["g-agent", "g-check"]),
    ("bootstrap", lambda o: GuestBootstrap("b", GuestBootstrapArgs(bootstrap=BOOTSTRAP.model_copy(update={"join_method": "none"}), host="h", user="u", ssh_private_key=None), o),
     CMD, ["b-agent"]),
    ("drain", lambda o: MigDrain("m", MigDrainArgs(**MIG), o), CMD, ["m-begin"]),
    ("host prep", lambda o: ProxmoxHostGpuPrep("h", ProxmoxHostGpuPrepArgs(node=NODE, owner="dev-1", ssh_user="root", ssh_private_key=None), o),
     CMD, ["h-agent"]),
]  # fmt: skip


@pytest.mark.parametrize(("what", "make", "provider", "first"), CASES, ids=[c[0] for c in CASES])
def test_the_provider_and_dependencies_come_through_opts(
    what: str, make: Callable[[pulumi.ResourceOptions], object], provider: str, first: list[str]
) -> None:
    name = provider.rpartition("::")[2]
    rec, before = build(make, lambda: command.Provider(name) if provider == CMD else proxmoxve.Provider(name))
    custom = [r for r in rec.resources if r.custom and r.name != "before" and not r.type.startswith("pulumi:providers")]
    assert custom, what
    assert all(r.provider.endswith(provider) for r in custom), [(r.name, r.provider) for r in custom]
    for name in first:  # Pulumi does not pass a component's dependencies to its children: the component does
        assert before in rec.named(name).dependencies, (what, name)


def test_the_gates_group_hands_the_callers_provider_to_every_gate_and_waits_once() -> None:
    target = GateTarget(resources={"nvidia.com/gpu": 1}, host="10.0.0.5", user="ubuntu")
    rec, before = build(
        lambda o: NodeCapacityGates("gates", NodeCapacityGatesArgs(targets={"a": target, "b": target}, ssh_private_key=None), o),
        lambda: command.Provider("ssh"),
    )  # fmt: skip
    checks = rec.of_type("command:remote:Command")
    assert sorted(c.name for c in checks) == ["gates-a-capacity-check", "gates-b-capacity-check"]
    assert all(c.provider.endswith(CMD) for c in checks)
    assert before in rec.one("proxmox-gpu-cluster:capacity_gate:NodeCapacityGates").dependencies
    assert all(before not in c.dependencies for c in checks)  # one edge, through the group (see its docstring)


def test_values_from_other_resources_are_taken_as_outputs() -> None:
    def program() -> None:
        vm = command.local.Command("vm", command.local.CommandArgs(create="true"))
        node, vmid = vm.create.apply(lambda _: "w7"), vm.create.apply(lambda _: 2007)  # known after the VM exists
        args = WorkerRetirementArgs(
            **{**RETIREMENT, "node_name": node, "vmid": vmid, "host": vm.create.apply(lambda _: "192.0.2.7")}
        )
        WorkerRetirement("r", args, pulumi.ResourceOptions(protect=True))
        NodeCapacityGate("g", NodeCapacityGateArgs(**{**GATE, "node_name": node}))

    rec = run(program, preview=False)
    drain = rec.named("r-drain")
    assert " --vmid 2007 --node-name w7 " in drain.plain_inputs["create"] and drain.protect  # opts.protect inherited
    assert drain.plain_inputs["connection"]["host"] == "192.0.2.7"
    assert " --node w7 --timeout 600 " in rec.named("g-check").plain_inputs["create"]


def _same_words(line: str) -> str:
    """pydantic's message in the declared floor's words: 2.11 says "Value should have at least", later releases name
    the type ("Dictionary should have at least"; pydantic-core's too_short error)."""
    return line.replace(": Dictionary should have at least", ": Value should have at least")
