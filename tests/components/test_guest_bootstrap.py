"""GuestBootstrap under the mock engine: the step chain per worker, independence of workers, secrets, change
semantics (what a driver bump or a no-op re-plan changes), and the stack wiring."""

from __future__ import annotations

import base64
import itertools
import json
import shlex
import subprocess
import sys
from typing import Any

import pulumi
import pulumi_command as command
import pytest

from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec, bootstrap_spec, hardware_key
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.guest.guest_bootstrap import GuestBootstrap, GuestBootstrapArgs
from proxmox_gpu_cluster.render.agent_bundle import secrets_stdin, step_command
from proxmox_gpu_cluster.render.guest_scripts import after_key, driver_args, rollout_args, verify_args
from proxmox_gpu_cluster.testing import RecordedResource, Recording, is_secret, redact, run
from tests.support import ROOT, SECRETS, base_spec, make_vm_worker, plain_strings, plan_stack

BOOTSTRAP = "proxmox-gpu-cluster:guest_bootstrap:GuestBootstrap"
REMOTE = "command:remote:Command"
LOCAL = "command:local:Command"
COPY = "command:remote:CopyToRemote"
VM = "proxmoxve:index/vmLegacy:VmLegacy"
ORDER = ("agent", "vm-restart", "cloud-init", "driver", "driver-wait", "runtime", "join", "verify")


def run_bundle(step: str, user: str = "ubuntu") -> str:
    """The start of ``step``'s command: its installed bundle, through sudo unless root."""
    return step_command(user, step, [])


def steps(rec: Recording, worker: str) -> dict[str, RecordedResource]:
    component = rec.named(f"cluster-{worker}-bootstrap")
    prefix = f"cluster-{worker}-bootstrap-"
    return {r.name.removeprefix(prefix): r for r in rec.children(component)}


def test_each_worker_gets_the_steps_in_order() -> None:
    rec = plan_stack(base_spec())
    for worker in ("mig-1", "mig-2", "ts-1"):
        chain = steps(rec, worker)
        assert set(chain) == set(ORDER)
        for earlier, later in itertools.pairwise(ORDER):
            assert chain[earlier].urn in chain[later].dependencies, (worker, earlier, later)
            assert not rec.depends_on(chain[earlier], chain[later])
        assert {r.type for r in chain.values()} == {REMOTE, LOCAL, COPY}
        assert chain["driver-wait"].type == LOCAL and chain["agent"].type == COPY


def test_steps_wait_for_their_own_vm_and_never_for_another_worker() -> None:
    rec = plan_stack(base_spec())
    workers = ("mig-1", "mig-2", "ts-1")
    for worker in workers:
        vm = rec.named(f"cluster-{worker}-vm")
        for step in steps(rec, worker).values():
            assert rec.depends_on(step, vm), step.name
            assert step.replace_with == [vm.urn], step.name
            for other in workers:
                if other == worker:
                    continue
                assert not rec.depends_on(step, rec.named(f"cluster-{other}-vm")), (step.name, other)
                assert not rec.depends_on(step, rec.named(f"cluster-{other}-bootstrap")), (step.name, other)


def test_static_address_still_waits_for_the_vm() -> None:
    rec = plan_stack(base_spec())
    cloud_init = steps(rec, "ts-1")["cloud-init"]  # ts-1 has a static 192.0.2.60
    assert rec.named("cluster-ts-1-vm").urn in cloud_init.property_dependencies["connection"]


def test_large_bar_restart_comes_before_the_bootstrap() -> None:
    rec = plan_stack(base_spec())  # token mode: the A100 workers get their MMIO window via qm set
    assert rec.depends_on(steps(rec, "mig-1")["cloud-init"], rec.named("cluster-mig-1-large-bar"))


def test_node_labels_wait_for_their_own_bootstrap_only() -> None:
    rec = plan_stack(base_spec())
    for worker in ("mig-1", "mig-2", "ts-1"):
        patch = rec.named(f"cluster-gpu-nodes-{worker}")
        assert rec.depends_on(patch, steps(rec, worker)["verify"])
        for other in {"mig-1", "mig-2", "ts-1"} - {worker}:
            assert not rec.depends_on(patch, rec.named(f"cluster-{other}-bootstrap-verify"))


def test_connection_uses_the_secret_key_with_bounded_retries() -> None:
    rec = plan_stack(base_spec())
    for role, step in steps(rec, "ts-1").items():
        if step.type != REMOTE:
            continue
        connection = step.inputs["connection"]
        assert is_secret(connection) or is_secret(connection.get("privateKey")), step.name
        plain = step.plain_inputs["connection"]
        # the VM-restart step runs on the VM's Proxmox node, as its SSH user; every other one on the guest
        want = ("192.0.2.12", "root") if role == "vm-restart" else ("192.0.2.60", "ubuntu")
        assert (plain["host"], plain["user"]) == want, step.name
        assert plain["dialErrorLimit"] == 30 and plain["perDialTimeout"] == 10


def test_join_secrets_only_travel_secret_on_stdin() -> None:
    rec = plan_stack(base_spec())
    join = steps(rec, "ts-1")["join"]
    assert is_secret(join.inputs["stdin"])
    stdin = join.plain_inputs["stdin"]
    expected = {"PGC_JOIN_TOKEN": SECRETS["kubeadmJoinToken"], "PGC_CA_CERT_HASH": SECRETS["kubeadmCaCertHash"]}
    assert stdin == secrets_stdin(expected)  # the secrets and nothing else: no script rides in state
    assert join.plain_inputs["create"] == (
        f"{run_bundle('join')} --node-name ts-1 --api-endpoint k8s.example.test:6443 --minor 34 --rollout 1 "
        "--rollout-node ts-1 --rollout-api k8s.example.test:6443"
    )  # the rollout settings: a joined node's minor upgrade takes a slot
    assert join.plain_inputs["logging"] == "none"
    assert set(join.additional_secret_outputs) >= {"stdin", "stdout", "stderr"}


def test_no_canary_secret_outside_a_secret_anywhere_in_the_plan() -> None:
    rec = plan_stack(base_spec())
    canaries = [v for v in SECRETS.values()] + ["CANARY"]
    canaries += [base64.b64encode(c.encode()).decode()[:-4] for c in canaries]  # as stdin carries them

    bootstrap = [r for r in rec.resources if "-bootstrap" in r.name]
    assert bootstrap
    leaks = [(r.name, s) for r in bootstrap for s in plain_strings(r.inputs) if any(c in s for c in canaries)]
    assert leaks == []
    token = base64.b64encode(SECRETS["kubeadmJoinToken"].encode()).decode()
    assert token in json.dumps([r.plain_inputs for r in bootstrap])  # it did get there


def test_plan_json_has_no_canary(tmp_path: Any) -> None:
    stack_file = tmp_path / "Pulumi.canary.yaml"
    config: dict[str, Any] = {"proxmox-gpu-cluster:cluster": base_spec()}
    config.update({f"proxmox-gpu-cluster:{k}": {"secure": "AAAA"} for k in SECRETS})
    stack_file.write_text(json.dumps({"config": config}))
    proc = subprocess.run(
        [sys.executable, "-m", "proxmox_gpu_cluster.plan", "--config", str(stack_file), "canary", "--json"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert "-bootstrap-join" in proc.stdout
    for value in ("plan-placeholder-kubeadmJoinToken", "plan-placeholder-kubeadmCaCertHash", "plan-placeholder-ssh"):
        assert value not in proc.stdout
    assert plan


def plain_inputs_by_name(rec: Recording) -> dict[str, dict[str, Any]]:
    return {r.name: r.plain_inputs for r in rec.resources if "-bootstrap-" in r.name}


def test_replanning_the_same_spec_changes_nothing() -> None:
    assert plain_inputs_by_name(plan_stack(base_spec())) == plain_inputs_by_name(plan_stack(base_spec()))


def test_driver_version_bump_updates_only_the_driver_step_its_wait_and_the_gate() -> None:
    before = plan_stack(base_spec())
    raw = base_spec()
    raw["gpuOperator"]["driverVersion"] = "580.105.08"
    after = plan_stack(raw)
    old, new = plain_inputs_by_name(before), plain_inputs_by_name(after)
    changed = {name.split("-bootstrap-")[1] for name in new if new[name] != old[name]}
    assert changed == {"driver", "verify"}  # driver-wait then updates from the driver's new output
    assert "--version 580.105.08" in new["cluster-ts-1-bootstrap-driver"]["create"]
    # Updates, not replacements: nothing in the bootstrap sets triggers (pulumi-command replaces on any trigger
    # change) and the wait step takes the driver output as an ordinary input.
    for r in after.resources:
        if "-bootstrap-" in r.name:
            assert "triggers" not in r.inputs, r.name
    wait = after.named("cluster-ts-1-bootstrap-driver-wait")
    assert after.named("cluster-ts-1-bootstrap-driver").urn in wait.property_dependencies["environment"]


def test_worker_vms_never_purge_their_driver() -> None:
    # A worker VM's driver goes with the VM; a purge would only race the node's drain when the VM is replaced.
    rec = plan_stack(base_spec())
    assert all("delete" not in steps(rec, w)["driver"].inputs for w in ("mig-1", "mig-2", "ts-1"))
    raw = base_spec()
    raw["guest"]["purgeDriverOnDestroy"] = True
    with pytest.raises(SpecError, match=r"cluster\.guest\.purgeDriverOnDestroy: unknown key"):
        load_spec(raw)


def test_join_method_none_skips_the_join_step_and_its_secrets() -> None:
    raw = base_spec()
    raw["kubernetes"]["joinMethod"] = "none"
    rec = plan_stack(raw)
    chain = steps(rec, "ts-1")
    assert "join" not in chain
    assert chain["runtime"].urn in chain["verify"].dependencies


def test_operator_driver_mode_leaves_driver_and_toolkit_to_the_operator() -> None:
    raw = base_spec()
    raw["gpuOperator"]["driverMode"] = "operator"
    chain = steps(plan_stack(raw), "ts-1")
    assert "--mode operator" in chain["driver"].plain_inputs["create"]
    assert chain["runtime"].plain_inputs["create"] == f"{run_bundle('runtime')} --toolkit 0"
    assert "--nvidia-smi 0" in chain["verify"].plain_inputs["create"]


def test_verify_expects_every_assigned_gpu() -> None:
    rec = plan_stack(base_spec())
    chain = steps(rec, "ts-1")
    hardware = shlex.split(rec.named("cluster-ts-1-bootstrap-vm-restart").plain_inputs["create"])
    key = after_key(
        chain["driver"].plain_inputs["create"],
        chain["join"].plain_inputs["create"],
        hardware[hardware.index("--hardware") + 1],
    )
    assert chain["verify"].plain_inputs["create"] == (
        f"{run_bundle('verify')} --gpu 10de:2236=NVIDIA-A10 --gpu 10de:2236=NVIDIA-A10 --nvidia-smi 1 --driver 580 "
        f"--containerd-nvidia 1 --cpus 8 --memory-mib 32768 --kubernetes 34 --after {key} --rollout 1 "
        "--rollout-node ts-1 --rollout-api k8s.example.test:6443"
    )  # the rollout settings are all at their defaults, which the script has too


@pytest.mark.parametrize(
    ("what", "edit"),
    [
        ("kernel-module kind", lambda raw: raw["gpuOperator"].update(kernelModuleType="proprietary")),
        ("network bridge", lambda raw: raw["workers"][2].setdefault("network", {}).update(bridge="vmbr9")),
    ],
)
def test_verify_runs_again_whenever_a_step_that_may_cordon_the_node_does(what: str, edit: Any) -> None:
    # Neither changes what verify checks; both rerun a step that may cordon the node (the driver step, the VM
    # restart), whose uncordon is verify's.
    before = steps(plan_stack(base_spec()), "ts-1")
    raw = base_spec()
    edit(raw)
    after = steps(plan_stack(raw), "ts-1")
    assert before["verify"].plain_inputs["create"] != after["verify"].plain_inputs["create"], what


@pytest.mark.parametrize(
    ("kind", "branch", "expected"),
    [("auto", "580", "open"), ("auto", "550", "proprietary"), ("proprietary", "580", "proprietary")],
)
def test_kernel_module_type(kind: str, branch: str, expected: str) -> None:
    raw = base_spec()
    raw["gpuOperator"].update(kernelModuleType=kind, driverBranch=branch)
    spec = load_spec(raw)
    assert bootstrap_spec(spec, spec.workers[0]).kernel_modules == expected


def test_kubevirt_workers_get_no_driver_or_toolkit() -> None:
    spec = load_spec(make_vm_worker(base_spec(), 2, "vm-passthrough"))
    b = bootstrap_spec(spec, spec.workers[2])
    assert (b.driver_mode, b.toolkit, b.cdi) == ("vfio", False, False)
    assert (b.kernel_args, b.kvm) == (("intel_iommu=on", "iommu=pt"), True)
    assert driver_args(b)[-4 - len(rollout_args(b)) :] == ["--kernel-arg", "iommu=pt", "--vfio-id", "10de:2236",
                                                           *rollout_args(b)]  # fmt: skip
    vgpu = load_spec(make_vm_worker(base_spec(), 2, "vm-vgpu"))
    b = bootstrap_spec(vgpu, vgpu.workers[2])
    assert (b.driver_mode, b.toolkit, b.kernel_args, b.kvm) == ("operator", False, ("intel_iommu=on", "iommu=pt"), True)
    container = bootstrap_spec(spec, spec.workers[0])
    assert (container.kernel_args, container.kvm) == ((), False)
    assert "--vfio-id" not in driver_args(container) and "--kernel-arg" not in verify_args(container)


def test_kubernetes_older_than_supported_is_refused() -> None:
    raw = base_spec()
    raw["kubernetes"]["version"] = "1.29"
    with pytest.raises(Exception, match=r"cluster\.kubernetes: .*1\.29 is not supported; use 1\.30 or later"):
        load_spec(raw)


STANDALONE = GuestBootstrapSpec.model_validate(
    {
        "nodeName": "bare-metal-1",
        "gpus": [{"vendorDevice": "10de:26b9", "product": "NVIDIA-L40S"}],
        "driverMode": "host",
        "driverBranch": "580",
        "kernelModules": "open",
        "toolkit": True,
        "apiEndpoint": "10.0.0.10:6443",
        "kubernetesMinor": 34,
    }
)


def test_standalone_use_on_any_host_keeps_plain_secrets_secret() -> None:
    def program() -> None:
        provider = command.Provider("cmd")
        args = GuestBootstrapArgs(
            bootstrap=STANDALONE,
            host="10.0.0.21",
            user="root",
            ssh_private_key=pulumi.Output.secret("KEY-CANARY"),
            join_token="abcdef.0123456789abcdef",
            ca_cert_hash="sha256:" + "0" * 64,
        )
        GuestBootstrap("bm1", args, pulumi.ResourceOptions(provider=provider))

    rec = run(program)
    join = rec.named("bm1-join")
    assert is_secret(join.inputs["stdin"])
    assert "abcdef.0123456789abcdef" not in json.dumps(redact(join.inputs))
    assert join.plain_inputs["create"].startswith(f"{run_bundle('join', 'root')} --node-name bare-metal-1")
    assert rec.named("bm1-driver-wait").plain_inputs["environment"]["PGC_HOST"] == "10.0.0.21"


@pytest.mark.parametrize("purge", [False, True])
def test_a_standalone_host_purges_its_driver_only_when_asked(purge: bool) -> None:
    spec = STANDALONE.model_copy(update={"purge_driver_on_destroy": purge})

    def program() -> None:
        args = GuestBootstrapArgs(
            bootstrap=spec, host="h", user="root", ssh_private_key="k", join_token="abcdef.0123456789abcdef",
            ca_cert_hash="sha256:" + "0" * 64,
        )  # fmt: skip
        GuestBootstrap("bm1", args, pulumi.ResourceOptions(provider=command.Provider("cmd")))

    driver = run(program).named("bm1-driver")
    assert ("delete" in driver.inputs) is purge
    if purge:
        assert driver.plain_inputs["delete"].endswith(" --purge")


def test_each_workers_driver_build_is_an_output() -> None:
    from proxmox_gpu_cluster.guest.guest_bootstrap import driver_version_of

    assert driver_version_of("verify: driver: 580.95.05\nverify: ok: NVIDIA-A10\n") == "580.95.05"
    assert driver_version_of("verify: ok: NVIDIA-A10\n") == ""
    rec = plan_stack(base_spec())
    assert set(rec.outputs["driverVersions"]) == {"mig-1", "mig-2", "ts-1"}


def test_the_rolling_steps_carry_no_credential_and_wait_for_the_node_access() -> None:
    # They act as the node itself (kubelet's credential on the machine): no kubeconfig in any input, and every step
    # waits for the RBAC that lets the node do it (through the agent copy, the chain's first resource).
    rec = plan_stack(base_spec())
    chain = steps(rec, "ts-1")
    access = rec.named("cluster-node-access-cluster-role-binding")
    for role in ("driver", "verify"):
        step = chain[role]
        assert "stdin" not in step.inputs
        assert "--rollout 1 --rollout-node ts-1 --rollout-api k8s.example.test:6443" in step.plain_inputs["create"]
        assert "stdout" not in step.additional_secret_outputs  # the verify report and driver build stay readable
        assert rec.depends_on(step, access)
    assert rec.depends_on(rec.named("cluster-ts-1-bootstrap-agent"), rec.named("cluster-node-access"))
    for r in rec.resources:
        assert "CANARY-KUBECONFIG" not in json.dumps(r.plain_inputs) or r.type == "pulumi:providers:kubernetes", r.name
    versions = rec.outputs["driverVersions"]
    assert not is_secret(versions) and redact(versions) == dict.fromkeys(("mig-1", "mig-2", "ts-1"), "[unknown]")


def test_rollout_settings_at_their_default_are_not_passed_and_the_script_has_the_same_defaults() -> None:
    # The script's own defaults stand in for what is not passed: they must be RolloutSpec's, or a default setting
    # would silently differ on the machine.
    import re

    from proxmox_gpu_cluster.core.guest_spec import RolloutSpec
    from proxmox_gpu_cluster.render.guest_scripts import ROLLOUT_FLAGS, _flag
    from proxmox_gpu_cluster.render.host_scripts import script

    text = script("guest_rollout.sh")
    shell: dict[str, str] = {}
    for variable, value in re.findall(r"\b(ROLLOUT_[A-Z_]+)=([^\s\"]*)", text):
        shell.setdefault(variable, value)  # the first assignment: the default, before any argument
    for field, (flag, variable) in ROLLOUT_FLAGS.items():
        default = RolloutSpec.model_fields[field].default
        assert shell[variable] == (_flag(default) if isinstance(default, bool) else str(default)), field
        assert f'  {flag}) {variable}="$2" ;;' in text, flag
    b = STANDALONE.model_copy(update={"rollout": RolloutSpec()})
    assert rollout_args(b) == ["--rollout", "1", "--rollout-node", b.node_name, "--rollout-api", b.api_endpoint]
    tuned = b.model_copy(update={"rollout": RolloutSpec(max_unavailable=3, force=True, namespace="gpu-slots")})
    assert rollout_args(tuned)[6:] == [
        "--rollout-namespace", "gpu-slots", "--rollout-max-unavailable", "3", "--rollout-force", "1"
    ]  # fmt: skip


def test_the_vm_restart_step_runs_on_the_proxmox_node_and_again_only_for_a_hardware_change() -> None:
    spec = load_spec(base_spec())
    worker = next(w for w in spec.workers if w.name == "ts-1")
    create = steps(plan_stack(base_spec()), "ts-1")["vm-restart"].plain_inputs["create"]
    assert f"--vmid {worker.vmid} --node-name ts-1 " in create and f"--hardware {hardware_key(worker)} " in create
    assert "/home/ubuntu/.proxmox-gpu-cluster/agent/hold-" in create  # the guest's installed hold step
    # What Proxmox applies only at a VM start changes the key (the step runs again); anything else does not.
    for changed in ({"cores": 16}, {"memory_mib": 65536}, {"workload": "vm-passthrough"}):
        assert hardware_key(worker.model_copy(update=changed)) != hardware_key(worker), changed
    for same in ({"tags": ("gpu",)}, {"protect": True}, {"disk_gib": 200}):
        assert hardware_key(worker.model_copy(update=same)) == hardware_key(worker), same
