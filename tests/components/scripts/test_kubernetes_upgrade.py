"""A joined worker's Kubernetes minor upgrade (guest_join.sh, agent/upgrade.py) with the REAL apt, dpkg and gpg
against pkgs.k8s.io-shaped repositories for 1.33 and 1.34 (k8srepo.py, test_real_apt_join.py) and a REAL
kube-apiserver v1.34.4 with the real kubectl (tests/kubeapi_real.py), as the node itself (kubelet's client
certificate: the Node authorizer, NodeRestriction and the node-steps RBAC decide): the API server's version read
first, the slot, cordon and drain by Eviction, kubeadm, ``kubeadm upgrade node``, kubelet and kubectl, the restart,
the Node reporting the new version, the verify step's uncordon; a minor the control plane has not reached refused
before anything changes; a kill at every command, then a run that finishes it.

What stays a model: kubeadm (``upgrade node`` writes the kubelet configuration, fakeguest_tools.py) and the kubelet,
which when restarted reports its installed package's version in its Node's ``status.nodeInfo.kubeletVersion``
(kubernetes pkg/kubelet/nodestatus/setters.go, VersionInfo): the systemctl stub patches it as the node."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from proxmox_gpu_cluster.core.guest_spec import GuestBootstrapSpec
from proxmox_gpu_cluster.render.guest_scripts import join_args, verify_args
from tests.components.scripts import k8srepo
from tests.components.scripts.fakeguest_tools import STUBS
from tests.components.scripts.test_guest_bootstrap_scripts import SECRETS
from tests.components.scripts.test_real_apt_join import K8sAptGuest, archives
from tests.kubeapi_real import RealCluster, real_cluster

__all__ = ["archives", "real_cluster"]  # the fixtures, imported for pytest

pytestmark = pytest.mark.slow

OLD, NEW = k8srepo.PATCHES["33"][-1], k8srepo.PATCHES["34"][-1]
K8S = ("kubelet", "kubeadm", "kubectl")
SLOT0 = "proxmox-gpu-cluster-rollout-0"
MARKER = "var/lib/proxmox-gpu-cluster/kubernetes-upgrade"

# The kubelet model: a restart makes the Node report the installed kubelet's version. Written with the admin's
# credential: the kubelet PATCHes nodes/status, which the node may, but kubectl patch GETs it first, which it may not.
_KUBELET = r"""if [ "$1 $2" = "restart kubelet" ]; then
  R="$PGC_ROOT"; v="$(/usr/bin/dpkg-query --admindir="$R/var/lib/dpkg" -W -f='${{Version}}' kubelet)"
  KUBECACHEDIR="$R/kubectl-cache" "{kubectl}" --kubeconfig "{admin}" --request-timeout=30s \
    patch node "$(cat "$R/test-node-name")" --subresource=status --type=merge \
    -p "{{\"status\":{{\"nodeInfo\":{{\"kubeletVersion\":\"v${{v%%-*}}\"}}}}}}" >/dev/null || exit 1
fi
"""


def spec(rc: RealCluster, node: str, slots: str, minor: int) -> GuestBootstrapSpec:
    return GuestBootstrapSpec.model_validate(
        {
            "nodeName": node, "gpus": [{"vendorDevice": "10de:2236", "product": "NVIDIA-A10"}],
            "driverMode": "operator", "driverBranch": "580", "kernelModules": "open", "toolkit": False,
            "apiEndpoint": rc.server, "kubernetesMinor": minor,
            "rollout": {"drainTimeoutSeconds": 30, "namespace": slots},
        }
    )  # fmt: skip


def world(rc: RealCluster) -> tuple[str, str, str]:
    """A node running one pod, the pod's namespace, and a slot namespace with the node-steps RBAC."""
    node, ns, slots = rc.unique("gpu-a"), rc.unique("ml"), rc.unique("slots")
    rc.node(node)
    rc.namespace(ns)
    rc.node_steps_rbac(slots)
    rc.pod(ns, "train-0", node)
    return node, ns, slots


def as_node(rc: RealCluster, guest: K8sAptGuest, node: str, build: str) -> None:
    """``guest`` joined as ``node``: kubelet's credential, and the Node reporting kubelet ``build``."""
    rc.node_kubeconfig(node, guest.root / "etc/kubernetes/kubelet.conf")
    guest.write("test-node-name", node)
    rc.status("node", node, {"nodeInfo": {"kubeletVersion": "v" + build.split("-", maxsplit=1)[0]}})


def joined(rc: RealCluster, root: Path, archives: tuple[Path, Path], minor: int) -> K8sAptGuest:
    """A guest that installed ``minor``'s packages and joined (the fake kubeadm join), with the real kubectl."""
    guest = K8sAptGuest(root, *archives)
    guest.stub_script("kubectl", f'KUBECACHEDIR="$PGC_ROOT/kubectl-cache" "{rc.kubectl}" "$@"')
    guest.stub_script("sleep", ":")  # the drain's and the waits' polls take no time
    guest.stub_script("systemctl", _KUBELET.format(kubectl=rc.kubectl, admin=rc.admin) + STUBS["systemctl"])
    first = guest.step("join", *join_args(spec(rc, "not-joined-yet", "none", minor)), secrets=SECRETS)
    assert first.returncode == 0, first.stderr
    return guest


def kubelet_version(rc: RealCluster, node: str) -> str:
    return str(rc.get("node", node)["status"]["nodeInfo"]["kubeletVersion"])


def held(rc: RealCluster, namespace: str) -> dict[str, str]:
    items = rc.get("configmaps", "-n", namespace)["items"]
    return {i["metadata"]["name"]: h for i in items if (h := (i.get("data") or {}).get("holder"))}


def cordoned(rc: RealCluster, node: str) -> bool:
    return bool(rc.get("node", node).get("spec", {}).get("unschedulable"))


def at(guest: K8sAptGuest, build: str) -> None:
    status = guest.status()
    assert {p: status.get(p) for p in K8S} == {p: f"hi {build}" for p in K8S}


def finished(rc: RealCluster, guest: K8sAptGuest, b: GuestBootstrapSpec, node: str, slots: str) -> None:
    """The upgrade done: packages, the Node's report, no marker; then verify uncordons and frees the slot."""
    at(guest, NEW)
    assert kubelet_version(rc, node) == "v" + NEW.split("-")[0]
    assert not (guest.root / MARKER).exists()
    verify = guest.step("verify", *verify_args(b))
    assert verify.returncode == 0, verify.stderr
    assert not cordoned(rc, node) and held(rc, slots) == {}


def test_a_joined_worker_moves_up_one_minor_inside_its_slot(
    real_cluster: RealCluster, tmp_path: Path, archives: tuple[Path, Path]
) -> None:
    rc = real_cluster
    node, ns, slots = world(rc)
    guest = joined(rc, tmp_path / "g", archives, 33)
    as_node(rc, guest, node, OLD)
    b = spec(rc, node, slots, 34)
    r = guest.step("join", *join_args(b), secrets=SECRETS)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.index("kubernetes: API server v1.34.4") < out.index(f"rollout: {node} took slot")
    assert "(Kubernetes 1.33 -> 1.34)" in out and f"rollout: drained {node}" in out
    assert rc.pods(ns) == []  # evicted before anything changed
    # kubeadm first, `kubeadm upgrade node` with it, then kubelet and kubectl, then the restart (the upgrade guide)
    calls = r.calls
    first = [calls.index(c) for c in calls if c.startswith("apt-get") and f"kubeadm={NEW}" in c]
    upgrade = calls.index("kubeadm upgrade node")
    kubelet = [calls.index(c) for c in calls if c.startswith("apt-get") and f"kubelet={NEW}" in c]
    restart = calls.index("systemctl restart kubelet")
    assert first and kubelet and first[0] < upgrade < kubelet[0] < restart, calls
    assert f"kubeadm upgrade node {NEW.split('-')[0]}" in guest.read("var/lib/kubelet/config.yaml")
    assert cordoned(rc, node) and held(rc, slots) == {SLOT0: node}  # until verify passes
    finished(rc, guest, b, node, slots)
    again = guest.step("join", *join_args(b), secrets=SECRETS)
    assert again.returncode == 0 and "kubernetes: packages 1.34 (present)" in again.stdout
    assert not [c for c in again.calls if c.startswith(("apt-get", "kubeadm", "kubectl", "systemctl restart"))]


def test_a_minor_the_api_server_has_not_reached_is_refused_before_anything_changes(
    real_cluster: RealCluster, tmp_path: Path, archives: tuple[Path, Path]
) -> None:
    rc = real_cluster
    node, ns, slots = world(rc)
    guest = joined(rc, tmp_path / "g", archives, 34)
    as_node(rc, guest, node, NEW)
    r = guest.step("join", *join_args(spec(rc, node, slots, 35)), secrets=SECRETS)
    assert r.returncode == 1
    assert r.stderr.startswith(
        "join: API server version: expected 1.35 or later (a kubelet is never newer than its API server), saw "
        "v1.34.4: upgrade the control plane first (kubeadm upgrade apply), then run pulumi up again"
    ), r.stderr
    at(guest, NEW)
    assert not cordoned(rc, node) and held(rc, slots) == {} and rc.pods(ns) == ["train-0"]
    assert not (guest.root / MARKER).exists()
    assert not [c for c in r.calls if c.startswith(("apt-get install", "kubeadm", "systemctl"))]


def test_a_kill_at_any_command_of_the_upgrade_is_finished_by_the_next_run(
    real_cluster: RealCluster, tmp_path: Path, archives: tuple[Path, Path]
) -> None:
    rc = real_cluster
    base = joined(rc, tmp_path / "base", archives, 33)
    node, _, slots = world(rc)
    ref = K8sAptGuest.copy(base, tmp_path / "ref")
    as_node(rc, ref, node, OLD)
    calls = ref.step("join", *join_args(spec(rc, node, slots, 34)), secrets=SECRETS).calls
    assert len(calls) > 20, calls
    for n in range(1, len(calls) + 1):
        node, _, slots = world(rc)
        b = spec(rc, node, slots, 34)
        g = K8sAptGuest.copy(base, tmp_path / f"kill-{n}")
        as_node(rc, g, node, OLD)
        g.fault(n, "kill")
        g.step("join", *join_args(b), secrets=SECRETS)
        g.fault(None)
        r = g.step("join", *join_args(b), secrets=SECRETS)
        assert r.returncode == 0, (n, calls[n - 1], r.stderr)
        finished(rc, g, b, node, slots)
        shutil.rmtree(g.root)
