"""One spelling of every spec field for library users: the field name (``Worker(memory_mib=...)``), accepted by
``mypy --strict`` with the project's configuration (the pydantic plugin), by the same configuration without the
plugin, and by pyright in strict mode; the stack-file key (``memoryMiB``) and a misspelt name are errors in all
three, as are a value of the wrong type and a missing required field.

Why it needs care: pyright and plain mypy build a model's ``__init__`` from pydantic's ``dataclass_transform``,
where ``Field(alias=...)`` renames the parameter to the alias (an ``alias_generator`` they cannot see); the plugin,
with ``validate_by_name``, names every parameter after its field. So no spec field takes ``alias=``: keys that are
not plain camelCase come from ``spec_base.camel_alias`` (a model's alias generator).

Each checker runs once on two small programs: ``good.py`` must have no error, ``bad.py`` an error on exactly the
lines marked ``# error``. pyright comes from the test extras (pyproject.toml); without it the test fails.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import runpy
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import proxmox_gpu_cluster
from proxmox_gpu_cluster.core.spec_base import SpecModel
from tests.support import ROOT

GOOD_IMPORTS = """\
import pulumi
from proxmox_gpu_cluster.cluster.gpu_cluster import GpuClusterArgs
from proxmox_gpu_cluster.cluster.providers import Secrets
from proxmox_gpu_cluster.core.guest_spec import ExpectedGpu, GuestBootstrapSpec
from proxmox_gpu_cluster.core.monitoring_spec import AlertsSpec, MonitoringSpec
from proxmox_gpu_cluster.core.nodes import ExistingGpuNode, GpuNode
from proxmox_gpu_cluster.core.operator_spec import DriverUpgradeSpec, GpuOperatorSpec
from proxmox_gpu_cluster.core.scheduling_spec import PriorityClassSpec, Quota
from proxmox_gpu_cluster.core.spec import (
    ClusterSpec,
    GuestSpec,
    HostGpu,
    KubernetesSpec,
    KubeVirtSpec,
    ProxmoxNode,
    ProxmoxSpec,
)
from proxmox_gpu_cluster.core.worker_spec import GpuAssignment, Image, Network, TimeSlicing, Worker
from proxmox_gpu_cluster.gpu.gpu_monitoring import GpuMonitoringArgs
from proxmox_gpu_cluster.gpu.gpu_node import GpuNodeLabelsArgs
from proxmox_gpu_cluster.gpu.gpu_quota import GpuQuotasArgs
from proxmox_gpu_cluster.guest.capacity_gate import GateTarget, NodeCapacityGatesArgs
from proxmox_gpu_cluster.guest.guest_bootstrap import GuestBootstrapArgs
from proxmox_gpu_cluster.proxmox.worker_vm import WorkerVmArgs
from proxmox_gpu_cluster.render.gpu_stack import GpuStack

GPUS = (GpuAssignment(ref="a10-0"), GpuAssignment(ref="a10-1"))
"""
BAD_IMPORTS = """\
from proxmox_gpu_cluster.cluster.gpu_cluster import GpuClusterArgs
from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.core.nodes import ExistingGpuNode
from proxmox_gpu_cluster.core.spec import HostGpu, KubeVirtSpec, ProxmoxNode
from proxmox_gpu_cluster.core.worker_spec import GpuAssignment, TimeSlicing, Worker
from proxmox_gpu_cluster.gpu.gpu_quota import GpuQuotasArgs
from proxmox_gpu_cluster.guest.guest_bootstrap import GuestBootstrapArgs
from proxmox_gpu_cluster.proxmox.worker_vm import WorkerVmArgs

GPUS = (GpuAssignment(ref="a10-0"),)
W = Worker(name="w", vmid=201, node="pve2", gpus=GPUS)
B = GuestBootstrapSpec.model_validate({})
"""

GOOD = (
    GOOD_IMPORTS
    + """
worker = Worker(
    name="ts-1",
    vmid=2003,
    node="pve2",
    cores=16,
    memory_mib=65536,
    disk_gib=200,
    image=Image(cloud_image_url="https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"),
    network=Network(ipv4="192.0.2.60/24", gateway="192.0.2.1", dns=("192.0.2.1",), search_domain="lab.internal"),
    ssh_user="ubuntu",
    gpus=GPUS,
    sharing="time-slicing",
    time_slicing=TimeSlicing(replicas=4, fail_requests_greater_than_one=True),
    on_boot=True,
)
spec = ClusterSpec(
    proxmox=ProxmoxSpec(
        endpoint="https://pve2.example.test:8006/",
        tls_verify=True,
        nodes=(
            ProxmoxNode(
                name="pve2",
                ssh_address="192.0.2.12",
                cpu_vendor="intel",
                host_prep=True,
                reboot_policy="when-idle",
                gpus=(
                    HostGpu(name="a10-0", pci_path="0000:17:00", model="A10"),
                    HostGpu(name="a10-1", pci_path="0000:18:00", model="A10", device_id="10de:2236"),
                ),
            ),
        ),
    ),
    workers=(worker,),
    kubernetes=KubernetesSpec(api_endpoint="k8s.example.test:6443", version="1.34"),
    guest=GuestSpec(ssh_public_keys=(KEY,), driver_flavor="server"),
    gpu_operator=GpuOperatorSpec(
        driver_branch="580",
        mig_strategy="mixed",
        driver_upgrade=DriverUpgradeSpec(max_unavailable="25%"),
        monitoring=MonitoringSpec(alerts=AlertsSpec(temperature_warning_celsius=80)),
    ),
    kubevirt=KubeVirtSpec(enabled=False, patch_kubevirt=False),
    quotas=(Quota(namespace="team-a", resources={"nvidia.com/gpu": 4}),),
    priority_classes=(PriorityClassSpec(name="gpu-high", value=1000, preemption_policy="Never"),),
)
bare_metal: GpuNode = ExistingGpuNode(
    name="bm-1", gpus={"A10": 2}, sharing="time-slicing", time_slicing=TimeSlicing(replicas=2)
).resolve()
stack = GpuStack(operator=spec.gpu_operator, nodes=(bare_metal,))
bootstrap = GuestBootstrapSpec(
    node_name="bm-1",
    gpus=(ExpectedGpu(vendor_device="10de:2236", product="NVIDIA-A10"),),
    driver_mode="host",
    driver_branch="580",
    kernel_modules="open",
    toolkit=True,
    api_endpoint="k8s.example.test:6443",
    kubernetes_minor=34,
)
vm_args = WorkerVmArgs(
    worker=worker,
    gpu_models=("A10", "A10"),
    ssh_public_keys=(KEY,),
    mappings={"a10-0": "m0", "a10-1": "m1"},
    vendor_data_file_id="local:snippets/vendor.yaml",
    image_file_id="local:iso/noble.img",
    node_ssh_address="pve2",
)
memory: int = spec.workers[0].memory_mib + spec.workers[0].disk_gib
SECRET = pulumi.Output.secret("x")
secrets = Secrets(ssh_private_key=SECRET, kubeconfig=SECRET, proxmox_api_token=SECRET, proxmox_password=SECRET,
                  join_token=SECRET, ca_cert_hash=SECRET, vgpu_registry_password=SECRET)
cluster_args = GpuClusterArgs(spec=spec, secrets=secrets, stack_scoped_names=True)
labels_args = GpuNodeLabelsArgs(stack=stack, node_ready={"bm-1": []})
quota_args = GpuQuotasArgs(quotas=spec.quotas, capacity=tuple(stack.capacity()), priority_classes=("gpu-high",))
monitoring_args = GpuMonitoringArgs(operator_namespace=pulumi.Output.from_input("gpu-operator"), nodes=stack.nodes)
guest_args = GuestBootstrapArgs(bootstrap=bootstrap, host=pulumi.Output.from_input("10.0.0.21"), user="ubuntu",
                                ssh_private_key=SECRET, join_token=SECRET, ca_cert_hash="sha256:00")
gate = GateTarget(resources={"nvidia.com/gpu": 2}, host="10.0.0.21", user="ubuntu", replace_with=())
gates_args = NodeCapacityGatesArgs(targets={"bm-1": gate}, ssh_private_key=None, timeout_seconds=300)
"""
).replace("KEY", '"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBxYhxkAFq8yGtzKQpNLT3ZN0r6Jw1c0Kf3z8lL0Q1u1 ops@example"')

BAD = (
    BAD_IMPORTS
    + """
Worker(name="w", vmid=201, node="pve2", gpus=GPUS, memry_mib=65536)  # error: a misspelt field
Worker(name="w", vmid=201, node="pve2", gpus=GPUS, memoryMiB=65536)  # error: the stack-file key, not the name
Worker(name="w", vmid=201, node="pve2", gpus=GPUS, memory_mib="64Gi")  # error: not an int
KubeVirtSpec(patchKubeVirt=False)  # error: the stack-file key
ProxmoxNode(name="pve2", sshAddress="192.0.2.12", cpu_vendor="amd")  # error: the generated camelCase key
ProxmoxNode(name="pve2", ssh_address="192.0.2.12", cpu_vendor="arm")  # error: not one of the literals
HostGpu(name="a10-0", model="A10")  # error: pci_path is required
ExistingGpuNode(name="bm-1", gpus={"A10": 2}, time_slicng=TimeSlicing(replicas=2))  # error: a misspelt field
WorkerVmArgs(worker=W, gpu_models=("A10",), ssh_public_keys=("k",), node_ssh_adress="pve2")  # error: misspelt
WorkerVmArgs(worker=W, gpu_models=("A10",), ssh_public_keys="k")  # error: a string, not a tuple of keys
GpuClusterArgs(stack_scoped_name=True)  # error: a misspelt field (and no spec nor secrets)
GpuQuotasArgs(quotas=(), capacity=(), priority_class=("x",))  # error: a misspelt field
GuestBootstrapArgs(bootstrap=B, host="h", user="u", ssh_private_key=None, join_tokn="t")  # error: misspelt
GuestBootstrapArgs(bootstrap=B, host=22, user="u", ssh_private_key=None)  # error: an address is a str input
Worker(name="w", vmid=201, node="pve2", gpus=GPUS, memory_mib=65536, disk_gib=200)  # fine: the field names
"""
)

EXPECTED = {i for i, line in enumerate(BAD.splitlines(), 1) if "# error" in line}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("typing")
    (root / "good.py").write_text(GOOD)
    (root / "bad.py").write_text(BAD)
    return root


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)


def _mypy(programs: Path, config: Path, cache: Path) -> tuple[dict[str, set[int]], str]:
    """Error lines per program under ``mypy --strict`` with ``config``, and mypy's output."""
    cmd = [sys.executable, "-m", "mypy", "--strict", "--config-file", str(config), "--cache-dir", str(cache)]
    done = _run([*cmd, "--no-pretty", "good.py", "bad.py"], programs)
    out = done.stdout + done.stderr
    assert done.returncode in (0, 1), f"mypy did not run (exit {done.returncode}):\n{out}"
    errors: dict[str, set[int]] = {"good.py": set(), "bad.py": set()}
    for name, line in re.findall(r"^(good\.py|bad\.py):(\d+):(?:\d+:)? error:", out, re.MULTILINE):
        errors[name].add(int(line))
    return errors, out


def _check(errors: dict[str, set[int]], output: str, checker: str) -> None:
    assert errors["good.py"] == set(), f"{checker} refuses the field names:\n{output}"
    assert errors["bad.py"] == EXPECTED, (
        f"{checker}: expected errors on lines {sorted(EXPECTED)} of bad.py, got {sorted(errors['bad.py'])}:\n{output}"
    )


def test_the_program_validates_at_run_time(programs: Path) -> None:
    """The good program is a valid spec, not only a well-typed one."""
    result = runpy.run_path(str(programs / "good.py"))
    assert result["memory"] == 65536 + 200
    dumped = result["spec"].model_dump()
    assert dumped["workers"][0]["memoryMiB"] == 65536 and dumped["workers"][0]["diskGiB"] == 200
    assert dumped["kubevirt"]["patchKubeVirt"] is False


def test_mypy_with_the_pydantic_plugin(programs: Path, tmp_path: Path) -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert "pydantic.mypy" in config["plugins"], "the project's mypy configuration no longer loads the plugin"
    errors, out = _mypy(programs, ROOT / "pyproject.toml", tmp_path / "cache")
    _check(errors, out, "mypy (pydantic plugin)")


def test_mypy_without_the_plugin(programs: Path, tmp_path: Path) -> None:
    """The project's configuration, the plugin left out: what a user's mypy without it sees."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    config = {k: v for k, v in config.items() if k not in ("plugins", "packages")}
    lines = ["[tool.mypy]"] + [f"{k} = {json.dumps(v)}" for k, v in config.items() if k != "overrides"]
    for override in config.get("overrides", []):
        lines += ["[[tool.mypy.overrides]]"] + [f"{k} = {json.dumps(v)}" for k, v in override.items()]
    (tmp_path / "mypy.toml").write_text("\n".join(lines) + "\n")
    errors, out = _mypy(programs, tmp_path / "mypy.toml", tmp_path / "cache")
    _check(errors, out, "mypy (no plugin)")


def test_pyright_strict(programs: Path) -> None:
    try:
        importlib.import_module("pyright")
    except ImportError:
        pytest.fail("pyright is not installed; it is in the test extras: pip install -e '.[test]'")
    (programs / "pyrightconfig.json").write_text(json.dumps({"typeCheckingMode": "strict", "pythonVersion": "3.11"}))
    cmd = [sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable, "good.py", "bad.py"]
    done = _run(cmd, programs)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"pyright did not run (exit {done.returncode}):\n{done.stdout}\n{done.stderr}")
    errors: dict[str, set[int]] = {"good.py": set(), "bad.py": set()}
    for diagnostic in report["generalDiagnostics"]:
        if diagnostic["severity"] == "error":
            errors[Path(diagnostic["file"]).name].add(diagnostic["range"]["start"]["line"] + 1)
    _check(errors, json.dumps(report["generalDiagnostics"], indent=1), "pyright --strict")


def test_no_spec_field_takes_an_explicit_alias() -> None:
    """``Field(alias=...)`` would rename the field's __init__ parameter for pyright and plain mypy only. Every
    spec model of the package, imported: its keys come from an alias generator (alias priority 1)."""
    for module in pkgutil.walk_packages(proxmox_gpu_cluster.__path__, "proxmox_gpu_cluster."):
        if not module.name.startswith("proxmox_gpu_cluster.agent"):
            importlib.import_module(module.name)
    models: list[type[SpecModel]] = []
    pending: list[type[SpecModel]] = [SpecModel]
    while pending:
        model = pending.pop()
        models.append(model)
        pending += model.__subclasses__()
    explicit = [
        f"{m.__name__}.{name} (alias {field.alias!r})"
        for m in models
        for name, field in m.model_fields.items()
        if field.alias_priority != 1
    ]
    assert len(models) > 30 and not explicit, explicit
    worker = next(m for m in models if m.__name__ == "Worker").model_fields
    assert (worker["memory_mib"].alias, worker["disk_gib"].alias) == ("memoryMiB", "diskGiB")
