"""The offline plan of programs that build their specs in Python (no ``<namespace>:cluster`` in the stack file):
the preflight answers for whatever the program builds, ``--pci NODE=FILE`` for any node it preflights; and the
plan prints only what the program builds (no capacity table without GPU nodes, no node agent without machines,
no capacity gate for a cluster without the operator)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.render.disruption import disruption, disruption_lines
from proxmox_gpu_cluster.stacks.component_examples import EXAMPLES
from proxmox_gpu_cluster.stacks.plan import main
from proxmox_gpu_cluster.testing_pci import spec_shaped_pci
from tests.support import base_spec, two_team_specs

PROGRAM = """\
import json

import pulumi

from proxmox_gpu_cluster import GpuCluster, GpuClusterArgs, Secrets, export
from proxmox_gpu_cluster.core.spec import ClusterSpec

spec = ClusterSpec.model_validate(json.loads({spec!r}))
s = pulumi.Output.secret
secrets = Secrets(ssh_private_key=s("k"), kubeconfig=s("{{}}"), proxmox_api_token=s("t"), join_token=s("j"),
                  ca_cert_hash=s("h"))
export(GpuCluster("lab", GpuClusterArgs(spec=spec, secrets=secrets)))
"""


def program_dir(tmp_path: Path, source: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "__main__.py").write_text(source)
    (tmp_path / "Pulumi.yaml").write_text("name: mine\nruntime: python\n")
    (tmp_path / "Pulumi.dev.yaml").write_text("config: {}\n")
    return tmp_path


def python_built(tmp_path: Path) -> Path:
    return program_dir(tmp_path, PROGRAM.format(spec=json.dumps(base_spec())))


def test_a_spec_built_in_python_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dev", "--main", str(python_built(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "proxmoxve:index/vmLegacy:VmLegacy" in out and "proxmoxve:hardware/mapping/pci:Pci" in out


def test_pci_files_answer_for_the_nodes_the_program_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    program = python_built(tmp_path / "program")
    spec = load_spec(base_spec())
    real = tmp_path / "pve1.json"
    real.write_text(json.dumps(spec_shaped_pci(spec, "pve1")))
    assert main(["dev", "--main", str(program), "--pci", f"pve1={real}"]) == 0
    capsys.readouterr()
    # The host as it answers without its GPUs (its bridges and root ports only).
    no_gpus = tmp_path / "no-gpus.json"
    no_gpus.write_text(json.dumps([d for d in spec_shaped_pci(spec, "pve1") if d["vendor"] != "0x10de"]))
    assert main(["dev", "--main", str(program), "--pci", f"pve1={no_gpus}"]) == 2
    err = capsys.readouterr().err
    assert "GpuCluster(lab).spec.proxmox.nodes[0].gpus[0].pciPath: no PCI device at" in err and "on node pve1" in err
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert main(["dev", "--main", str(program), "--pci", f"pve1={empty}"]) == 2
    assert "the PCI device list answered for node pve1 is empty" in capsys.readouterr().err
    assert main(["dev", "--main", str(program), "--pci", f"pve9={empty}"]) == 2
    assert "--pci: the program preflights no Proxmox node pve9 (it preflights: pve1, pve2)" in capsys.readouterr().err


def test_a_program_without_machines_prints_only_what_it_builds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    secrets = "config:\n  mine:kubeconfig: '{}'\n"
    program = program_dir(tmp_path, EXAMPLES["GpuQuotas"])
    (program / "Pulumi.dev.yaml").write_text(secrets)
    assert main(["dev", "--main", str(program)]) == 0
    out = capsys.readouterr().out
    assert "kubernetes:core/v1:ResourceQuota" in out
    assert "Node agent" not in out and "fingerprint" not in out
    assert "Capacity (" not in out and "WORKER" not in out


def test_a_machine_program_still_prints_its_agent_and_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dev", "--main", str(python_built(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "Node agent (copied once per machine" in out and "Capacity (what each node will advertise):" in out


def test_no_capacity_gate_for_a_cluster_without_the_operator() -> None:
    spec = load_spec(two_team_specs()[1])  # speech: no operator
    assert not spec.gpu_operator.enabled
    assert disruption(spec)["capacityGateSeconds"] == 0
    assert not [line for line in disruption_lines(spec) if "advertise its capacity row" in line]
    with_operator = load_spec(base_spec())
    assert [line for line in disruption_lines(with_operator) if "advertise its capacity row" in line]
