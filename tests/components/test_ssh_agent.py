"""SSH with the ssh-agent (``proxmox.sshAgent``): no connection and no provider carries a private key, so no
step's state holds it; with the key (the default) every connection carries it, secret, exactly as before."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest

from proxmox_gpu_cluster import GpuCluster, GpuClusterArgs, Secrets
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.errors import InvalidComponentArgs
from proxmox_gpu_cluster.ssh import connection
from proxmox_gpu_cluster.testing import RecordedResource, Recording, RecordingMocks, is_secret, run, unwrap
from proxmox_gpu_cluster.testing_pci import pci_invokes
from tests.support import SECRETS, base_spec

KEY = SECRETS["sshPrivateKey"]
PROVIDER = "pulumi:providers:proxmoxve"


def secrets(key: str | None) -> Secrets:
    s = pulumi.Output.secret
    return Secrets(
        ssh_private_key=None if key is None else s(key),
        kubeconfig=s("{}"),
        proxmox_api_token=s("t"),
        join_token=s("j"),
        ca_cert_hash=s("h"),
    )


def cluster(agent: bool, key: str | None) -> Recording:
    raw = base_spec()
    raw["proxmox"]["sshAgent"] = agent
    # Static addresses and a known step output (the large-BAR step's stdout gates the address): otherwise a
    # worker's address, and so its steps' whole connection, is unknown under the mocks and hides what it holds.
    for i, worker in enumerate(raw["workers"]):
        worker.setdefault("network", {"ipv4": f"192.0.2.{70 + i}/24", "gateway": "192.0.2.1", "dns": ["192.0.2.1"]})
    spec = load_spec(raw)
    mocks = RecordingMocks(
        resource_outputs={"command:remote:Command": lambda _: {"stdout": ""}}, invokes=pci_invokes(spec)
    )
    return run(lambda: GpuCluster("lab", GpuClusterArgs(spec=spec, secrets=secrets(key))), mocks=mocks)


def keys_named(value: Any, name: str) -> list[Any]:
    """Every value stored under the key ``name`` anywhere in ``value``."""
    if isinstance(value, dict):
        return [v for k, v in value.items() if k == name] + [x for v in value.values() for x in keys_named(v, name)]
    if isinstance(value, list):
        return [x for v in value for x in keys_named(v, name)]
    return []


def connections(rec: Recording) -> dict[str, dict[str, Any]]:
    """Step name -> its connection, unwrapped (pulumi-command marks the whole connection secret)."""
    out = {r.name: unwrap(r.inputs["connection"]) for r in rec.resources if "connection" in r.inputs}
    assert out and all(isinstance(c, dict) and c.get("host") for c in out.values())  # known, so checkable
    return out


def provider_ssh(rec: Recording) -> dict[str, Any]:
    """The Proxmox provider's ``ssh`` block (a provider's object inputs travel as JSON)."""
    provider: RecordedResource = rec.one(PROVIDER)
    value = unwrap(provider.inputs["ssh"])
    return json.loads(value) if isinstance(value, str) else value


@pytest.mark.parametrize("key", [None, KEY], ids=["no-key", "key-given-anyway"])
def test_with_the_agent_no_recorded_input_holds_a_key(key: str | None) -> None:
    rec = cluster(agent=True, key=key)
    steps = connections(rec)
    assert len(steps) >= 20  # every remote step of three workers on two nodes
    assert [name for name, c in steps.items() if "privateKey" in c] == []
    everything = [unwrap(r.inputs) for r in rec.resources]
    assert keys_named(everything, "privateKey") == []
    assert all(KEY not in json.dumps(inputs) for inputs in everything)
    ssh = provider_ssh(rec)
    assert ssh["agent"] is True and "privateKey" not in ssh and ssh["username"] == "root"


def test_with_the_key_every_connection_and_the_provider_carry_it_secret() -> None:
    rec = cluster(agent=False, key=KEY)
    steps = {r.name: r.inputs["connection"] for r in rec.resources if "connection" in r.inputs}
    assert len(steps) >= 20 and all(is_secret(c) for c in steps.values())
    assert {name: c.get("privateKey") for name, c in connections(rec).items()} == dict.fromkeys(steps, KEY)
    ssh = provider_ssh(rec)
    assert ssh["privateKey"] == KEY and "agent" not in ssh
    assert is_secret(rec.one(PROVIDER).inputs["ssh"])


def test_without_the_agent_a_missing_key_is_refused_naming_it() -> None:
    spec = load_spec(base_spec())
    with pytest.raises(InvalidComponentArgs) as info:
        GpuClusterArgs(spec=spec, secrets=secrets(None))
    assert info.value.lines == [
        "GpuClusterArgs.secrets.ssh_private_key: required: SSH to the Proxmox nodes and guests (or proxmox.sshAgent)"
    ]


def test_a_connection_without_a_key_names_no_key_nor_socket() -> None:
    args = connection("h", "root", None)
    assert args.private_key is None and args.agent_socket_path is None
    assert connection("h", "root", "k").private_key == "k"
