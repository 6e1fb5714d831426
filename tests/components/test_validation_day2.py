"""Bad input that used to be accepted or to crash: addresses, numbers, images, SSH keys, the operator switched off,
driver branches too old for a GPU, host-only node options, namespaces. Each is refused as
``cluster.<path>: <message>``, all at once; random odd values never escape as anything but SpecError."""

from __future__ import annotations

import base64
import datetime
import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.spec import load_spec
from tests.support import assert_problem, base_spec, errors_of, make_vm_worker, replace_at_random, without_operator

Spec = dict[str, Any]
C = "cluster"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBxYhxkAFq8yGtzKQpNLT3ZN0r6Jw1c0Kf3z8lL0Q1u1"


def net(i: int, **values: Any) -> Callable[[Spec], None]:
    return lambda s: s["workers"][i].update(network=values)


def worker(i: int, **values: Any) -> Callable[[Spec], None]:
    return lambda s: s["workers"][i].update(values)


def node(i: int, **values: Any) -> Callable[[Spec], None]:
    return lambda s: s["proxmox"]["nodes"][i].update(values)


def section(name: str, **values: Any) -> Callable[[Spec], None]:
    return lambda s: s.setdefault(name, {}).update(values)


def keys(*values: str) -> Callable[[Spec], None]:
    return lambda s: s["guest"].update(sshPublicKeys=list(values))


def blob(key_type: str) -> str:
    """A base64 wire-format key blob that names ``key_type``."""
    name = key_type.encode()
    return base64.b64encode(struct.pack(">I", len(name)) + name + b"\x00" * 36).decode()


def a100_on_ts1(s: Spec) -> None:
    """ts-1 (pve2) gets an H100 instead of its A10s, no sharing."""
    s["proxmox"]["nodes"][1]["gpus"] = [{"name": "h100-0", "pciPath": "0000:17:00", "model": "H100-PCIE"}]
    s["workers"][2].update(gpus=["h100-0"], sharing="none")
    s["workers"][2].pop("timeSlicing")
    s["quotas"] = []


def operator_off(s: Spec) -> None:
    s["gpuOperator"]["enabled"] = False
    s["quotas"] = []


def dra_namespace(ns: str) -> Callable[[Spec], None]:
    def mutate(s: Spec) -> None:
        s["workers"][1]["dra"] = True
        s["gpuOperator"]["dra"] = {"namespace": ns}

    return mutate


BAD: list[tuple[str, Callable[[Spec], None], str, str]] = [
    # addresses
    ("same static IP twice", net(0, ipv4="192.0.2.60/24"), f"{C}.workers[2].network.ipv4",
     "192.0.2.60 is already used by workers[0] (mig-1)"),
    ("worker on a Proxmox node's address", net(0, ipv4="192.0.2.12/24"), f"{C}.workers[0].network.ipv4",
     "192.0.2.12 is already used by proxmox.nodes[1] (pve2)"),
    ("worker on the API endpoint", lambda s: (s["kubernetes"].update(apiEndpoint="192.0.2.60:6443")),
     f"{C}.workers[2].network.ipv4", "192.0.2.60 is already used by the Kubernetes API endpoint"),
    ("netmask instead of a prefix", net(2, ipv4="192.0.2.51/255.255.255.0"), f"{C}.workers[2].network.ipv4",
     "expected a prefix length after '/'"),
    ("network address", net(2, ipv4="192.0.2.0/24"), f"{C}.workers[2].network.ipv4",
     "192.0.2.0 is the network address of 192.0.2.0/24"),
    ("broadcast address", net(2, ipv4="192.0.2.255/24"), f"{C}.workers[2].network.ipv4",
     "192.0.2.255 is the broadcast address of 192.0.2.0/24"),
    ("/32", net(2, ipv4="192.0.2.60/32"), f"{C}.workers[2].network.ipv4", "use /8 to /30"),
    ("gateway is the worker", net(2, ipv4="192.0.2.60/24", gateway="192.0.2.60"), f"{C}.workers[2].network.gateway",
     "192.0.2.60 is the worker's own address"),
    ("gateway is the broadcast", net(2, ipv4="192.0.2.60/24", gateway="192.0.2.255"),
     f"{C}.workers[2].network.gateway", "is not a host address of 192.0.2.0/24"),
    ("IPv6 gateway for IPv4", net(2, ipv4="192.0.2.60/24", gateway="2001:db8::1"), f"{C}.workers[2].network.gateway",
     "not an IPv4 address"),
    ("gateway with dhcp", net(0, gateway="192.0.2.1"), f"{C}.workers[0].network.gateway",
     "only used with a static ipv4 address"),
    ("four DNS servers", net(0, dns=["192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"]),
     f"{C}.workers[0].network.dns", "at most 3 items"),
    ("search domain with a space", net(0, searchDomain="lab internal"), f"{C}.workers[0].network.searchDomain",
     "should match pattern"),
    ("bridge name too long", net(0, bridge="vmbr0-with-a-long-name"), f"{C}.workers[0].network.bridge",
     "should match pattern"),
    ("API port above 65535", section("kubernetes", apiEndpoint="k8s.example.test:70000"), f"{C}.kubernetes.apiEndpoint",
     "port '70000' is not between 1 and 65535"),
    ("API port 0", section("kubernetes", apiEndpoint="k8s.example.test:0"), f"{C}.kubernetes.apiEndpoint",
     "port '0' is not between 1 and 65535"),
    ("bad IPv6 API endpoint", section("kubernetes", apiEndpoint="[2001:db8::zz]:6443"), f"{C}.kubernetes.apiEndpoint",
     "is not an IPv6 address"),
    ("API endpoint without a port", section("kubernetes", apiEndpoint="k8s.example.test"),
     f"{C}.kubernetes.apiEndpoint", "expected host:port or [IPv6]:port"),
    ("Proxmox port above 65535", section("proxmox", endpoint="https://pve1:99999/"), f"{C}.proxmox.endpoint",
     "not a valid URL"),
    ("Proxmox endpoint with a path", section("proxmox", endpoint="https://pve1:8006/api2/json"),
     f"{C}.proxmox.endpoint", "without a path"),
    ("ssh address with a newline", node(0, sshAddress="192.0.2.11\nrm -rf /"), f"{C}.proxmox.nodes[0].sshAddress",
     "expected a host name or IP address"),
    ("datastore with a control character", worker(0, datastore="local-lvm\x1b"), f"{C}.workers[0].datastore",
     "should match pattern"),
    # numbers
    ("400-digit memory", worker(0, memoryMiB=10**400), f"{C}.workers[0].memoryMiB", "less than or equal to 4194304"),
    ("2^40 MiB of memory", worker(0, memoryMiB=2**40), f"{C}.workers[0].memoryMiB", "less than or equal to 4194304"),
    ("cores: true", worker(0, cores=True), f"{C}.workers[0].cores", "expected a number, got a boolean"),
    ("vmid: false", worker(0, vmid=False), f"{C}.workers[0].vmid", "expected a number, got a boolean"),
    ("fractional cores", worker(0, cores=8.5), f"{C}.workers[0].cores", "fractional part"),
    ("huge replicas", worker(2, timeSlicing={"replicas": 10**30}), f"{C}.workers[2].timeSlicing.replicas",
     "less than or equal to 64"),
    ("huge quota", lambda s: s["quotas"][0]["resources"].update({"nvidia.com/gpu": 10**20}),
     f"{C}.quotas[0].resources.nvidia.com/gpu", "less than or equal to 1000000"),
    ("huge MIG count", worker(1, gpus=[{"ref": "a100-1", "mig": {"1g.5gb": 10**400}}]),
     f"{C}.workers[1].gpus[0].mig.1g.5gb", "less than or equal to 64"),
    ("boolean MIG count", worker(1, gpus=[{"ref": "a100-1", "mig": {"1g.5gb": True}}]),
     f"{C}.workers[1].gpus[0].mig.1g.5gb", "expected a number, got a boolean"),
    ("drain timeout too long", section("kubernetes", drain={"timeoutSeconds": 10**6}),
     f"{C}.kubernetes.drain.timeoutSeconds", "less than or equal to 86400"),
    ("no rolling slot", section("kubernetes", drain={"maxUnavailable": 0}),
     f"{C}.kubernetes.drain.maxUnavailable", "greater than or equal to 1"),
    ("rolling slots as text", section("kubernetes", drain={"maxUnavailable": "all"}),
     f"{C}.kubernetes.drain.maxUnavailable", "valid integer"),
    ("slot lease too short", section("kubernetes", drain={"slotLeaseSeconds": 5}),
     f"{C}.kubernetes.drain.slotLeaseSeconds", "greater than or equal to 60"),
    # images
    ("template is the worker itself", worker(0, image={"templateVmid": 2001}), f"{C}.workers[0].image.templateVmid",
     "2001 is this worker's own vmid"),
    ("template is another worker", worker(0, image={"templateVmid": 2003}), f"{C}.workers[0].image.templateVmid",
     "2003 is the vmid of workers[2], not a template"),
    ("image URL with a space", worker(0, image={"cloudImageUrl": "https://x.test/a b.img"}),
     f"{C}.workers[0].image.cloudImageUrl", "without spaces or control characters"),
    ("image URL not http", worker(0, image={"cloudImageUrl": "ftp://x.test/jammy.img"}),
     f"{C}.workers[0].image.cloudImageUrl", "expected an http:// or https:// URL"),
    # SSH keys
    ("unknown key type", keys(f"ssh-foo {blob('ssh-foo')}"), f"{C}.guest.sshPublicKeys[0]", "unknown key type 'ssh-foo'"),
    ("key that is not base64", keys("ssh-ed25519 not*base64"), f"{C}.guest.sshPublicKeys[0]", "not valid base64"),
    ("key data of another type", keys(f"ssh-ed25519 {blob('ssh-rsa')}"), f"{C}.guest.sshPublicKeys[0]",
     "the key data names 'ssh-rsa', not ssh-ed25519"),
    ("key data that is no key", keys("ssh-ed25519 AAAA"), f"{C}.guest.sshPublicKeys[0]", "not an SSH public key"),
    ("comment with U+2028", keys(f"{KEY} ops\u2028evil: 1"), f"{C}.guest.sshPublicKeys[0]", "line-separator"),
    ("comment with U+0085", keys(f"{KEY} ops\u0085x"), f"{C}.guest.sshPublicKeys[0]", "line-separator"),
    ("comment with an escape", keys(f"{KEY} ops\x1b[31m"), f"{C}.guest.sshPublicKeys[0]", "control"),
    ("comment that YAML reads as a mapping", keys(f"{KEY} ops@lab: evil"), f"{C}.guest.sshPublicKeys[0]",
     "contains ': '"),
    ("comment that starts a YAML comment", keys(f"{KEY} ops #lab"), f"{C}.guest.sshPublicKeys[0]", "contains ' #'"),
    ("second key bad", keys(KEY, "ssh-rsa"), f"{C}.guest.sshPublicKeys[1]", "expected '<type> <base64 key>"),
    # the operator switched off
    ("time-slicing without the operator", operator_off, f"{C}.workers[2].sharing",
     "time-slicing is applied by the GPU Operator, which gpuOperator.enabled: false does not install"),
    ("MIG without the operator", operator_off, f"{C}.workers[0].sharing", "mig is applied by the GPU Operator"),
    # driver branches
    ("branch 470 with an H100", lambda s: (a100_on_ts1(s), s["gpuOperator"].update(driverBranch="470")),
     f"{C}.gpuOperator.driverBranch", "branch 470 does not support H100-PCIE (workers[2]); it needs branch 520"),
    ("branch 535 with an H200", lambda s: (a100_on_ts1(s), s["proxmox"]["nodes"][1]["gpus"][0].update(model="H200"),
     s["gpuOperator"].update(driverBranch="535")), f"{C}.gpuOperator.driverBranch", "needs branch 550 or later"),
    ("open modules on 470", lambda s: s["gpuOperator"].update(driverBranch="470", kernelModuleType="open"),
     f"{C}.gpuOperator.kernelModuleType", "the open kernel modules start with branch 515"),
    ("non-ASCII digits in a branch", lambda s: s["gpuOperator"].update(driverBranch="\u0665\u0668\u0660"),
     f"{C}.gpuOperator.driverBranch", "should match pattern"),
    # options only host prep applies
    ("ACS override without host prep", node(0, acsOverride=True), f"{C}.proxmox.nodes[0].acsOverride",
     "only host prep applies the override"),
    ("nested check without host prep", node(0, nestedVirtualization=True),
     f"{C}.proxmox.nodes[0].nestedVirtualization", "host prep's verify step checks it"),
    ("reboot policy without host prep", node(0, rebootPolicy="always"), f"{C}.proxmox.nodes[0].rebootPolicy",
     "only host prep reboots a node"),
    ("unknown reboot policy", node(0, hostPrep=True, rebootPolicy="sometimes"), f"{C}.proxmox.nodes[0].rebootPolicy",
     "'when-idle', 'always' or 'never'"),
    ("KubeVirt worker without the nested check", lambda s: (make_vm_worker(s, 2, "vm-passthrough"),
     s["proxmox"]["nodes"][1].update(hostPrep=True)), f"{C}.workers[2].workload",
     "set proxmox.nodes[1].nestedVirtualization: true"),
    # namespaces the stack creates
    ("operator in kube-system", lambda s: s["gpuOperator"].update(namespace="kube-system"),
     f"{C}.gpuOperator.namespace", "kube-system exists in every cluster"),
    ("DRA driver in default", dra_namespace("default"), f"{C}.gpuOperator.dra.namespace", "default exists in every"),
]  # fmt: skip


def test_there_are_at_least_55_cases() -> None:
    assert len(BAD) >= 55


@pytest.mark.parametrize(("case", "mutate", "path", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_config(case: str, mutate: Callable[[Spec], None], path: str, message: str) -> None:
    spec = base_spec()
    mutate(spec)
    assert_problem(case, errors_of(spec), path, message)


@pytest.mark.parametrize("endpoint", ["[2001:db8::10]:6443", "k8s.example.test:6443", "10.0.0.10:443", "[::1]:65535"])
def test_api_endpoints_that_are_fine(endpoint: str) -> None:
    spec = base_spec()
    spec["kubernetes"]["apiEndpoint"] = endpoint
    assert load_spec(spec).kubernetes.api_endpoint == endpoint


@pytest.mark.parametrize(
    "key",
    [
        f"sk-ssh-ed25519@openssh.com {blob('sk-ssh-ed25519@openssh.com')} yubikey@ops",
        f"sk-ecdsa-sha2-nistp256@openssh.com {blob('sk-ecdsa-sha2-nistp256@openssh.com')}",
        f"ecdsa-sha2-nistp384 {blob('ecdsa-sha2-nistp384')} ops@lab (laptop), 2026",
        f"{KEY} ops@lab:22",
    ],
)
def test_keys_that_are_fine(key: str) -> None:
    spec = base_spec()
    spec["guest"]["sshPublicKeys"] = [key]
    assert load_spec(spec).guest.ssh_public_keys == (key,)


@pytest.mark.parametrize("key", sorted(k for k, m in CATALOG.items() if not m.sxm))
def test_each_models_minimum_branch_is_accepted_and_the_one_below_refused(key: str) -> None:
    model = CATALOG[key]
    spec = base_spec()
    spec["proxmox"]["nodes"][1]["gpus"] = [{"name": "g0", "pciPath": "0000:17:00", "model": key}]
    spec["workers"][2].update(gpus=["g0"], sharing="none")
    spec["workers"][2].pop("timeSlicing")
    spec["workers"] = spec["workers"][2:]  # only this model in the cluster
    spec["quotas"] = []
    spec["gpuOperator"].update(driverBranch=str(model.min_driver_branch), kernelModuleType="proprietary")
    load_spec(spec)
    spec["gpuOperator"]["driverBranch"] = str(model.min_driver_branch - 1)
    assert any(f"does not support {key} (workers[0])" in line for line in errors_of(spec))


def test_a_taint_without_the_operator_is_fine() -> None:
    spec = without_operator(base_spec())
    spec["workers"][0]["taint"] = True
    assert load_spec(spec).workers[0].taint


@pytest.mark.parametrize(
    "cases",
    [
        # field-level problems, reported together
        ["cores: true", "gateway is the worker", "API port above 65535", "unknown key type", "2^40 MiB of memory"],
        # cross-field problems, reported together once the fields parse
        ["template is the worker itself", "ACS override without host prep", "operator in kube-system",
         "worker on a Proxmox node's address", "open modules on 470"],
    ],
    ids=["fields", "cross-field"],
)  # fmt: skip
def test_every_problem_of_a_bad_spec_at_once(cases: list[str]) -> None:
    spec = base_spec()
    chosen = [b for b in BAD if b[0] in cases]
    for _, mutate, _, _ in chosen:
        mutate(spec)
    lines = errors_of(spec)
    for case, _, path, message in chosen:
        assert_problem(case, lines, path, message)


# --- odd values anywhere never escape as anything but SpecError ----------------------------------------------

ODD = st.one_of(
    st.integers(min_value=-(10**400), max_value=10**400),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=20),
    st.sampled_from(["\x00", "\u2028", "\u0085", "a: b", "- x", "$(id)", "'", "0000:41:00\n", "\ufeff"]),
    st.binary(max_size=8),
    st.dates(),
    st.datetimes(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=4), st.none(), max_size=2),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_odd_values_anywhere_only_raise_spec_errors(data: st.DataObject) -> None:
    spec = base_spec()
    replace_at_random(spec, data, ODD, (1, 3))
    try:
        load_spec(spec)
    except SpecError as err:
        assert err.lines and all(line.startswith("cluster") and ": " in line for line in err.lines)
        # paths name the user's keys, never pydantic's internal schema names
        for line in err.lines:
            where = line.split(": ", 1)[0]
            assert not any(t in where for t in ("function-", "constrained-", "dict[", "tuple[", "union[")), line


def test_a_date_where_text_belongs_is_a_clear_error() -> None:
    spec = base_spec()
    spec["workers"][0]["name"] = datetime.date(2026, 11, 22)
    assert any(line.startswith("cluster.workers[0].name: ") for line in errors_of(spec))


@pytest.mark.parametrize(
    ("mig", "message"),
    [
        ({"4g.20gb": 2}, "4g.20gb: at most 1 per A100-PCIE-40GB, got 2"),
        ({"9g.99gb": 1}, "A100-PCIE-40GB has no MIG profile '9g.99gb'"),
        ("all-9g.99gb", "no MIG config 'all-9g.99gb' for A100-PCIE-40GB"),
    ],
)
def test_existing_gpu_nodes_get_the_mig_rules_workers_get(mig: Any, message: str) -> None:
    # One rule set: a geometry that cannot be placed, or an unknown profile, is refused on a bare-metal node too.
    from proxmox_gpu_cluster.core.errors import SpecError
    from proxmox_gpu_cluster.core.nodes import ExistingGpuNode

    with pytest.raises(SpecError) as err:
        ExistingGpuNode(name="bm-1", gpus={"A100-PCIE-40GB": 1}, sharing="mig", mig=mig)
    assert [line.split(" (known:")[0] for line in err.value.lines] == [f"ExistingGpuNode (bm-1).mig: {message}"]


def test_a_slot_lease_shorter_than_the_drain_is_refused() -> None:
    raw = base_spec()
    raw["kubernetes"]["drain"] = {"timeoutSeconds": 1800, "slotLeaseSeconds": 900}
    lines = errors_of(raw)
    assert_problem(
        "short slot",
        lines,
        "cluster.kubernetes.drain.slotLeaseSeconds",
        "must exceed timeoutSeconds (1800): a slot that expires mid-drain can be taken by another node, got 900",
    )
    raw["kubernetes"]["drain"]["slotLeaseSeconds"] = 1801
    load_spec(raw)  # accepted


@pytest.mark.parametrize("key", sorted(k for k, m in CATALOG.items() if m.sxm))
def test_an_sxm_gpu_is_refused_as_a_workers_passthrough_gpu(key: str) -> None:
    spec = base_spec()
    spec["proxmox"]["nodes"][1]["gpus"] = [{"name": "g0", "pciPath": "0000:17:00", "model": key}]
    spec["workers"][2].update(gpus=["g0"], sharing="none")
    spec["workers"][2].pop("timeSlicing")
    spec["workers"] = spec["workers"][2:]
    spec["quotas"] = []
    spec["gpuOperator"].update(driverBranch="580")
    lines = errors_of(spec)
    assert_problem(key, lines, "cluster.workers[0].gpus[0].ref", f"is an {key}, an SXM module: passed through to a VM")
    assert any("ExistingGpuNode" in line for line in lines)
