"""The stack config with ``proxmox.sshAgent``: ``sshPrivateKey`` is required only without the agent (a missing one
is one RunError line naming the key), and the repository's dev and prod stacks, which use the agent, plan without
it and put no private key into any input."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest
import yaml

from proxmox_gpu_cluster import GpuCluster, GpuClusterArgs, export
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.stacks.config import InvalidStackConfig, agent_problems, load
from proxmox_gpu_cluster.testing import Recording, RecordingMocks, run, unwrap
from proxmox_gpu_cluster.testing_pci import pci_invokes
from tests.support import ROOT, SECRETS, base_spec, stack_config

WITHOUT_KEY = {k: v for k, v in SECRETS.items() if k != "sshPrivateKey"}
KEY_LINE = (
    "proxmox-gpu-cluster:sshPrivateKey: required secret is not set (SSH private key for Proxmox nodes and guest VMs "
    "(or the ssh-agent: proxmox.sshAgent true)); pulumi config set --secret proxmox-gpu-cluster:sshPrivateKey ..."
)


def program() -> None:
    spec, secrets = load()
    assert (secrets.ssh_private_key is None) == spec.proxmox.ssh_agent
    args = GpuClusterArgs(spec=spec, secrets=secrets, aliases_from_stack_root=True, stack_scoped_names=True)
    export(GpuCluster("cluster", args))


def plan(raw: dict[str, Any], secrets: dict[str, str]) -> Recording:
    """The stack program under mocks that know every step's address: the VMs report one through the guest agent
    and every step's stdout is known (a large-BAR worker's address waits for it), so no connection is unknown."""
    config, keys = stack_config(raw, secrets)
    outputs = {
        "command:remote:Command": lambda _: {"stdout": "address: 192.0.2.98\n"},
        "proxmoxve:index/vmLegacy:VmLegacy": lambda _: {"ipv4Addresses": [["127.0.0.1"], ["192.0.2.99"]]},
    }
    mocks = RecordingMocks(resource_outputs=outputs, invokes=pci_invokes(load_spec(raw)))
    return run(program, config=config, secret_keys=keys, mocks=mocks)


def private_keys(rec: Recording) -> list[str]:
    """Resources whose inputs name a private key anywhere (a connection's, or the Proxmox provider's ssh block)."""
    found = []
    for r in rec.resources:
        inputs = unwrap(r.inputs)
        ssh = inputs.get("ssh")
        text = json.dumps(inputs) + (ssh if isinstance(ssh, str) else "")
        if "privateKey" in text or SECRETS["sshPrivateKey"] in text:
            found.append(r.name)
    return found


def known_connections(rec: Recording) -> int:
    """How many steps connect over SSH; every connection must be known, or it could hide a key."""
    conns = [unwrap(r.inputs["connection"]) for r in rec.resources if "connection" in r.inputs]
    assert all(isinstance(c, dict) and c["host"] not in ("", "[unknown]") for c in conns)
    return len(conns)


def test_without_the_agent_a_missing_key_is_one_run_error_line_naming_it() -> None:
    config, keys = stack_config(base_spec(), WITHOUT_KEY)
    with pytest.raises(InvalidStackConfig) as info:
        run(program, config=config, secret_keys=keys)
    assert isinstance(info.value, pulumi.RunError)
    assert info.value.lines == [KEY_LINE]


def test_with_the_agent_the_key_is_not_needed_and_not_used() -> None:
    raw = base_spec()
    raw["proxmox"]["sshAgent"] = True
    without = plan(raw, WITHOUT_KEY)
    assert known_connections(without) >= 20 and private_keys(without) == []
    # A key left in the stack's config changes nothing: no input holds it.
    with_key = plan(raw, SECRETS)
    assert private_keys(with_key) == []
    assert {r.urn: unwrap(r.inputs) for r in with_key.resources} == {r.urn: unwrap(r.inputs) for r in without.resources}


def test_with_the_agent_a_plain_text_key_is_still_refused() -> None:
    raw = base_spec()
    raw["proxmox"]["sshAgent"] = True
    config, keys = stack_config(raw)
    keys.remove("proxmox-gpu-cluster:sshPrivateKey")
    with pytest.raises(InvalidStackConfig) as info:
        run(program, config=config, secret_keys=keys)
    assert [line.split(":")[1] for line in info.value.lines] == ["sshPrivateKey"]
    assert "stored in plain text" in info.value.lines[0]


def test_the_key_mode_still_puts_the_key_in_every_connection() -> None:
    rec = plan(base_spec(), SECRETS)
    steps = known_connections(rec)
    assert steps >= 20
    assert len(private_keys(rec)) == steps + 1  # every step, and the Proxmox provider


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_repository_stacks_use_the_agent_and_plan_without_the_key(stack: str) -> None:
    document = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
    raw = document["config"]["proxmox-gpu-cluster:cluster"]
    assert raw["proxmox"]["sshAgent"] is True
    rec = plan(raw, WITHOUT_KEY)
    assert known_connections(rec) >= 10 and private_keys(rec) == []
    provider = json.loads(unwrap(rec.one("pulumi:providers:proxmoxve").inputs["ssh"]))
    assert provider["agent"] is True


NO_AGENT_LINE = (
    "proxmox-gpu-cluster:cluster.proxmox.sshAgent: the ssh-agent is on but SSH_AUTH_SOCK is not set where pulumi "
    'runs; start one and load the key first (eval "$(ssh-agent)"; ssh-add ~/.ssh/id_ed25519)'
)


def test_an_up_with_the_agent_on_and_no_agent_socket_stops_before_any_resource(monkeypatch: Any) -> None:
    raw = base_spec()
    raw["proxmox"]["sshAgent"] = True
    config, keys = stack_config(raw, WITHOUT_KEY)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    with pytest.raises(InvalidStackConfig) as info:
        run(program, config=config, secret_keys=keys, preview=False)
    assert info.value.lines == [NO_AGENT_LINE]
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/agent.sock")
    run(load, config=config, secret_keys=keys, preview=False)  # loads (raises otherwise)


def test_the_agent_socket_is_needed_only_by_an_up_with_the_agent() -> None:
    spec = load_spec({**base_spec(), "proxmox": {**base_spec()["proxmox"], "sshAgent": True}})
    key_spec = load_spec(base_spec())
    assert agent_problems("proxmox-gpu-cluster", spec, {}, dry_run=False) == [NO_AGENT_LINE]
    assert agent_problems("proxmox-gpu-cluster", spec, {"SSH_AUTH_SOCK": ""}, dry_run=False) == [NO_AGENT_LINE]
    assert agent_problems("proxmox-gpu-cluster", spec, {"SSH_AUTH_SOCK": "/run/a.sock"}, dry_run=False) == []
    assert agent_problems("proxmox-gpu-cluster", spec, {}, dry_run=True) == []
    assert agent_problems("proxmox-gpu-cluster", key_spec, {}, dry_run=False) == []
