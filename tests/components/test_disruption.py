"""What a spec may disrupt (pure): per Proxmox node whether host prep may reboot it, and the worker removal order."""

from __future__ import annotations

from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.render.disruption import disruption, disruption_lines, host_reboot
from tests.support import base_spec, make_vm_worker


def test_each_policy() -> None:
    cases = {"when-idle": "when-idle", "always": "yes", "never": "no"}
    for policy, may in cases.items():
        raw = base_spec()
        raw["proxmox"]["nodes"][1].update(hostPrep=True, rebootPolicy=policy)
        spec = load_spec(raw)
        reboot = host_reboot(spec, spec.node("pve2"))
        assert reboot.may_reboot == may and reboot.reason == "" and reboot.iommu_off  # pve2 is an Intel node
        assert reboot.workers == ("ts-1",)
    spec = load_spec(base_spec())
    assert host_reboot(spec, spec.node("pve1")).text == "pve1: no host prep; never changed or rebooted by this stack"


def test_lines_and_document() -> None:
    raw = base_spec()
    raw["proxmox"]["nodes"][1].update(hostPrep=True, rebootPolicy="always")
    raw["workers"][2]["protect"] = True
    raw["kubernetes"]["drain"] = {"timeoutSeconds": 120}
    spec = load_spec(raw)
    lines = disruption_lines(spec)
    assert lines[1] == (
        "Proxmox node pve2: may reboot only if its running kernel has the IOMMU off (Intel before kernel 6.8: host "
        "prep adds intel_iommu=on) or a declared GPU will not come off its host driver at runtime, even with guests "
        "running (rebootPolicy always); this stack's VMs there go down with it: ts-1"
    )
    assert "drained (at most 120 s, PodDisruptionBudgets respected), reset (kubeadm reset)" in lines[2]
    assert lines[3].startswith("First provisioning: every worker VM starts once")
    assert lines[4] == "Protected from replacement and removal: ts-1"
    document = disruption(spec)
    assert document["workerRemoval"] == {
        "order": ["cordon", "drain", "kubeadm reset", "delete Node", "destroy VM"],
        "drainTimeoutSeconds": 120,
        "protected": ["ts-1"],
    }
    raw["kubernetes"]["joinMethod"] = "none"
    assert "kubeadm reset" not in disruption(load_spec(raw))["workerRemoval"]["order"]  # type: ignore[index]


def test_which_hosts_still_need_a_reboot_and_why() -> None:
    # Issue 24: an AMD node's IOMMU is on by default and an Intel node's from kernel 6.8: neither is rebooted for
    # IOMMU words; only what the spec asks for (iommu=pt, the ACS override) or an Intel kernel with it off is.
    raw = base_spec()
    raw["proxmox"]["nodes"][0].update(hostPrep=True)  # pve1: AMD
    raw["proxmox"]["nodes"][1].update(hostPrep=True, iommuPassthrough=True, rebootPolicy="never")  # pve2: Intel
    spec = load_spec(raw)
    amd, intel = host_reboot(spec, spec.node("pve1")), host_reboot(spec, spec.node("pve2"))
    assert (amd.reason, amd.iommu_off) == ("", False)
    assert amd.text == (
        "pve1: may reboot only if a declared GPU will not come off its host driver at runtime, and only when no VM or "
        "container runs on it (rebootPolicy when-idle: otherwise the step fails and names them)"
    )
    assert (intel.reason, intel.iommu_off) == ("iommu=pt", True)
    assert intel.text.startswith(
        "pve2: never rebooted by this stack (rebootPolicy never): if its running kernel has the IOMMU off (Intel "
        "before kernel 6.8: host prep adds intel_iommu=on) or its running kernel lacks iommu=pt or a declared GPU"
    )
    hosts = disruption(spec)["hosts"]
    assert hosts["pve1"] == {  # type: ignore[index]
        "mayReboot": "when-idle", "onlyIfKernelLacks": "", "onlyIfIommuOff": False, "workers": ["mig-1", "mig-2"]
    }  # fmt: skip


def test_operator_mode_says_how_a_driver_change_rolls() -> None:
    raw = base_spec()
    raw["gpuOperator"].update(driverMode="operator", kernelModuleType="open")
    lines = disruption_lines(load_spec(raw))
    roll = [line for line in lines if line.startswith("Driver changes (operator mode)")]
    assert roll == [
        "Driver changes (operator mode): the operator's upgrade controller rolls them over the 3 container worker(s), "
        "1 at a time (at most 1 unavailable), drained first"
    ]
    assert not [line for line in lines if line.startswith("Guest reboots")]
    assert disruption(load_spec(raw))["operatorDriverRoll"] == {
        "autoUpgrade": True, "maxParallelUpgrades": 1, "maxUnavailable": 1, "drain": True
    }  # fmt: skip
    gate = [line for line in lines if line.startswith("After every change to the GPU stack")]
    assert gate and "within 600 s" in gate[0]


def test_a_branch_only_pin_says_builds_may_differ() -> None:
    raw = base_spec()
    raw["gpuOperator"].pop("driverVersion", None)
    lines = disruption_lines(load_spec(raw))
    assert any(line.startswith("Driver builds: only branch 580 is pinned") for line in lines)
    raw["gpuOperator"]["driverVersion"] = "580.95.05"
    assert not any(line.startswith("Driver builds:") for line in disruption_lines(load_spec(raw)))


def test_rolling_changes_say_how_many_nodes_at_a_time() -> None:
    raw = base_spec()
    raw["kubernetes"]["drain"] = {"maxUnavailable": 2}
    spec = load_spec(raw)
    roll = disruption(spec)["rollingChanges"]
    assert roll == {
        "order": ["take slot", "cordon", "drain", "change", "reboot if needed", "verify", "uncordon", "release slot"],
        "maxUnavailable": 2, "nodes": ["mig-1", "mig-2", "ts-1"], "rounds": 2, "slotWaitSeconds": 21600,
    }  # fmt: skip
    line = next(x for x in disruption_lines(spec) if x.startswith("Rolling changes"))
    assert "at most 2 of 3 node(s) at a time, cluster-wide, so at least 2 round(s)" in line
    # the fields that roll are the change-class table's, the same the offline diff announces drains for
    assert "GpuOperatorSpec.driverVersion" in line and "GpuAssignment.mig" in line
    assert "DrainSpec.maxUnavailable" not in line and "ProxmoxSpec.sshAgent" not in line
    elsewhere = base_spec()
    elsewhere["kubernetes"]["joinMethod"] = "none"
    assert disruption(load_spec(elsewhere))["rollingChanges"] is None
    assert any("not drained" in x for x in disruption_lines(load_spec(elsewhere)))


def test_first_provisioning_restarts_no_vm_and_reboots_only_kubevirt_guests() -> None:
    spec = load_spec(make_vm_worker(base_spec(), 2, "vm-passthrough"))
    boots = disruption(spec)["firstBoot"]
    assert boots == {
        "mig-1": {"vmStarts": 1, "vmRestarts": 0, "guestReboots": 0},  # an A100: large BAR, still one start
        "mig-2": {"vmStarts": 1, "vmRestarts": 0, "guestReboots": 0},
        "ts-1": {"vmStarts": 1, "vmRestarts": 0, "guestReboots": 1},
    }
    line = next(x for x in disruption_lines(spec) if x.startswith("First provisioning"))
    assert "0 VM restarts; guest reboots: 1 (ts-1: KubeVirt workers boot once more with the IOMMU on)" in line


def test_the_plan_says_where_each_worker_s_kernel_module_comes_from() -> None:
    raw = base_spec()
    raw["kubevirt"] = {"enabled": True}
    raw["gpuOperator"]["driverVersion"] = "580.95.05"
    make_vm_worker(raw, 2, "vm-passthrough")
    spec = load_spec(raw)
    assert disruption(spec)["kernelModules"] == {
        "mig-1": "precompiled-or-dkms", "mig-2": "precompiled-or-dkms", "ts-1": "none"
    }  # fmt: skip
    line = next(line for line in disruption_lines(spec) if line.startswith("Driver kernel modules"))
    assert line.startswith(
        "Driver kernel modules (mig-1, mig-2): Ubuntu's precompiled, signed linux-modules-nvidia-580-server-open-"
        "<kernel> when the archive has it for the guest's running kernel built against the chosen build (no DKMS "
        "build), DKMS otherwise; Ubuntu builds them against a branch's newest build only, so the pinned 580.95.05"
    )
    raw["gpuOperator"].update(driverMode="operator")
    spec = load_spec(raw)
    assert set(disruption(spec)["kernelModules"].values()) == {"operator", "none"}  # type: ignore[union-attr]
    assert not any(line.startswith("Driver kernel modules") for line in disruption_lines(spec))
