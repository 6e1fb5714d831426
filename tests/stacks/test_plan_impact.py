"""plan_impact: what a diff does once it runs, on realistic edits of the prod stack (planned offline, both sides)
and on hand-made plan documents for the corner cases."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from proxmox_gpu_cluster.core.dcgm_fields import DEFAULT_FIELDS
from proxmox_gpu_cluster.stacks.plan import plan, plan_document
from proxmox_gpu_cluster.stacks.plan.diff import Change, cluster_prefix, diff
from proxmox_gpu_cluster.stacks.plan.impact import (
    capacity_changes,
    gpu_losses,
    impact,
    impact_lines,
    step_reason,
)
from proxmox_gpu_cluster.stacks.plan.inputs import find_program, read_inputs
from proxmox_gpu_cluster.stacks.plan.specs import cluster_specs, spec_namespaces
from tests.support import ROOT

KEY = "proxmox-gpu-cluster:cluster"
CONTAINER_WORKERS = ["gpu-a10-a", "gpu-a10-b", "gpu-a100-a", "gpu-a100-b"]
Edit = Callable[[dict[str, Any]], None]


def prod_document(tmp: Path, edit: Edit | None = None) -> dict[str, Any]:
    """The plan document of Pulumi.prod.yaml after ``edit`` (of its cluster spec), planned as the CLI does."""
    raw = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())
    if edit is not None:
        edit(raw["config"][KEY])
    path = tmp / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump(raw))
    program = find_program(ROOT)
    document = read_inputs(path, [])[0]
    specs = cluster_specs(document, spec_namespaces(document, program.project))
    recording, capacity = plan(
        "prod", document, program.main, project=program.project, spec=specs, placeholder_secrets=True
    )
    return plan_document("prod", recording, capacity, specs, program.project)


@functools.cache
def prod_before() -> dict[str, Any]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return prod_document(Path(tmp))


def prod_impact(tmp: Path, edit: Edit) -> tuple[dict[str, Any], list[str], list[Change]]:
    """The impact of ``edit`` on prod, its lines and the changes."""
    before, after = prod_before(), prod_document(tmp, edit)
    changes = diff(before, after)
    data = impact(before, after, changes, cluster_prefix(after))
    return data, impact_lines(data), changes


def worker(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(w for w in spec["workers"] if w["name"] == name)


def test_time_slicing_replicas_double_the_advertised_gpus_and_restart_the_device_plugin(tmp_path: Path) -> None:
    def edit(spec: dict[str, Any]) -> None:
        for name in ("gpu-a10-a", "gpu-a10-b"):
            worker(spec, name)["timeSlicing"]["replicas"] = 8

    data, lines, _ = prod_impact(tmp_path, edit)
    assert "gpu-a10-a: nvidia.com/gpu 8 → 16" in lines
    assert "gpu-a10-b: nvidia.com/gpu 4 → 8" in lines
    assert data["gpuLosses"] == []  # more replicas: nobody loses a GPU
    plugin = [e for e in data["operator"] if e["daemonset"].startswith("nvidia-device-plugin")]
    # the config ConfigMap is renamed, so the daemonset's pod template changes: it rolls on every container node
    assert len(plugin) == 1 and plugin[0]["nodes"] == CONTAINER_WORKERS
    assert "devicePlugin.config.name" in plugin[0]["reason"]
    assert not [e for e in data["operator"] if "mig-manager" in e["daemonset"] or "driver" in e["daemonset"]]
    assert data["reboots"] == [] and data["workersRetired"] == []


def test_one_nodes_replicas_restart_every_device_plugin_not_only_that_node(tmp_path: Path) -> None:
    data, lines, _ = prod_impact(tmp_path, lambda s: worker(s, "gpu-a10-b")["timeSlicing"].update(replicas=2))
    assert "gpu-a10-b: nvidia.com/gpu 4 → 2" in lines
    assert [c["worker"] for c in data["gpuLosses"]] == ["gpu-a10-b"]
    assert any(line.startswith("Pods lose their GPU on gpu-a10-b: nvidia.com/gpu 4 → 2") for line in lines)
    assert [e["nodes"] for e in data["operator"]] == [CONTAINER_WORKERS]


def test_removing_a_worker_retires_it_exactly_as_its_delete_command_does(tmp_path: Path) -> None:
    data, lines, _ = prod_impact(tmp_path, lambda s: s["workers"].remove(worker(s, "gpu-a10-b")))
    [retired] = data["workersRetired"]
    assert retired["worker"] == "gpu-a10-b" and retired["vmid"] == 3202 and retired["host"] == "pve-b"
    assert retired["steps"][0] == "cordoned" and retired["steps"][-2:] == ["Node deleted", "kubeadm reset"]
    assert "at most 600 s" in retired["steps"][1] and retired["then"] == "VM destroyed"
    assert "skipped with a warning only if qm finds the VM stopped or its guest agent gone" in retired["steps"][1]
    assert retired["protected"] is True  # prod protects its workers: up stops before anything runs
    assert any(line.startswith("Worker gpu-a10-b (VM 3202 on pve-b) retired: cordoned") for line in lines)
    assert "gpu-a10-b: nvidia.com/gpu 4 → 0 (worker removed)" in lines
    assert [c["resource"] for c in data["gpuLosses"]] == ["nvidia.com/gpu"]


def test_an_unprotected_worker_removal_is_not_flagged(tmp_path: Path) -> None:
    def edit(spec: dict[str, Any]) -> None:
        spec["workers"].remove(worker(spec, "gpu-a10-b"))

    def unprotect(spec: dict[str, Any]) -> None:
        worker(spec, "gpu-a10-b")["protect"] = False

    before, after = prod_document(tmp_path, unprotect), prod_document(tmp_path, edit)
    data = impact(before, after, diff(before, after), "cluster-")
    assert [w["protected"] for w in data["workersRetired"]] == [False]
    assert not any("will fail: protected" in line for line in impact_lines(data))


def test_a_mig_geometry_change_names_mig_manager_and_the_pods_losing_a_profile(tmp_path: Path) -> None:
    data, lines, _ = prod_impact(tmp_path, lambda s: worker(s, "gpu-a100-a").update(mig="all-2g.10gb"))
    assert "gpu-a100-a: nvidia.com/mig-1g.5gb 7 → 0 (gone)" in lines
    assert "gpu-a100-a: nvidia.com/mig-2g.10gb 0 → 3 (new)" in lines
    assert [(c["worker"], c["resource"]) for c in data["gpuLosses"]] == [("gpu-a100-a", "nvidia.com/mig-1g.5gb")]
    manager = [e for e in data["operator"] if e["daemonset"] == "nvidia-mig-manager"]
    applies = [e for e in manager if e["action"] == "applies a new MIG geometry"]
    assert [e["nodes"] for e in applies] == [["gpu-a100-a"]]
    assert "all-1g.5gb → all-2g.10gb" in applies[0]["reason"]
    # the MIG config ConfigMap is renamed too: the daemonset restarts on every node with a MIG-capable GPU
    assert [e["nodes"] for e in manager if e["action"] == "restarts"] == [["gpu-a100-a", "gpu-a100-b"]]
    restart = [r for r in data["reboots"] if r["kind"] == "vm"]
    assert [r["machine"] for r in restart] == ["gpu-a100-a"]
    assert "all-1g.5gb → all-2g.10gb" in restart[0]["reason"] and "MIG mode" in restart[0]["may"]


def test_a_driver_change_in_operator_mode_names_the_driver_daemonset(tmp_path: Path) -> None:
    def operator(spec: dict[str, Any]) -> None:
        spec["gpuOperator"]["driverMode"] = "operator"

    def bumped(spec: dict[str, Any]) -> None:
        operator(spec)
        spec["gpuOperator"]["driverBranch"] = "595"

    before, after = prod_document(tmp_path, operator), prod_document(tmp_path, bumped)
    data = impact(before, after, diff(before, after), "cluster-")
    [driver] = [e for e in data["operator"] if e["daemonset"] == "nvidia-driver-daemonset"]
    assert driver["nodes"] == CONTAINER_WORKERS
    assert "driver.version: 580." in driver["reason"] and "→ 595." in driver["reason"]
    assert "1 node(s) at a time" in driver["reason"]  # the spec's maxParallelUpgrades, printed as an integer


def test_a_driver_change_in_host_mode_restarts_no_operator_daemonset(tmp_path: Path) -> None:
    data, _, _ = prod_impact(tmp_path, lambda s: s["gpuOperator"].update(driverBranch="595"))
    assert data["operator"] == []
    guests = [r for r in data["reboots"] if r["kind"] == "guest"]
    assert sorted(r["machine"] for r in guests) == CONTAINER_WORKERS
    assert all("--branch 580 → 595" in r["reason"] for r in guests)


def test_a_host_prep_input_change_lists_the_host_reboot_with_its_reason(tmp_path: Path) -> None:
    data, lines, _ = prod_impact(tmp_path, lambda s: s["proxmox"]["nodes"][1].update(acsOverride=True))
    [host] = [r for r in data["reboots"] if r["kind"] == "host"]
    assert host["machine"] == "pve-b" and host["mayReboot"] == "when-idle"
    assert host["reason"] == "--acs-override 0 → 1"
    assert host["may"].startswith("the Proxmox node, when its running kernel lacks")
    assert any(line.startswith("Proxmox host pve-b: pve-b-host-prep-prep runs again (--acs-override 0 → 1)")
               for line in lines)  # fmt: skip
    assert data["capacity"] == [] and data["operator"] == []


def test_a_new_metric_restarts_dcgm_exporter_and_an_alert_threshold_restarts_nothing(tmp_path: Path) -> None:
    def threshold(spec: dict[str, Any]) -> None:
        spec["gpuOperator"]["monitoring"]["alerts"]["temperatureWarningCelsius"] = 80

    data, _, changes = prod_impact(tmp_path, threshold)
    assert changes and data["operator"] == []

    def metric(spec: dict[str, Any]) -> None:
        spec["gpuOperator"]["monitoring"]["metrics"] = [*DEFAULT_FIELDS, "DCGM_FI_DEV_MEMORY_TEMP"]

    data, _, _ = prod_impact(tmp_path, metric)
    [dcgm] = data["operator"]
    assert dcgm["daemonset"] == "nvidia-dcgm-exporter" and dcgm["nodes"] == CONTAINER_WORKERS
    assert "dcgmExporter.config.name" in dcgm["reason"] and data["gpuLosses"] == []


def test_capacity_changes_cover_new_and_removed_workers_and_dra_devices() -> None:
    def row(worker: str, resources: dict[str, int], devices: dict[str, int] | None = None) -> dict[str, Any]:
        return {"worker": worker, "resources": resources, "devices": devices or {}, "workload": "container"}

    before = {"capacity": [row("a", {"nvidia.com/gpu": 2}), row("b", {"nvidia.com/gpu": 1})]}
    after = {"capacity": [row("a", {}, {"gpu.nvidia.com": 2}), row("c", {"nvidia.com/gpu": 4})]}
    got = {(c["worker"], c["resource"]): (c["before"], c["after"], c["note"]) for c in capacity_changes(before, after)}
    assert got == {
        ("a", "gpu.nvidia.com (DRA)"): (0, 2, "new"),
        ("a", "nvidia.com/gpu"): (2, 0, "gone"),
        ("b", "nvidia.com/gpu"): (1, 0, "worker removed"),
        ("c", "nvidia.com/gpu"): (0, 4, "worker added"),
    }
    assert {(c["worker"], c["resource"]) for c in gpu_losses(capacity_changes(before, after))} == {
        ("a", "nvidia.com/gpu"),
        ("b", "nvidia.com/gpu"),
    }


def test_a_step_reason_never_shows_a_secret_and_names_the_changed_arguments() -> None:
    def res(create: str, stdin: str = "[secret]") -> dict[str, Any]:
        return {"inputs": {"create": create, "stdin": stdin}}

    change = Change("u", "command:remote:Command", "x-bootstrap-join", "update", ("stdin",))
    assert step_reason(res("bash a/step.sh --x 1"), res("bash a/step.sh --x 1"), change) == "stdin changed (secret)"
    old, new = res("sudo -n bash p/s-1/step.sh --gpu a --gpu b -- --t 5"), res("bash p/s-2/step.sh --gpu a -- --t 6")
    assert step_reason(old, new, Change("u", "t", "n", "update", ("create",))) == "--gpu a b → a, guest --t 5 → 6"
    bundle = Change("u", "t", "n", "update", ("create",), "drain aaa→bbb")
    assert step_reason(res("bash p/a/step.sh --n 1"), res("bash p/b/step.sh --n 1"), bundle) == "agent drain aaa→bbb"
    # keyed fingerprints (a diff's shared random key) are secrets too: said, never shown
    fingerprinted = step_reason(
        res("bash a/step.sh", "[secret:0a1b2c]"), res("bash a/step.sh", "[secret:3d4e5f]"), change
    )
    assert fingerprinted == "stdin changed (secret)"
    secret_create = Change("u", "t", "n", "update", ("create",))
    assert step_reason(res("[secret:0a1b2c]"), res("[secret:3d4e5f]"), secret_create) == "create changed (secret)"
    # a command that cannot be split is compared whole, still without interpretation
    assert "(command)" in step_reason(res("echo 'x"), res("echo 'y"), Change("u", "t", "n", "update", ("create",)))


def test_without_plan_changes_there_is_no_impact() -> None:
    document = copy.deepcopy(prod_before())
    data = impact(document, document, [], "cluster-")
    assert all(not v for v in data.values()) and impact_lines(data) == []


def test_an_operator_chart_bump_rolls_the_operands_everywhere_and_touches_no_machine(tmp_path: Path) -> None:
    data, _, _ = prod_impact(tmp_path, lambda s: s["gpuOperator"].update(chartVersion="v25.10.1"))
    [chart] = data["operator"]
    assert chart["daemonset"] == "every GPU Operator daemonset" and chart["nodes"] == CONTAINER_WORKERS
    assert chart["reason"].startswith("chart v26.7.0 → v25.10.1")
    assert data["reboots"] == [] and data["capacity"] == [] and data["workersRetired"] == []


def test_a_replaced_vm_is_retired_first_and_says_which_input_forces_it(tmp_path: Path) -> None:
    data, _, _ = prod_impact(tmp_path, lambda s: worker(s, "gpu-a10-b").update(vmid=3299))
    assert data["vmsReplaced"] == [{"vm": "gpu-a10-b-vm", "reason": "vmId 3202 → 3299"}]
    [retired] = data["workersRetired"]  # the retirement step goes with the VM (replaceWith), draining it first
    assert (retired["worker"], retired["vmid"], retired["then"]) == (
        "gpu-a10-b",
        3202,
        "VM replaced (deleted first, then created)",
    )
    guests = [r for r in data["reboots"] if r["machine"] == "gpu-a10-b"]
    assert guests and all(r["reason"] == "replaced along with its replaceWith target" for r in guests)
