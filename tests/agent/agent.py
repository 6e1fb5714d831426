"""Load the node agent's modules as the machine runs them (files, not the installed package), and wire them to a
FakeCluster's kubectl."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.components.scripts.fakekube import FakeCluster

AGENT = Path(__file__).resolve().parents[2] / "components" / "agent"
KUBECONFIG = "apiVersion: v1\nkind: Config\nusers:\n- name: admin\n  user: {token: CANARY-AGENT-TOKEN}\n"
ENDPOINT = "k8s.example.test:6443"


def load(name: str) -> ModuleType:
    """components/agent/<name>.py as its own module (it imports nothing of the package)."""
    key = f"pgc_agent_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, AGENT / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


cluster = load("cluster")
capacity = load("capacity")


def make_cluster(tmp_path: Path, nodes: list[str], **state: Any) -> FakeCluster:
    fake = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=nodes)
    fake.save(**state)
    return fake


def kube(fake: FakeCluster, tmp_path: Path, step: str = "rollout", config: str = KUBECONFIG) -> Any:
    """cluster.Kube talking to ``fake`` with a mode-600 kubeconfig file holding ``config``."""
    path = tmp_path / "kubeconfig"
    path.write_text(config)
    path.chmod(0o600)
    return cluster.Kube(step, str(path), ENDPOINT, command=fake.command())


def rollout(fake: FakeCluster, tmp_path: Path, node: str, **settings: Any) -> Any:
    """A cluster.Rollout for ``node`` whose waits take no time."""
    settings.setdefault("sleep", lambda seconds: None)
    return cluster.Rollout(kube(fake, tmp_path), node, **settings)


def held(fake: FakeCluster) -> dict[str, str]:
    """Slot -> holder of every held slot."""
    leases = fake.state()["leases"].items()
    return {name: holder for name, lease in leases if (holder := lease["spec"].get("holderIdentity"))}
