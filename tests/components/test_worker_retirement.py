"""WorkerRetirement on its own under the recording mock: one command on the Proxmox node whose create checks the
guest agent and whose delete retires the node, acting as the node itself: no credential passes through it."""

from __future__ import annotations

import pulumi
import pulumi_command as command

from proxmox_gpu_cluster.core.spec import DrainSpec
from proxmox_gpu_cluster.proxmox.worker_retirement import WorkerRetirement, WorkerRetirementArgs
from proxmox_gpu_cluster.render.agent_bundle import bundle_name, step_command
from proxmox_gpu_cluster.testing import run


def test_minimal_args() -> None:
    def program() -> None:
        vm = command.local.Command("vm", command.local.CommandArgs(create="true"))  # stands in for a VM
        args = WorkerRetirementArgs(
            node_name="w1",
            vmid=2001,
            host="192.0.2.11",
            ssh_user="admin",
            guest_user="ops",
            ssh_private_key=pulumi.Output.secret("KEY"),
            api_endpoint="[2001:db8::10]:6443",
            drain=DrainSpec.model_validate({"timeoutSeconds": 300, "force": True}),
            kubeadm_reset=False,
            replace_with=(vm,),
        )
        WorkerRetirement("w1-retirement", args, pulumi.ResourceOptions(provider=command.Provider("cmd"), protect=True))

    rec = run(program)
    component = rec.one("proxmox-gpu-cluster:worker_retirement:WorkerRetirement")
    step, agent = sorted(rec.children(component), key=lambda r: r.name)
    assert step.name == "w1-retirement-drain" and step.protect
    # Alone, it installs the node agent on the Proxmox node itself, and its step waits for that copy.
    assert agent.name == "w1-retirement-host-agent" and agent.urn in step.dependencies
    assert step.replace_with == [rec.named("vm").urn]
    inputs = step.plain_inputs
    guest = "--node-name w1 --api-endpoint '[2001:db8::10]:6443' --timeout 300 --delete-emptydir-data 1 --force 1 --kubeadm-reset 0"
    drain = f"/home/ops/.proxmox-gpu-cluster/agent/{bundle_name('drain')}/step.sh"  # the guest user's agent copy
    assert inputs["create"] == (
        f"{step_command('admin', 'retire', [])} --vmid 2001 --node-name w1 --timeout 300 --guest-step {drain} --check 1 -- {guest}"
    )
    assert inputs["delete"] == inputs["create"].replace("--check 1", "--check 0")
    assert "stdin" not in inputs  # no credential, no script
    assert component.outputs.keys() == {"ready"}
