"""MIG modes in the plan (issue 24, part 3): which GPU must run which MIG mode (what mig-manager's config for the
node's label says), the driver and MIG steps that set it, the Proxmox-side restart step between the label patch and
the end step, and the disruption section that counts the VM restarts."""

from __future__ import annotations

from typing import Any

from proxmox_gpu_cluster.core.cluster_nodes import worker_node
from proxmox_gpu_cluster.core.guest_spec import bootstrap_spec
from proxmox_gpu_cluster.core.mig import mig_modes
from proxmox_gpu_cluster.render.disruption import disruption, disruption_lines
from proxmox_gpu_cluster.render.guest_scripts import driver_args
from tests.support import base_spec, load_spec, plan_stack


def host_mode(mode: str = "host") -> dict[str, Any]:
    raw = base_spec()
    raw["gpuOperator"]["driverMode"] = mode
    return raw


def test_each_mig_capable_gpu_gets_the_mode_of_its_mig_manager_config() -> None:
    spec = load_spec(host_mode())
    modes = {w.name: mig_modes(worker_node(spec, w)) for w in spec.workers}
    assert modes == {"mig-1": ("0=1",), "mig-2": ("0=1",), "ts-1": ()}  # A10s have no MIG
    raw = host_mode()
    raw["workers"][0]["sharing"] = "time-slicing"
    raw["workers"][0]["timeSlicing"] = {"replicas": 2}
    del raw["workers"][0]["mig"]
    spec = load_spec(raw)
    assert mig_modes(worker_node(spec, spec.workers[0])) == ("0=0",)  # all-disabled: MIG off on the A100


def test_only_host_driver_workers_get_modes_in_their_driver_step() -> None:
    spec = load_spec(host_mode())
    mig1 = bootstrap_spec(spec, spec.workers[0])
    args = driver_args(mig1)
    assert mig1.mig_modes == ("0=1",) and args[args.index("--mig-mode") : args.index("--rollout")] == [
        "--mig-mode",
        "0=1",
    ]
    operator = load_spec(host_mode("operator"))  # the driver container runs after the join: not in the driver step
    mig1 = bootstrap_spec(operator, operator.workers[0])
    assert mig1.mig_modes == ("0=1",) and "--mig-mode" not in driver_args(mig1)


def test_the_restart_step_runs_on_the_vms_node_between_the_label_patch_and_the_end() -> None:
    rec = plan_stack(host_mode())
    for worker, vmid in (("mig-1", 2001), ("mig-2", 2002)):
        begin, end = rec.named(f"cluster-{worker}-mig-begin"), rec.named(f"cluster-{worker}-mig-end")
        restart, patch = rec.named(f"cluster-{worker}-mig-restart"), rec.named(f"cluster-gpu-nodes-{worker}")
        create = restart.plain_inputs["create"]
        assert "/mig-restart-" in create and f"--vmid {vmid} --node-name {worker} " in create
        assert "--phase restart " in create and "--mig-mode 0=1" in create
        assert restart.plain_inputs["connection"]["host"] == "192.0.2.11"  # pve1, where the VM runs
        assert "--mig-mode 0=1" in begin.plain_inputs["create"]
        assert rec.depends_on(restart, patch) and rec.depends_on(restart, begin) and rec.depends_on(end, restart)
        assert rec.depends_on(patch, begin) and not rec.depends_on(begin, patch)
    assert not [r for r in rec.resources if r.name == "cluster-ts-1-mig-restart"]


def test_the_disruption_section_counts_the_vm_restarts_of_mig_mode_changes() -> None:
    spec = load_spec(host_mode())
    restarts = disruption(spec)["migModeRestarts"]
    assert restarts is not None and restarts["workers"] == ["mig-1", "mig-2"] and restarts["perChangeAtMost"] == 1
    line = next(x for x in disruption_lines(spec) if x.startswith("MIG mode changes"))
    assert "(2 worker(s): mig-1, mig-2)" in line and "at most 2 VM restart(s) when every one changes" in line
    assert "only if the guest reports the mode pending a GPU reset" in line
    elsewhere = host_mode()
    elsewhere["kubernetes"]["joinMethod"] = "none"  # no rollout: nothing restarts the VMs
    assert disruption(load_spec(elsewhere))["migModeRestarts"] is None
    assert not any(x.startswith("MIG mode changes") for x in disruption_lines(load_spec(elsewhere)))
