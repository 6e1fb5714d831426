"""The offline plan's specs and secrets: every cluster of the stack file, and secrets as ``pulumi preview`` has
them (an encrypted value gets a placeholder; an unset one is reported, unless placeholders are asked for)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.stacks.plan import main
from proxmox_gpu_cluster.stacks.plan.specs import PlannedCluster, spec_namespaces, stack_config
from tests.support import ROOT, base_spec

NS = "proxmox-gpu-cluster"


def test_namespaces_are_every_cluster_key_the_projects_first() -> None:
    config = {"b:cluster": {}, "a:cluster": {}, "cluster": {}, "pulumi:cluster": 1, "kubernetes:cluster": 1,
              "a:kubeconfig": {"secure": "x"}}  # fmt: skip
    assert spec_namespaces({"config": config}, "proj") == ["proj", "a", "b"]
    assert spec_namespaces({"config": "junk"}, "proj") == []


def test_encrypted_values_get_placeholders_and_unset_secrets_are_not_invented() -> None:
    document = {"config": {f"{NS}:kubeconfig": {"secure": "v1:abc"}, f"{NS}:cluster": base_spec()}}
    config, secret_keys, assumed = stack_config(document, NS)
    assert config[f"{NS}:kubeconfig"].startswith("plan-placeholder-kubeconfig-")
    # one placeholder per ciphertext: the same file plans the same, a rotated secret plans differently
    again = stack_config(document, NS)[0][f"{NS}:kubeconfig"]
    rotated = {"config": {**document["config"], f"{NS}:kubeconfig": {"secure": "v1:abd"}}}
    assert again == config[f"{NS}:kubeconfig"] != stack_config(rotated, NS)[0][f"{NS}:kubeconfig"]
    assert secret_keys == [f"{NS}:kubeconfig"] and assumed == []
    assert f"{NS}:proxmoxApiToken" not in config


def test_placeholders_for_unset_secrets_only_where_asked_and_only_what_the_spec_needs() -> None:
    spec = load_spec(base_spec())  # token auth, kubeadm join, an SSH key
    document = {"config": {f"{NS}:kubeconfig": {"secure": "v1:abc"}, f"{NS}:cluster": base_spec()}}
    config, secret_keys, assumed = stack_config(document, NS, [PlannedCluster(NS, spec)], placeholder_secrets=True)
    expected = {f"{NS}:{k}" for k in ("proxmoxApiToken", "sshPrivateKey", "kubeadmCaCertHash")}
    # Not the kubeconfig (set), not the password or vGPU one (not needed), not the optional join token.
    assert set(assumed) == expected
    assert set(secret_keys) == expected | {f"{NS}:kubeconfig"}
    assert all(config[k].startswith("plan-placeholder-") for k in secret_keys)


def test_a_missing_secret_fails_the_plan_as_preview_would(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dev"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines and all(line.startswith(f"{NS}:") and "required secret is not set" in line for line in lines)
    # dev: the ssh-agent, so no key; kubeadm joins
    assert {line.split(":")[1] for line in lines} == {"proxmoxApiToken", "kubeconfig", "kubeadmCaCertHash"}
    assert "Traceback" not in err


def test_only_the_unset_ones_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())
    document["config"][f"{NS}:kubeconfig"] = {"secure": "v1:AAAA"}
    path = tmp_path / "Pulumi.x.yaml"
    path.write_text(yaml.safe_dump(document))
    assert main(["x", "--config", str(path)]) == 2
    missing = [line.split(":")[1] for line in capsys.readouterr().err.strip().splitlines()]
    assert missing == ["proxmoxApiToken", "kubeadmCaCertHash"]


def test_placeholder_secrets_plan_and_say_which(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dev", "--placeholder-secrets"]) == 0
    err = capsys.readouterr().err
    assert f"{NS}:kubeconfig" in err and f"{NS}:proxmoxApiToken" in err and "sshPrivateKey" not in err


def test_a_program_that_refuses_its_input_ends_the_plan_with_its_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: lab\nruntime: python\n")
    (tmp_path / "Pulumi.x.yaml").write_text("config: {}\n")
    (tmp_path / "__main__.py").write_text(
        "from proxmox_gpu_cluster.core.worker_spec import Worker\n"
        "Worker(name='Bad Name', vmid=5, node='pve1', cores=0, memory_mib=1024, disk_gib=20, gpus=['a10-0'])\n"
    )
    assert main(["x", "--main", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert lines and all(line.startswith("Worker.") for line in lines), err
    assert any(line.startswith("Worker.vmid: ") for line in lines) and "Traceback" not in err
