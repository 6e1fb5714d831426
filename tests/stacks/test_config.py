"""Spec and secrets from stack config; errors before any resource registers; secrets stay secret."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest
import yaml

from proxmox_gpu_cluster import GpuCluster, GpuClusterArgs, export
from proxmox_gpu_cluster.stacks.config import InvalidStackConfig, load
from proxmox_gpu_cluster.testing import RecordingMocks, is_secret, run
from tests.support import ROOT, SECRETS, base_spec, make_vm_worker, plain_strings, stack_config


def program() -> None:
    spec, secrets = load()
    export(GpuCluster("cluster", GpuClusterArgs(spec=spec, secrets=secrets)))


class CountingMocks(RecordingMocks):
    def __init__(self) -> None:
        super().__init__()
        self.created = 0

    def new_resource(self, args: Any) -> Any:
        self.created += 1
        return super().new_resource(args)


def test_invalid_spec_is_a_run_error_before_any_resource() -> None:
    spec = base_spec()
    spec["workers"][0]["vmid"] = 2002
    spec["workers"][2]["gpus"] = ["a100-0"]
    config, keys = stack_config(spec)
    mocks = CountingMocks()
    with pytest.raises(InvalidStackConfig) as info:
        run(program, config=config, secret_keys=keys, mocks=mocks)
    assert isinstance(info.value, pulumi.RunError)  # the CLI prints RunError without a traceback
    assert mocks.created == 0
    assert info.value.lines == [
        "proxmox-gpu-cluster:cluster.workers[1].vmid: vmid 2002 is already used by workers[0]",
        "proxmox-gpu-cluster:cluster.workers[2].gpus[0].ref: no GPU 'a100-0' on Proxmox node 'pve2' "
        "(known: a10-0, a10-1)",
    ]


def test_missing_secrets_are_listed_together() -> None:
    # kubeadmJoinToken is optional (without it each join mints its own token).
    secrets = {k: v for k, v in SECRETS.items() if k not in ("sshPrivateKey", "kubeadmJoinToken", "kubeadmCaCertHash")}
    config, keys = stack_config(base_spec(), secrets)
    with pytest.raises(InvalidStackConfig) as info:
        run(program, config=config, secret_keys=keys)
    assert [line.split(":")[1] for line in info.value.lines] == ["sshPrivateKey", "kubeadmCaCertHash"]
    assert "pulumi config set --secret proxmox-gpu-cluster:sshPrivateKey" in info.value.lines[0]


def test_plain_text_secrets_are_refused_needed_or_not() -> None:
    # A token-mode stack that also holds a password (not needed) and the kubeconfig in plain text: both refused,
    # since a value not set with --secret sits readable in the stack file.
    config, keys = stack_config(base_spec())
    keys = [k for k in keys if not k.endswith((":kubeconfig", ":proxmoxPassword"))]
    with pytest.raises(InvalidStackConfig) as info:
        run(program, config=config, secret_keys=keys)
    assert info.value.lines == [
        "proxmox-gpu-cluster:proxmoxPassword: stored in plain text; it must be a secret "
        "(pulumi config set --secret proxmox-gpu-cluster:proxmoxPassword ...)",
        "proxmox-gpu-cluster:kubeconfig: stored in plain text; it must be a secret "
        "(pulumi config set --secret proxmox-gpu-cluster:kubeconfig ...)",
    ]
    assert all("CANARY" not in line for line in info.value.lines)


def test_an_empty_required_secret_is_refused() -> None:
    # What `pulumi new` stores when its prompt is answered with Enter.
    config, keys = stack_config(base_spec(), {**SECRETS, "proxmoxApiToken": "  "})
    with pytest.raises(InvalidStackConfig) as info:
        run(program, config=config, secret_keys=keys)
    assert info.value.lines == [
        "proxmox-gpu-cluster:proxmoxApiToken: required secret is empty (Proxmox API token, "
        "'user@realm!tokenid=uuid' (authMode token)); pulumi config set --secret proxmox-gpu-cluster:proxmoxApiToken ..."
    ]


def test_required_secrets_follow_the_spec() -> None:
    spec = base_spec()
    spec["proxmox"]["authMode"] = "password"
    spec["kubernetes"]["joinMethod"] = "none"
    secrets = {k: SECRETS[k] for k in ("proxmoxPassword", "sshPrivateKey", "kubeconfig")}
    config, keys = stack_config(spec, secrets)
    rec = run(program, config=config, secret_keys=keys)
    provider = rec.one("pulumi:providers:proxmoxve")
    assert provider.plain_inputs["username"] == "root@pam"
    assert is_secret(provider.inputs["password"]) and "apiToken" not in provider.inputs


def test_vgpu_registry_password_is_required_only_with_a_vgpu_manager() -> None:
    vgpu = make_vm_worker(base_spec(), 2, "vm-vgpu")
    secrets = {k: v for k, v in SECRETS.items() if k != "vgpuRegistryPassword"}
    config, keys = stack_config(vgpu, secrets)
    with pytest.raises(InvalidStackConfig) as info:
        run(program, config=config, secret_keys=keys)
    assert info.value.lines == [
        "proxmox-gpu-cluster:vgpuRegistryPassword: required secret is not set (password of kubevirt.vgpuManager's "
        "registry, e.g. an NGC API key (vm-vgpu nodes)); pulumi config set --secret "
        "proxmox-gpu-cluster:vgpuRegistryPassword ..."
    ]
    config, keys = stack_config(make_vm_worker(base_spec(), 2, "vm-passthrough"), secrets)
    assert run(program, config=config, secret_keys=keys).of_type("kubernetes:kubevirt.io/v1:KubeVirtPatch")


def test_kubevirt_canary_secrets_never_appear_unsecret() -> None:
    raw = make_vm_worker(base_spec(), 2, "vm-vgpu")
    raw["kubevirt"]["nodes"] = [{"name": "bm-1", "workload": "vm-passthrough", "gpus": {"L4": 1}}]
    config, keys = stack_config(raw)
    rec = run(program, config=config, secret_keys=keys)
    everything = [r.inputs for r in rec.resources] + [rec.outputs]
    assert [s for item in everything for s in plain_strings(item) if "CANARY" in s] == []
    assert SECRETS["vgpuRegistryPassword"] in json.dumps([r.plain_inputs for r in rec.resources])


def test_missing_spec_key() -> None:
    with pytest.raises(InvalidStackConfig, match="proxmox-gpu-cluster:cluster: required config key is not set"):
        run(program, config={}, secret_keys=[])


def test_canary_secrets_never_appear_unsecret() -> None:
    config, keys = stack_config(base_spec())
    rec = run(program, config=config, secret_keys=keys)
    everything = [r.inputs for r in rec.resources] + [rec.outputs]
    leaks = [s for item in everything for s in plain_strings(item) if "CANARY" in s]
    assert leaks == []
    # and they did reach the providers, wrapped as secrets
    assert "CANARY" in json.dumps([r.plain_inputs for r in rec.resources])


def test_every_custom_resource_names_an_explicit_provider() -> None:
    config, keys = stack_config(base_spec())
    rec = run(program, config=config, secret_keys=keys)
    custom = [r for r in rec.resources if r.custom and not r.type.startswith("pulumi:providers:")]
    assert all(r.provider for r in custom), [r.name for r in custom if not r.provider]
    assert {r.type for r in rec.resources if r.type.startswith("pulumi:providers:")} == {
        "pulumi:providers:proxmoxve",
        "pulumi:providers:kubernetes",
        "pulumi:providers:command",
    }


def test_pulumi_yaml_disables_default_providers() -> None:
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    assert project["name"] == "proxmox-gpu-cluster"
    assert project["runtime"]["name"] == "python"
    assert project["runtime"]["options"]["virtualenv"] == ".venv"
    disabled = project["config"]["pulumi:disable-default-providers"]["value"]
    assert set(disabled) >= {"proxmoxve", "kubernetes", "command"}


def test_proxmox_provider_inputs() -> None:
    config, keys = stack_config(base_spec())
    rec = run(program, config=config, secret_keys=keys)
    inputs = rec.one("pulumi:providers:proxmoxve").plain_inputs
    assert inputs["endpoint"] == "https://pve1.example.test:8006/"
    assert inputs["apiToken"] == SECRETS["proxmoxApiToken"]
    ssh = json.loads(inputs["ssh"]) if isinstance(inputs["ssh"], str) else inputs["ssh"]
    assert ssh["username"] == "root"
    assert [n["name"] for n in ssh["nodes"]] == ["pve1", "pve2"]
