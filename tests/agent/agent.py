"""Load the node agent's modules as the machine runs them (files, not the installed package, their directory on
sys.path as the bundle's is), and wire them to a FakeCluster's kubectl with a node's own credential."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.components.scripts.fakekube import SLOT_NAMESPACE, FakeCluster, kubelet_conf

AGENT = Path(__file__).resolve().parents[2] / "components" / "agent"
KUBECONFIG = "apiVersion: v1\nkind: Config\nusers:\n- name: admin\n  user: {token: CANARY-AGENT-TOKEN}\n"
ENDPOINT = "k8s.example.test:6443"


def load(name: str) -> ModuleType:
    """components/agent/<name>.py as its own module (it imports nothing of the package)."""
    key = f"pgc_agent_{name}"
    if str(AGENT) not in sys.path:  # cluster.py imports kubeapi.py from its own directory, as on the machine
        sys.path.append(str(AGENT))
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, AGENT / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


cluster = load("cluster")
kubeapi = sys.modules["kubeapi"]  # as cluster.py imported it from its directory
capacity = load("capacity")
mig_manager = load("mig_manager")


def make_cluster(tmp_path: Path, nodes: list[str], **state: Any) -> FakeCluster:
    fake = FakeCluster(tmp_path / "api.json", KUBECONFIG, nodes=nodes)
    fake.save(**state)
    return fake


def kube(fake: FakeCluster, tmp_path: Path, step: str = "rollout", config: str | None = None, *,
         node: str = "gpu-a") -> Any:  # fmt: skip
    """cluster.Kube talking to ``fake`` as ``node`` (its kubelet credential; ``config``: another kubeconfig)."""
    path = tmp_path / f"kubelet-{node}.conf"
    path.write_text(kubelet_conf(node) if config is None else config)
    path.chmod(0o600)
    return cluster.Kube(step, str(path), ENDPOINT, command=fake.command())


def rollout(fake: FakeCluster, tmp_path: Path, node: str, **settings: Any) -> Any:
    """A cluster.Rollout for ``node``, acting as ``node``, whose waits take no time."""
    settings.setdefault("sleep", lambda seconds: None)
    return cluster.Rollout(kube(fake, tmp_path, node=node), node, **settings)


def held(fake: FakeCluster) -> dict[str, str]:
    """Slot -> holder of every held slot (the slot ConfigMaps in the default namespace)."""
    maps = fake.state()["configmaps"].items()
    prefix = f"{SLOT_NAMESPACE}/"
    return {
        key.removeprefix(prefix): h for key, cm in maps if key.startswith(prefix) and (h := cm["data"].get("holder"))
    }


def concurrent_takes(takers: list[Any]) -> set[str]:
    """The slots that runs of one node's step (``Rollout``s), all taking at once from threads, ended up with (each
    tries up to 20 times; one that never gets a slot fails the test)."""

    def take(r: Any) -> str:
        for _ in range(20):
            if (slot := r.take()) is not None:
                return str(slot)
        raise AssertionError("no slot")

    with concurrent.futures.ThreadPoolExecutor(len(takers)) as pool:
        return set(pool.map(take, takers))
