"""The second ``pulumi up`` on a running cluster, planned under the recording mock: adding or removing a worker
leaves every Proxmox host input alone; a replaced or removed VM is drained first; nothing two stacks or two nodes
share can collide; the plan says what may reboot."""

from __future__ import annotations

import copy
import json
from typing import Any

from proxmox_gpu_cluster.core.names import StackScope
from proxmox_gpu_cluster.render.agent_bundle import bundle_name, step_command
from proxmox_gpu_cluster.stacks.plan import main
from proxmox_gpu_cluster.testing import RecordedResource, Recording, unwrap
from tests.support import base_spec, plain_strings, plan_stack, prod_spec, shared_group

HOST_PREP = "proxmox-gpu-cluster:host_gpu_prep:ProxmoxHostGpuPrep"
MAPPING = "proxmoxve:hardware/mapping/pci:Pci"
VM = "proxmoxve:index/vmLegacy:VmLegacy"
NODE_PATCH = "kubernetes:core/v1:NodePatch"
NAMESPACE = "kubernetes:core/v1:Namespace"
RETIREMENT = "proxmox-gpu-cluster:worker_retirement:WorkerRetirement"
SPARE_WORKER = {
    "name": "gpu-a10-c", "vmid": 3203, "node": "pve-b", "gpus": ["a10-1"], "sharing": "time-slicing",
    "timeSlicing": {"replicas": 4}, "network": {"ipv4": "10.20.1.23/24", "gateway": "10.20.1.1", "vlan": 120},
}  # fmt: skip


def host_side(rec: Recording) -> dict[str, Any]:
    """Name -> inputs of every resource on the Proxmox hosts themselves: host prep steps and PCI mappings."""
    out = {r.name: unwrap(r.inputs) for p in rec.of_type(HOST_PREP) for r in rec.descendants(p)}
    out.update({r.name: unwrap(r.inputs) for r in rec.of_type(MAPPING)})
    return out


def changed_inputs(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """``resource.input`` for every input that differs (or a resource that appeared or went)."""
    out = [f"{name} (added or removed)" for name in set(before) ^ set(after)]
    for name in set(before) & set(after):
        keys = set(before[name]) | set(after[name])
        out += [f"{name}.{k}" for k in keys if before[name].get(k) != after[name].get(k)]
    return sorted(out)


def test_adding_or_removing_a_worker_changes_no_host_input() -> None:
    base = host_side(plan_stack(prod_spec()))
    assert len(base) == 14  # 2 nodes x (the agent's copy + 3 host prep steps), 6 declared GPUs (one spare)
    fewer = prod_spec()
    fewer["workers"] = [w for w in fewer["workers"] if w["name"] != "gpu-a10-b"]
    more = prod_spec()
    more["workers"].append(copy.deepcopy(SPARE_WORKER))
    moved = prod_spec()
    moved["workers"][3].update(gpus=["a10-1"])  # gpu-a10-b moves to the spare card
    for variant in (fewer, more, moved):
        assert changed_inputs(base, host_side(plan_stack(variant))) == []


def test_a_removed_worker_takes_only_its_own_resources() -> None:
    before = {r.urn: unwrap(r.inputs) for r in plan_stack(prod_spec()).resources}
    fewer = prod_spec()
    fewer["workers"] = [w for w in fewer["workers"] if w["name"] != "gpu-a10-b"]
    after = {r.urn: unwrap(r.inputs) for r in plan_stack(fewer).resources}
    gone = {urn.rsplit("::", 1)[1] for urn in set(before) - set(after)}
    assert {name for name in gone if not name.startswith("cluster-gpu-a10-b")} == {"cluster-gpu-nodes-gpu-a10-b"}
    assert {"cluster-gpu-a10-b-vm", "cluster-gpu-a10-b-retirement-drain", "cluster-gpu-a10-b-bootstrap-join"} <= gone
    assert set(after) <= set(before)
    changed = [urn.rsplit("::", 1)[1] for urn in after if after[urn] != before[urn]]
    # Only the alert rules change: they stop expecting an exporter on the removed node.
    assert changed == ["cluster-gpu-monitoring-alerts"]
    rules = after[next(urn for urn in after if urn.endswith("::cluster-gpu-monitoring-alerts"))]["spec"]["groups"][0][
        "rules"
    ]
    missing = next(r["expr"] for r in rules if r["alert"] == "GpuExporterMissing")
    assert "gpu-a10-b" not in missing and "gpu-a10-a" in missing


def replaced_with(rec: Recording, resource: RecordedResource) -> list[RecordedResource]:
    """What a delete-first replacement of ``resource`` deletes before it (the engine's direct cascade)."""
    return [r for r in rec.resources if resource.urn in r.replace_with]


def test_a_replaced_vm_is_deleted_first_and_drained_before_it_goes() -> None:
    rec = plan_stack(prod_spec())
    vm = rec.named("cluster-gpu-a10-b-vm")
    assert vm.delete_before_replace and vm.protect
    cascade = {r.name for r in replaced_with(rec, vm)}
    steps = {
        f"cluster-gpu-a10-b-bootstrap-{s}"
        for s in ("agent", "vm-restart", "cloud-init", "driver", "driver-wait", "runtime", "join", "verify")
    }
    assert cascade == steps | {"cluster-gpu-a10-b-retirement-drain"}
    # The engine deletes this cascade in no fixed order, so only the retirement may do anything when deleted.
    with_delete = [r.name for r in replaced_with(rec, vm) if r.plain_inputs.get("delete")]
    assert with_delete == ["cluster-gpu-a10-b-retirement-drain"]
    # The node's labels are applied again to the new Node object, after the new bootstrap.
    labels = rec.named("cluster-gpu-nodes-gpu-a10-b")
    assert labels.replace_with == [rec.named("cluster-gpu-a10-b-bootstrap-verify").urn] and labels not in replaced_with(
        rec, vm
    )
    # The large-BAR setting follows a replaced A100 VM too.
    assert rec.named("cluster-gpu-a100-a-vm").urn in rec.named("cluster-gpu-a100-a-large-bar").replace_with


def test_a_replace_is_planned_for_a_vmid_change_and_drains_the_old_vm() -> None:
    before = plan_stack(prod_spec())
    moved = prod_spec()
    moved["workers"][3]["vmid"] = 3212
    after = plan_stack(moved)
    assert before.named("cluster-gpu-a10-b-vm").plain_inputs["vmId"] == 3202
    assert after.named("cluster-gpu-a10-b-vm").plain_inputs["vmId"] == 3212  # ForceNew upstream: a replacement
    old = before.named("cluster-gpu-a10-b-retirement-drain").plain_inputs["delete"]
    retire = step_command("root", "retire", [])
    assert old.startswith(f"{retire} --vmid 3202 --node-name gpu-a10-b --timeout 600 --guest-step ")
    assert " --check 0 -- " in old
    assert after.named("cluster-gpu-a10-b-retirement-drain").plain_inputs["delete"].startswith(f"{retire} --vmid 3212")


def test_the_retirement_waits_for_the_node_and_is_protected_with_the_vm() -> None:
    rec = plan_stack(prod_spec())
    drain = rec.named("cluster-gpu-a10-b-retirement-drain")
    # depends on the bootstrap and the labels: on removal it is deleted (drains) before them
    assert rec.depends_on(drain, rec.named("cluster-gpu-a10-b-bootstrap-verify"))
    assert rec.depends_on(drain, rec.named("cluster-gpu-nodes-gpu-a10-b"))
    assert not rec.depends_on(drain, rec.named("cluster-gpu-a10-a-vm"))
    assert drain.protect and drain.replace_with == [rec.named("cluster-gpu-a10-b-vm").urn]
    inputs = drain.plain_inputs
    assert inputs["connection"]["host"] == "10.20.0.12"  # the Proxmox node, not the guest
    assert inputs["create"].endswith("--check 1 -- --node-name gpu-a10-b --api-endpoint k8s-api.prod.internal:6443 "
                                     "--timeout 600 --delete-emptydir-data 1 --force 0 --kubeadm-reset 1")  # fmt: skip
    assert inputs["addPreviousOutputInEnv"] is False
    assert "stdin" not in inputs  # no credential (the guest acts as the node), no script
    assert rec.depends_on(drain, rec.named("cluster-node-access-cluster-role-binding"))  # deleted before the RBAC
    # The guest's drain step is the ubuntu user's agent copy; the host's retire step is the node's, waited for.
    assert f" --guest-step /home/ubuntu/.proxmox-gpu-cluster/agent/{bundle_name('drain')}/step.sh " in inputs["create"]
    assert rec.depends_on(drain, rec.named("cluster-pve-b-host-prep-agent"))
    for r in rec.resources:
        assert not any("CANARY-KUBECONFIG" in s for s in plain_strings(r.inputs)), r.name


def test_unprotected_workers_retire_unprotected() -> None:
    rec = plan_stack(base_spec())
    assert {r.name: r.protect for r in rec.of_type("command:remote:Command") if r.name.endswith("retirement-drain")} == {
        "cluster-mig-1-retirement-drain": False, "cluster-mig-2-retirement-drain": False, "cluster-ts-1-retirement-drain": False,
    }  # fmt: skip


def names_on_proxmox(rec: Recording) -> set[str]:
    out = {r.plain_inputs["name"] for r in rec.of_type(MAPPING)}
    out |= {r.plain_inputs["sourceRaw"]["fileName"] for r in rec.of_type("proxmoxve:index/fileLegacy:FileLegacy")}
    out |= {r.plain_inputs["fileName"] for r in rec.of_type("proxmoxve:download/file:File")}
    return out


def test_two_stacks_on_one_node_share_no_name() -> None:
    alpha, beta = (plan_stack(base_spec(), stack=s) for s in ("alpha", "beta"))
    assert names_on_proxmox(alpha) and not names_on_proxmox(alpha) & names_on_proxmox(beta)
    scope = StackScope("proxmox-gpu-cluster", "alpha")
    assert scope.mapping_id("pve1", "a100-0") in names_on_proxmox(alpha)
    assert scope.snippet_file_name("pve2") in names_on_proxmox(alpha)


def two_nodes(first: tuple[str, str], second: tuple[str, str]) -> dict[str, Any]:
    raw = base_spec()
    nodes = raw["proxmox"]["nodes"]
    nodes[0].update(name=first[0], gpus=[{"name": first[1], "pciPath": "0000:41:00", "model": "A10"}])
    nodes[1].update(name=second[0], gpus=[{"name": second[1], "pciPath": "0000:41:00", "model": "A10"}])
    raw["workers"] = [
        {"name": "w-1", "vmid": 2001, "node": first[0], "gpus": [first[1]]},
        {"name": "w-2", "vmid": 2002, "node": second[0], "gpus": [second[1]]},
    ]
    raw["quotas"] = []
    return raw


def test_node_and_gpu_names_with_dashes_never_collide() -> None:
    for first, second in ((("pve", "a-0"), ("pve-a", "0")), (("a", "pci-b"), ("a-pci", "b"))):
        rec = plan_stack(two_nodes(first, second))  # a duplicate URN would raise
        ids = sorted(r.plain_inputs["name"] for r in rec.of_type(MAPPING))
        assert len(set(ids)) == 2 and len({r.urn for r in rec.resources}) == len(rec.resources), ids


def test_two_urls_with_one_basename_get_two_files() -> None:
    raw = base_spec()
    raw["workers"][0]["image"] = {"cloudImageUrl": "https://mirror-a.example.test/jammy/server.img"}
    raw["workers"][1]["image"] = {"cloudImageUrl": "https://mirror-b.example.test/noble/server.img"}
    rec = plan_stack(raw)
    files = {r.plain_inputs["url"]: r.plain_inputs for r in rec.of_type("proxmoxve:download/file:File")}
    names = [f["fileName"] for f in files.values() if f["nodeName"] == "pve1"]
    assert len(names) == 2 and len(set(names)) == 2 and all(n.startswith("server-") for n in names)
    assert all(f["overwriteUnmanaged"] is True and f["overwrite"] is False for f in files.values())
    query = base_spec()
    query["workers"][0]["image"] = {"cloudImageUrl": "https://images.example.test/download?file=jammy.img"}
    (named,) = [
        r for r in plan_stack(query).of_type("proxmoxve:download/file:File") if "download" in r.plain_inputs["url"]
    ]
    assert named.plain_inputs["fileName"].startswith("jammy-") and named.plain_inputs["fileName"].endswith(".img")


def test_dra_in_the_operator_namespace_creates_one_namespace() -> None:
    raw = base_spec()
    raw["workers"][1]["dra"] = True
    raw["gpuOperator"]["dra"] = {"namespace": "gpu-operator"}
    rec = plan_stack(raw)
    names = sorted(r.plain_inputs["metadata"]["name"] for r in rec.of_type(NAMESPACE))
    assert names == ["gpu-operator", "proxmox-gpu-cluster"]  # the operator's and the rollout slots', once each
    assert rec.named("cluster-dra-driver-release").plain_inputs["namespace"] == "gpu-operator"


def test_acs_override_defers_isolation_to_host_verify() -> None:
    # A NIC shares the A10's group: refused as is (test_proxmox_layer), followed once the override is requested.
    raw = base_spec()
    raw["proxmox"]["nodes"][1].update(hostPrep=True, acsOverride=True)
    rec = plan_stack(raw, shared_group(raw))
    assert rec.outputs["iommuChecks"] == {"pve1": "plan", "pve2": "host-verify"}
    mapping = rec.named("cluster-pve2-pci-0000:18:00")
    assert rec.depends_on(mapping, rec.named("cluster-pve2-host-prep-verify"))
    assert (
        "--kernel-arg pcie_acs_override=downstream,multifunction"
        in rec.named("cluster-pve2-host-prep-verify").plain_inputs["create"]
    )


def test_the_plan_says_which_nodes_may_reboot(capsys: Any) -> None:
    assert main(["--placeholder-secrets", "prod"]) == 0
    text = capsys.readouterr().out
    assert "Disruption (what this stack may reboot, drain or replace; each step checks again):" in text
    assert "Proxmox node pve-a: may reboot only if its running kernel has the IOMMU off (Intel before kernel 6.8: " \
           "host prep adds intel_iommu=on) or a declared GPU will not come off its host driver at runtime, and only " \
           "when no VM or container runs on it" in text  # fmt: skip
    assert "cordoned, drained (at most 600 s, PodDisruptionBudgets respected), reset (kubeadm reset)" in text
    assert main(["--placeholder-secrets", "prod", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["disruption"]["hosts"]["pve-b"] == {
        "mayReboot": "when-idle", "onlyIfKernelLacks": "", "onlyIfIommuOff": False,
        "workers": ["gpu-a100-b", "gpu-a10-b"],
    }  # fmt: skip
    assert document["outputs"]["hostReboots"] == {"pve-a": "when-idle", "pve-b": "when-idle"}
