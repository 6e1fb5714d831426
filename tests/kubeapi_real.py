"""A real Kubernetes API server for the node agent's tests: etcd and kube-apiserver (built by tools/recipes), on
127.0.0.1 only, with the Node authorizer, RBAC and the NodeRestriction admission plugin, as a kubeadm cluster runs it.

Every credential is a client certificate signed by a test CA made with openssl: the admin's (O=system:masters, for
the test's setup and inspection) and each node's (CN=system:node:<name>, O=system:nodes, what kubeadm join gives the
kubelet: the Node authorizer identifies nodes by that user name and group). One server per pytest process (xdist
workers each start their own on their own ports, with their own etcd data in that worker's tmp folder); tests share
it and keep apart by their own node names and namespaces (``RealCluster.unique``).

No kubelet, scheduler or controller manager runs: a test binds pods to nodes itself (spec.nodeName), sets what the
kubelet and the controllers would (pod phase and readiness, a PodDisruptionBudget's status, a node's allocatable)
with the admin's credential through the status subresources.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from proxmox_gpu_cluster.render import node_rbac
from tests.support import built_tool, external

STARTUP_SECONDS = 90  # etcd and kube-apiserver together take 5-15 s here; a loaded CI machine more
_counter = itertools.count()


def free_port() -> int:
    """A port the kernel just handed out on 127.0.0.1 (xdist workers each ask for their own)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, text=True)


@dataclass
class RealCluster:
    """A running kube-apiserver: its address (HOST:PORT), kubectl, the admin kubeconfig and the test CA."""

    root: Path
    server: str
    kubectl: Path
    admin: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def command(self) -> list[str]:
        """kubectl as an argv prefix, its discovery cache in this server's folder (KUBECACHEDIR, k8s.io/cli-runtime
        genericclioptions/config_flags.go), never in $HOME/.kube or, with no HOME, the working directory."""
        return ["env", f"KUBECACHEDIR={self.root / 'kubectl-cache'}", str(self.kubectl)]

    def unique(self, prefix: str) -> str:
        """A name no other test of this server uses (node names, namespaces)."""
        return f"{prefix}-{os.getpid()}-{next(_counter)}"

    def credential(self, user: str, groups: tuple[str, ...] = ()) -> tuple[Path, Path]:
        """A client certificate and key for ``user`` in ``groups`` (the certificate's CN and O), signed by the CA."""
        name = user.replace(":", "_")
        key, csr, crt = (self.root / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
        if not crt.exists():
            subject = "/CN=" + user + "".join(f"/O={g}" for g in groups)
            openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(key), "-out", str(csr), "-subj", subject, cwd=self.root)  # fmt: skip
            openssl("x509", "-req", "-in", str(csr), "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                    "-days", "2", "-out", str(crt), cwd=self.root)  # fmt: skip
        return crt, key

    def kubeconfig(self, user: str, groups: tuple[str, ...] = (), path: Path | None = None) -> Path:
        """A kubeconfig for ``user`` (as kubeadm writes kubelet.conf: the server, the CA, a client certificate)."""
        crt, key = self.credential(user, groups)
        path = path or self.root / f"{user.replace(':', '_')}.conf"
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": f"https://{self.server}",
                                                   "certificate-authority": str(self.root / "ca.crt")}}],
            "users": [{"name": "u", "user": {"client-certificate": str(crt), "client-key": str(key)}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        }  # fmt: skip
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    def node_kubeconfig(self, node: str, path: Path | None = None) -> Path:
        """The kubelet's credential of ``node``: user system:node:<node> in group system:nodes."""
        return self.kubeconfig(f"system:node:{node}", ("system:nodes",), path)

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """kubectl as the admin."""
        argv = [*self.command(), "--kubeconfig", str(self.admin), "--request-timeout=30s", *args]
        proc = subprocess.run(argv, input=stdin or "", capture_output=True, text=True, check=False)
        if check and proc.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: exit {proc.returncode}: {proc.stderr}")
        return proc

    def get(self, *args: str) -> Any:
        return json.loads(self.run("get", *args, "-o", "json").stdout)

    def apply(self, *objects: dict[str, Any]) -> None:
        self.run("apply", "--server-side", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                        "items": list(objects)}))  # fmt: skip

    def status(self, kind: str, name: str, status: dict[str, Any], namespace: str | None = None) -> None:
        """Patch an object's status (what the kubelet or a controller would write)."""
        where = ["-n", namespace] if namespace else []
        patch = json.dumps({"status": status})
        self.run("patch", kind, name, *where, "--subresource=status", "--type=merge", "-p", patch)

    def node_steps_rbac(self, namespace: str) -> None:
        """What the cluster's NodeStepAccess creates (render/node_rbac.py), for slots in ``namespace``."""
        self.apply(*node_rbac.objects(namespace))

    def node(self, name: str, labels: dict[str, str] | None = None, allocatable: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None) -> None:  # fmt: skip
        """A Node object as a joined kubelet registers it (with what the device plugin advertises)."""
        meta: dict[str, Any] = {"name": name, "labels": labels or {}, "annotations": annotations or {}}
        self.apply({"apiVersion": "v1", "kind": "Node", "metadata": meta})
        if allocatable is not None:
            self.status("node", name, {"allocatable": allocatable, "capacity": allocatable})

    def namespace(self, name: str) -> None:
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                   {"apiVersion": "v1", "kind": "ServiceAccount",  # no controller manager creates it
                    "metadata": {"name": "default", "namespace": name}})  # fmt: skip

    def pod(self, namespace: str, name: str, node: str, *, owner: str | None = "ReplicaSet", emptydir: bool = False,
            labels: dict[str, str] | None = None, phase: str = "Running") -> None:  # fmt: skip
        """A pod bound to ``node`` (no scheduler), running and ready as its kubelet would report it. Its grace
        period is 0: with no kubelet to confirm a graceful delete, an evicted pod goes at once."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {"app": name}}
        if owner:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": owner,
                    "name": f"{name}-owner",
                    "uid": "00000000-0000-0000-0000-000000000001",
                    "controller": True,
                }
            ]
        spec: dict[str, Any] = {
            "nodeName": node, "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "registry.invalid/pause:1"}],
        }  # fmt: skip
        if emptydir:
            spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        self.apply({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
        ready = "True" if phase == "Running" else "False"
        self.status("pod", name, {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]}, namespace)

    def pdb(self, namespace: str, name: str, app: str, allowed: int) -> None:
        """A PodDisruptionBudget over the pods labelled app=<app>, with the status the disruption controller would
        give it: ``allowed`` evictions left."""
        self.apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}}})  # fmt: skip
        generation = self.get("pdb", name, "-n", namespace)["metadata"]["generation"]
        self.status("pdb", name, {"observedGeneration": generation, "disruptionsAllowed": allowed,
                                  "currentHealthy": 1 + allowed, "desiredHealthy": 1, "expectedPods": 1 + allowed},
                    namespace)  # fmt: skip

    def pods(self, namespace: str) -> list[str]:
        return sorted(p["metadata"]["name"] for p in self.get("pods", "-n", namespace)["items"])

    def stop(self) -> None:
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _pki(root: Path) -> None:
    """The test CA, the API server's serving certificate for 127.0.0.1, the service-account key, the admin."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=pgc-test-ca", cwd=root)  # fmt: skip
    (root / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
            "apiserver.key", "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver", cwd=root)  # fmt: skip
    openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "san.ext", "-out", "apiserver.crt", cwd=root)  # fmt: skip
    openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=root)
    openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=root)


def _wait_ready(cluster: RealCluster, log: Path) -> None:
    """Poll /readyz as the admin until it answers ok, or fail with the server's log tail (bounded)."""
    crt, key = cluster.credential("pgc-admin", ("system:masters",))
    context = ssl.create_default_context(cafile=str(cluster.root / "ca.crt"))
    context.load_cert_chain(str(crt), str(key))
    deadline, said = time.monotonic() + STARTUP_SECONDS, ""
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in cluster.processes):
            break
        try:
            with urllib.request.urlopen(f"https://{cluster.server}/readyz", context=context, timeout=5) as r:
                if r.read() == b"ok":
                    return
        except OSError as error:  # refused while starting; 500 while a post-start hook runs
            said = str(error)
        time.sleep(0.5)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    raise AssertionError(f"kube-apiserver at {cluster.server} not ready within {STARTUP_SECONDS}s ({said}):\n{tail}")


def start(root: Path) -> Iterator[RealCluster]:
    """etcd and kube-apiserver in ``root`` (their data, certificates and logs), stopped when the iterator closes."""
    etcd, apiserver, kubectl = built_tool("etcd"), built_tool("kube-apiserver"), built_tool("kubectl")
    external(Path("/usr/bin/openssl"), "openssl", "install it with: apt-get install openssl")
    root.mkdir(parents=True, exist_ok=True)
    _pki(root)
    client, peer, secure = free_port(), free_port(), free_port()
    cluster = RealCluster(root, f"127.0.0.1:{secure}", kubectl, root / "admin.conf")
    cluster.kubeconfig("pgc-admin", ("system:masters",), cluster.admin)
    logs = [(root / "etcd.log").open("wb"), (root / "kube-apiserver.log").open("wb")]
    try:
        cluster.processes.append(subprocess.Popen(
            [str(etcd), "--name", "t", "--data-dir", str(root / "etcd"),
             "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls",
             f"http://127.0.0.1:{client}", "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"t=http://127.0.0.1:{peer}", "--unsafe-no-fsync", "--log-level", "warn"],
            stdout=logs[0], stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))  # fmt: skip
        cluster.processes.append(subprocess.Popen(
            [str(apiserver), "--etcd-servers", f"http://127.0.0.1:{client}",
             "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", str(secure),
             "--tls-cert-file", str(root / "apiserver.crt"), "--tls-private-key-file", str(root / "apiserver.key"),
             "--client-ca-file", str(root / "ca.crt"),
             # What kubeadm's kube-apiserver manifest sets (cmd/kubeadm/app/phases/controlplane/manifests.go).
             "--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
             "--enable-bootstrap-token-auth",
             "--service-account-key-file", str(root / "sa.pub"),
             "--service-account-signing-key-file", str(root / "sa.key"),
             "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
             "--service-cluster-ip-range", "10.96.0.0/12",
             # No Endpoints for the "kubernetes" Service (nothing routes to it here) and no lease for it.
             "--endpoint-reconciler-type", "none", "--cert-dir", str(root / "certs"), "--v", "1"],
            stdout=logs[1], stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))  # fmt: skip
        _wait_ready(cluster, root / "kube-apiserver.log")
        yield cluster
    finally:
        cluster.stop()
        for log in logs:
            log.close()


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """One real API server per pytest process (import this fixture into a test module to use it)."""
    yield from start(tmp_path_factory.mktemp("kube-apiserver"))
