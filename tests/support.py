"""Shared test helpers: a valid base spec, the stack program under mocks, and external reference data."""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from hypothesis import strategies as st

from proxmox_gpu_cluster import GpuCluster, GpuClusterArgs, Secrets, export
from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.spec import ClusterSpec, load_spec
from proxmox_gpu_cluster.stacks.config import load
from proxmox_gpu_cluster.testing import Recording, RecordingMocks, is_secret, run
from proxmox_gpu_cluster.testing_pci import pci_invokes, spec_shaped_pci

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
PCI_IDS = Path("/usr/share/misc/pci.ids")
CHART_VERSIONS = ("v25.10.1", "v26.7.0")


def external(path: Path, what: str, install: str) -> Path:
    """``path`` if it exists. Otherwise skip with the reason, except under the project's CI (.ci/run sets
    PGC_REQUIRE_EXTERNAL=1), where it must exist. A user's CI (GitHub sets CI=true) has no ../shared: it skips."""
    if path.exists():
        return path
    message = f"{what} not found at {path}; {install}"
    if os.environ.get("PGC_REQUIRE_EXTERNAL"):
        pytest.fail(f"{message} (CI must provide it)")
    pytest.skip(message)


def tools_dir() -> Path:
    """The cache of the real tools the tests run (``make -s tools-path``), outside the clone."""
    return Path(
        subprocess.run(
            ["bash", str(ROOT / "tools" / "tools.sh"), "path"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )


def built_tool(name: str) -> Path:
    """A tool ``make tools`` builds (tools/recipes/): skipped with the reason where it was not built, required in CI."""
    return external(tools_dir() / "bin" / name, f"{name} (built by make tools)", "build it with: make tools")


def shared_reference(tag: str, name: str) -> Path:
    """A file of the GPU Operator chart reference in ../shared (a user's clone has none)."""
    return external(
        SHARED / "reference" / "gpu-operator" / tag / name,
        "GPU Operator chart reference",
        "it lives in ../shared beside the repository, which only the project's own checkout has",
    )


def reference_file(*parts: str) -> Path:
    """Any file of the upstream reference in ../shared (prometheus-operator CRDs, the DRA chart, ...)."""
    return external(
        SHARED.joinpath("reference", *parts),
        "upstream reference file",
        "it lives in ../shared beside the repository, which only the project's own checkout has",
    )


def promtool() -> Path:
    """Prometheus's promtool, which evaluates alert rules against synthetic series (``promtool test rules``)."""
    found = shutil.which("promtool")
    return external(Path(found or "/usr/bin/promtool"), "promtool", "install it with: apt-get install prometheus")


def promql_metrics(expr: str) -> set[str]:
    """Every metric name a PromQL expression selects, as a real PromQL parser (promql-parser) reads it."""
    import promql_parser

    def walk(node: Any) -> set[str]:
        if isinstance(node, promql_parser.VectorSelector):
            return {node.name} if node.name else set()
        out: set[str] = set()
        for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (str, int, float)):
                out |= walk(child)
        for arg in getattr(node, "args", None) or []:
            out |= walk(arg)
        return out

    return walk(promql_parser.parse(expr))


def pci_ids() -> Path:
    """Debian's pci.ids database."""
    return external(PCI_IDS, "pci.ids", "install it with: apt-get install pci.ids")


_BASE: dict[str, Any] = {
    "proxmox": {
        "endpoint": "https://pve1.example.test:8006/",
        "authMode": "token",
        "nodes": [
            {
                "name": "pve1",
                "sshAddress": "192.0.2.11",
                "cpuVendor": "amd",
                "gpus": [
                    {"name": "a100-0", "pciPath": "0000:41:00", "model": "A100-PCIE-40GB"},
                    {"name": "a100-1", "pciPath": "0000:42:00", "model": "A100-PCIE-40GB"},
                    {"name": "a10-0", "pciPath": "0000:81:00", "model": "A10"},
                    {"name": "vga", "pciPath": "0000:03:00", "model": "T4", "console": True},
                ],
            },
            {
                "name": "pve2",
                "sshAddress": "192.0.2.12",
                "cpuVendor": "intel",
                "gpus": [
                    {"name": "a10-0", "pciPath": "0000:17:00", "model": "A10"},
                    {"name": "a10-1", "pciPath": "0000:18:00", "model": "A10"},
                ],
            },
        ],
    },
    "workers": [
        {
            "name": "mig-1",
            "vmid": 2001,
            "node": "pve1",
            "gpus": ["a100-0"],
            "sharing": "mig",
            "mig": "all-1g.5gb",
        },
        {
            "name": "mig-2",
            "vmid": 2002,
            "node": "pve1",
            "gpus": [{"ref": "a100-1", "mig": {"3g.20gb": 1, "2g.10gb": 1, "1g.5gb": 2}}],
            "sharing": "mig",
        },
        {
            "name": "ts-1",
            "vmid": 2003,
            "node": "pve2",
            "gpus": ["a10-0", "a10-1"],
            "sharing": "time-slicing",
            "timeSlicing": {"replicas": 4},
            "network": {"ipv4": "192.0.2.60/24", "gateway": "192.0.2.1", "dns": ["192.0.2.1"]},
        },
    ],
    "kubernetes": {"apiEndpoint": "k8s.example.test:6443", "version": "1.34"},
    "guest": {
        "sshPublicKeys": [
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBxYhxkAFq8yGtzKQpNLT3ZN0r6Jw1c0Kf3z8lL0Q1u1 ops@example"
        ]
    },
    "gpuOperator": {"migStrategy": "mixed"},
    "quotas": [{"namespace": "team-a", "resources": {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.5gb": 2}}],
}


def base_spec() -> dict[str, Any]:
    """A fresh deep copy of a valid spec exercising MIG (named and custom), time-slicing and quotas."""
    return copy.deepcopy(_BASE)


def two_team_specs() -> tuple[dict[str, Any], dict[str, Any]]:
    """Two specs on the base spec's hosts and Kubernetes API, owning disjoint GPUs, workers and objects."""
    a, b = base_spec(), base_spec()
    a["workers"] = [w for w in a["workers"] if w["name"] != "mig-2"]  # mig-1 on pve1, ts-1 on pve2
    b["workers"] = [{**b["workers"][1], "name": "team-b-1", "vmid": 9001, "gpus": ["a100-1"], "sharing": "none"}]
    a["proxmox"]["nodes"][0]["gpus"] = [g for g in a["proxmox"]["nodes"][0]["gpus"] if g["name"] != "a100-1"]
    b["proxmox"]["nodes"] = [{**b["proxmox"]["nodes"][0], "gpus": [g for g in b["proxmox"]["nodes"][0]["gpus"]
                                                                 if g["name"] == "a100-1"]}]  # fmt: skip
    b["gpuOperator"] = {"enabled": False}
    b["kubernetes"]["drain"] = {"slotNamespace": "team-b-rollouts"}
    b["priorityClasses"], b["quotas"] = [], []
    a["quotas"] = []
    return a, b


VGPU_MANAGER = {"repository": "registry.example.test/nvidia", "version": "580.95.02"}
"""A private vGPU Manager image for specs with vm-vgpu nodes."""


def make_vm_worker(raw: dict[str, Any], i: int, workload: str, vgpu_type: str = "A10-24Q") -> dict[str, Any]:
    """Turn ``workers[i]`` of a raw spec into a KubeVirt worker: KubeVirt enabled (with the vGPU Manager image
    for vm-vgpu), no container sharing, and no quotas (the base spec's quotas are on container resources)."""
    kubevirt = raw.setdefault("kubevirt", {})
    kubevirt["enabled"] = True
    worker = raw["workers"][i]
    for key in ("timeSlicing", "mig"):
        worker.pop(key, None)
    worker.update(workload=workload, sharing="none")
    if workload == "vm-vgpu":
        worker["vgpuType"] = vgpu_type
        kubevirt["vgpuManager"] = dict(VGPU_MANAGER)
    raw["quotas"] = []
    return raw


SECRETS = {
    "proxmoxApiToken": "root@pam!ci=CANARY-PVE-TOKEN",
    "proxmoxPassword": "CANARY-PVE-PASSWORD",
    "sshPrivateKey": "-----BEGIN OPENSSH PRIVATE KEY-----CANARY-SSH-----END OPENSSH PRIVATE KEY-----",
    "kubeconfig": "apiVersion: v1\nkind: Config\n# CANARY-KUBECONFIG\n",
    "kubeadmJoinToken": "abcdef.CANARYJOIN0000",
    "kubeadmCaCertHash": "sha256:CANARYHASH",
    "vgpuRegistryPassword": "CANARY-VGPU-REGISTRY",
}


def plain_strings(value: Any) -> list[str]:
    """Every string in ``value`` that is not inside a secret envelope (where a leaked secret would show)."""
    if is_secret(value):
        return []
    if isinstance(value, dict):
        return [s for v in value.values() for s in plain_strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in plain_strings(v)]
    return [value] if isinstance(value, str) else []


def stack_config(spec: dict[str, Any], secrets: dict[str, str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Config and secret keys for ``components.testing.run`` from a spec and canary secrets."""
    secrets = SECRETS if secrets is None else secrets
    config: dict[str, Any] = {"proxmox-gpu-cluster:cluster": spec}
    config.update({f"proxmox-gpu-cluster:{k}": v for k, v in secrets.items()})
    return config, [f"proxmox-gpu-cluster:{k}" for k in secrets]


def stack_args(spec: ClusterSpec, secrets: Secrets) -> GpuClusterArgs:
    """The args this repository's stack program gives its cluster (``__main__.py``)."""
    return GpuClusterArgs(spec=spec, secrets=secrets, aliases_from_stack_root=True, stack_scoped_names=True)


def plan_stack(
    raw: dict[str, Any],
    devices: dict[str, list[dict[str, Any]]] | None = None,
    recording: Recording | None = None,
    stack: str = "test",
    secrets: dict[str, str] | None = None,
) -> Recording:
    """Run the stack program (build, then export) for ``raw`` with the canary secrets (or ``secrets``) under mocks,
    as ``stack``. ``get_pci`` answers from ``devices`` (node -> device list) where given, else like the spec's hosts."""
    config, keys = stack_config(raw, secrets)
    mocks = RecordingMocks(invokes=pci_invokes(load_spec(raw), devices))
    return run(
        lambda: export(GpuCluster("cluster", stack_args(*load()))),
        stack=stack,
        config=config,
        secret_keys=keys,
        mocks=mocks,
        recording=recording,
    )


def prod_spec() -> dict[str, Any]:
    """The cluster spec of Pulumi.prod.yaml."""
    document = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text())
    spec: dict[str, Any] = document["config"]["proxmox-gpu-cluster:cluster"]
    return spec


def shared_group(spec_raw: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """pve2's device list shaped like the spec, plus an I210 NIC in the same IOMMU group as its GPU a10-1."""
    devices = spec_shaped_pci(load_spec(spec_raw), "pve2")
    nic = dict(devices[-1], id="0000:19:00.0", vendor="0x8086", device="0x1533", deviceName="I210 Gigabit",
               **{"class": "0x020000"})  # fmt: skip
    nic["iommuGroup"] = devices[-1]["iommuGroup"]  # same group as a10-1
    return {"pve2": [*devices, nic]}


def spec_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key/index path into a raw spec (the root's empty path first), for mutation tests."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += spec_paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += spec_paths(v, (*prefix, i))
    return out


def replace_at_random(spec: Any, data: st.DataObject, values: st.SearchStrategy[Any], times: tuple[int, int]) -> None:
    """Replace between ``times[0]`` and ``times[1]`` values anywhere in ``spec`` with ``values`` (hypothesis draws
    how many, where and what)."""
    for _ in range(data.draw(st.integers(*times))):
        path = data.draw(st.sampled_from([p for p in spec_paths(spec) if p]))
        parent: Any = spec
        for part in path[:-1]:
            parent = parent[part]
        parent[path[-1]] = data.draw(values)


def without_operator(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with the GPU Operator off and everything that needs it gone: no time-slicing or MIG on any worker
    (refused without the operator), no quotas on the resources they advertised."""
    raw["gpuOperator"]["enabled"] = False
    for worker in raw["workers"]:
        worker["sharing"] = "none"
        for key in ("mig", "timeSlicing"):
            worker.pop(key, None)
        worker["gpus"] = [g["ref"] if isinstance(g, dict) else g for g in worker["gpus"]]
    raw["quotas"] = []
    return raw


def errors_of(raw: Any) -> list[str]:
    """The problem lines ``load_spec`` raises for ``raw`` (the test fails if it accepts it)."""
    with pytest.raises(SpecError) as info:
        load_spec(raw)
    return info.value.lines


def assert_problem(case: str, lines: list[str], path: str, message: str) -> None:
    """One of ``lines`` is ``<path>: ...<message>...``."""
    matching = [line for line in lines if line.startswith(f"{path}: ") and message in line]
    assert matching, f"{case}: expected '{path}: ...{message}...' in\n" + "\n".join(lines)


def plan_scale() -> ModuleType:
    """benchmarks/plan_scale.py as a module (its generated specs serve the scale and depth tests too)."""
    spec = importlib.util.spec_from_file_location("plan_scale", ROOT / "benchmarks" / "plan_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
