"""A fake Kubernetes API for the node agent (cluster.py), and a fake ``qm`` that runs guest commands in a FakeGuest.

``FakeCluster`` keeps nodes, pods, labels, annotations and Leases in a JSON file, every request served under one
file lock (so several guests can roll or drain at once against one cluster, and each request is atomic, as the API
server's writes are), and installs a ``kubectl`` that reads and changes it with the real API's semantics and
kubectl's messages:

- ``get node N -o json`` (``--ignore-not-found``: nothing for a missing node, else NotFound), with the Node's
  resourceVersion, which every change of the node (cordon, uncordon, annotate, labels) moves on;
- ``get leases -l SELECTOR -o json`` (a List) and ``get lease N``;
- ``create -f -`` of a Lease: AlreadyExists when it exists; ``replace -f -``: NotFound when it does not, Conflict
  when the resourceVersion sent is not the current one (optimistic concurrency: a PUT at a stale version);
  ``delete lease`` (NotFound unless ``--ignore-not-found``);
- ``annotate node`` (with ``--resource-version=V``: Conflict unless V is the node's current version), ``cordon``,
  ``uncordon`` (NotFound for a missing node);
- ``drain``: cordons, then evicts: a pod whose PodDisruptionBudget refuses the eviction (the Eviction API answers
  429 Too Many Requests, which kubectl retries until ``--timeout``) stays and the drain fails after evicting the
  others; pods without a controller need ``--force`` (refused up front, nothing evicted); DaemonSet pods stay;
- ``get pods --field-selector spec.nodeName=N -o json``; ``delete node``.

kubectl only works with the expected kubeconfig, read from the ``--kubeconfig`` file (anything else: Unauthorized),
whose mode is recorded, and at the expected ``--server`` (else, or with ``api_down``, connection refused).
``flaky(rate)`` makes that share of requests fail before doing anything (an etcd timeout, InternalError). Every
cordon, uncordon, lease write and release is logged with its time, and ``peak`` is the most nodes that were ever
cordoned and annotated by a rollout (proxmox-gpu-cluster.io/rollout) at once, checked after every request.

``install_qm`` gives a FakeRoot (the Proxmox node) a ``qm`` whose ``guest exec`` runs the command inside a FakeGuest
and answers with the JSON ``qm guest exec`` prints.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.components.scripts.fakeroot import FakeRoot

_KUBECTL = r"""
import fcntl, json, os, random, stat, sys, time
state_path, expected = sys.argv[1], open(sys.argv[2]).read()
args = sys.argv[3:]
config = args[args.index("--kubeconfig") + 1]
with open(state_path + ".modes", "a") as m:
    m.write(oct(stat.S_IMODE(os.stat(config).st_mode)) + "\n")
if open(config).read().rstrip("\n") != expected.rstrip("\n"):
    sys.exit(print("error: You must be logged in to the server (Unauthorized)", file=sys.stderr) or 1)
server = args[args.index("--server") + 1] if "--server" in args else None
args = [a for a in args if not a.startswith("--request-timeout")]
for flag in ("--kubeconfig", "--server"):
    args = [a for i, a in enumerate(args) if a != flag and (i == 0 or args[i - 1] != flag)]
version_arg = next((a.split("=", 1)[1] for a in args if a.startswith("--resource-version=")), None)
args = [a for a in args if not a.startswith("--resource-version=")]
if args[0] == "-n":  # kubectl -n NS VERB ...: the namespace flag may come first
    args = [*args[2:], *args[:2]]
ANNOTATION = "proxmox-gpu-cluster.io/rollout"
with open(state_path, "r+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    state = json.load(f)
    state["requests"] = state.get("requests", 0) + 1
    if state.get("api_down") or server != state["server"]:
        sys.exit(print("The connection to the server 10.0.0.1:6443 was refused - did you specify the right host or "
                       "port?", file=sys.stderr) or 1)
    if state.get("flaky") and random.Random(state["requests"] * 7919 + state["flaky"][1]).random() < state["flaky"][0]:
        f.seek(0); f.truncate(); json.dump(state, f)
        sys.exit(print("Error from server (InternalError): etcdserver: request timed out", file=sys.stderr) or 1)
    out, code = [], 0
    verb = args[0]
    leases = state.setdefault("leases", {})
    annotations = state.setdefault("annotations", {})
    labels = state.setdefault("labels", {})
    versions = state.setdefault("node_versions", {})
    def bump(node=None):
        state["version"] = state.get("version", 0) + 1
        if node:
            versions[node] = str(state["version"])
        return str(state["version"])
    def event(what, node):
        state.setdefault("events", []).append([time.time(), what, node])
    def missing(node):
        if node in state["nodes"]:
            return False
        out.append(f'Error from server (NotFound): nodes "{node}" not found')
        return True
    def node_json(node):
        meta = {"name": node, "resourceVersion": versions.get(node, "1"), "labels": labels.get(node, {}),
                "annotations": annotations.get(node, {})}
        return {"apiVersion": "v1", "kind": "Node", "metadata": meta,
                "spec": {"unschedulable": True} if node in state["cordoned"] else {}}
    if verb == "get" and args[1] == "node" and "-o" in args and args[args.index("-o") + 1].startswith("jsonpath="):
        # {.metadata.labels.KEY} or {.metadata.annotations.KEY}, dots in KEY escaped
        path = args[args.index("-o") + 1].removeprefix("jsonpath={.metadata.").removesuffix("}")
        kind, key = path.split(".", 1)
        out.append(state.setdefault(kind, {}).get(args[2], {}).get(key.replace("\\.", "."), ""))
    elif verb == "get" and args[1] == "node" and args[-2:] == ["-o", "json"]:
        if args[2] in state["nodes"]:
            out.append(json.dumps(node_json(args[2])))
        elif "--ignore-not-found" not in args:
            code = int(missing(args[2]))
    elif verb == "get" and args[1] == "node":
        if args[2] in state["nodes"]:
            out.append("node/" + args[2])
    elif verb == "get" and args[1] == "leases":  # a list, by label selector
        selector = dict(kv.split("=", 1) for kv in args[args.index("-l") + 1].split(",")) if "-l" in args else {}
        items = [le for le in leases.values() if selector.items() <= le["metadata"].get("labels", {}).items()]
        out.append(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    elif verb == "get" and args[1] == "lease":
        if args[2] in leases:
            out.append(json.dumps(leases[args[2]]))
    elif verb in ("create", "replace") and args[1:3] == ["-f", "-"]:
        lease = json.loads(sys.stdin.read())
        assert lease["kind"] == "Lease" and lease["metadata"]["namespace"] == "kube-system", lease
        name = lease["metadata"]["name"]
        current = leases.get(name)
        if verb == "create" and current is not None:
            out.append(f'Error from server (AlreadyExists): error when creating "STDIN": leases.coordination.k8s.io '
                       f'"{name}" already exists')
            code = 1
        elif verb == "replace" and current is None:
            out.append(f'Error from server (NotFound): error when replacing "STDIN": leases.coordination.k8s.io '
                       f'"{name}" not found')
            code = 1
        elif verb == "replace" and current["metadata"]["resourceVersion"] != lease["metadata"].get("resourceVersion"):
            out.append(f'Error from server (Conflict): error when replacing "STDIN": Operation cannot be fulfilled on '
                       f'leases.coordination.k8s.io "{name}": the object has been modified; please apply your '
                       "changes to the latest version and try again")
            code = 1
        else:
            lease["metadata"]["resourceVersion"] = bump()
            leases[name] = lease
            holder = lease["spec"].get("holderIdentity")
            before = (current or {}).get("spec", {}).get("holderIdentity")
            event("lease", holder) if holder else event("release", before)
            out.append(f"lease.coordination.k8s.io/{name} {verb}d")
    elif verb == "delete" and args[1] == "lease":
        if args[2] in leases:
            holder = leases.pop(args[2]).get("spec", {}).get("holderIdentity")
            event("release", holder)
            out.append(f'lease.coordination.k8s.io "{args[2]}" deleted')
        elif "--ignore-not-found" not in args:
            out.append(f'Error from server (NotFound): leases.coordination.k8s.io "{args[2]}" not found')
            code = 1
    elif verb == "annotate":
        node, change = args[2], next(a for a in args[3:] if not a.startswith("--"))
        if missing(node):
            code = 1
        elif version_arg is not None and version_arg != versions.get(node, "1"):
            out.append(f'Error from server (Conflict): Operation cannot be fulfilled on nodes "{node}": the object '
                       "has been modified; please apply your changes to the latest version and try again")
            code = 1
        elif change.endswith("-"):
            annotations.get(node, {}).pop(change[:-1], None)
            bump(node)
            out.append(f"node/{node} annotated")
        else:
            key, value = change.split("=", 1)
            annotations.setdefault(node, {})[key] = value
            bump(node)
            out.append(f"node/{node} annotated")
    elif verb == "uncordon":
        if missing(args[1]):
            code = 1
        else:
            state["cordoned"] = sorted(set(state["cordoned"]) - {args[1]})
            bump(args[1])
            event("uncordon", args[1])
            out.append(f"node/{args[1]} uncordoned")
    elif verb == "get" and args[1] == "pods":
        node = next(a for a in args if a.startswith("spec.nodeName=")).split("=", 1)[1]
        mine = [p for p in state["pods"] if p["node"] == node]
        if args[-2:] == ["-o", "json"]:
            items = [{"metadata": {"namespace": p["ns"], "name": p["name"],
                                   "ownerReferences": [{"kind": p["owner"]}] if p.get("owner") else []},
                      "spec": {"nodeName": node}} for p in mine]
            out.append(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        else:
            out.extend(f'{p["ns"]}/{p["name"]} {p.get("owner") or ""} ' for p in mine)
    elif verb == "cordon":
        if missing(args[1]):
            code = 1
        else:
            state["cordoned"] = sorted({*state["cordoned"], args[1]})
            bump(args[1])
            event("cordon", args[1])
            out.append(f"node/{args[1]} cordoned")
    elif verb == "drain":
        node, force = args[1], "--force" in args
        mine = [p for p in state["pods"] if p["node"] == node and p.get("owner") != "DaemonSet"]
        bare = [p for p in mine if not p.get("owner")]
        if missing(node):
            code = 1
        elif bare and not force:
            names = ",".join(f'{p["ns"]}/{p["name"]}' for p in bare)
            out.append(f'error: unable to drain node "{node}" due to error: cannot delete Pods that declare no '
                       f"controller (use --force to override): {names}")
            code = 1
        else:
            if node not in state["cordoned"]:
                state["cordoned"] = sorted({*state["cordoned"], node})
                bump(node)
                event("cordon", node)
            for p in mine:
                out.append(f'evicting pod {p["ns"]}/{p["name"]}')
                if p.get("pdb"):  # the Eviction API answers 429; kubectl retries until --timeout
                    out.append(f'error when evicting pods/"{p["name"]}" -n "{p["ns"]}" (will retry after 5s): '
                               "Cannot evict pod as it would violate the pod's disruption budget.")
                    code = 1
                else:
                    state["pods"].remove(p)
            if code:
                out.append(f'error: unable to drain node "{node}" due to error: global timeout reached')
            else:
                out.append(f"node/{node} drained")
    elif verb == "delete" and args[1] == "node":
        if args[2] in state["nodes"]:
            state["nodes"].remove(args[2])
        out.append(f'node "{args[2]}" deleted')
    else:
        sys.exit(print("fake kubectl: unsupported " + " ".join(args), file=sys.stderr) or 2)
    out_now = [n for n in state["nodes"] if n in state["cordoned"] and annotations.get(n, {}).get(ANNOTATION)]
    state["peak"] = max(state.get("peak", 0), len(out_now))
    f.seek(0)
    f.truncate()
    json.dump(state, f)
print("\n".join(out), file=sys.stderr if code else sys.stdout)
sys.exit(code)
"""

_QM = r"""
import json, os, subprocess, sys
host_root, guest_root, guest_path = sys.argv[1], sys.argv[2], sys.argv[3]
args = sys.argv[4:]
status = open(os.path.join(host_root, "fake-vm-status")).read().strip()
if args[:1] == ["status"]:
    if status == "missing":
        sys.exit(print(f"Configuration file 'nodes/pve1/qemu-server/{args[1]}.conf' does not exist",
                       file=sys.stderr) or 2)
    sys.exit(print(f"status: {status}") or 0)
if args[:3] == ["guest", "cmd", args[2]] and args[3] == "ping":
    sys.exit(0 if status == "running" and not os.path.exists(os.path.join(host_root, "agent-dead")) else 255)
if args[:2] == ["guest", "exec"]:
    # Inside the guest: an absolute path names the guest's file, under its fake root.
    command = [os.path.join(guest_root, a.lstrip("/")) if a.startswith("/") and os.path.exists(
        os.path.join(guest_root, a.lstrip("/"))) or a.startswith(("/home/", "/root/")) else a
        for a in args[args.index("--") + 1:]]
    stdin = sys.stdin.read() if "--pass-stdin" in args else ""
    env = {"PATH": guest_path, "PGC_ROOT": guest_root, "LC_ALL": "C"}
    proc = subprocess.run(command, input=stdin, env=env, capture_output=True, text=True, check=False)
    print(json.dumps({"exitcode": proc.returncode, "exited": 1, "out-data": proc.stdout, "err-data": proc.stderr},
                     indent=3))
    sys.exit(0)
sys.exit(print("fake qm: unsupported " + " ".join(args), file=sys.stderr) or 2)
"""


@dataclass
class Pod:
    ns: str
    name: str
    node: str
    owner: str | None = "ReplicaSet"
    pdb: bool = False
    """A PodDisruptionBudget refuses its eviction."""


@dataclass
class FakeCluster:
    """The API server's view: nodes, which are cordoned, pods. Shared by every guest given to ``install``."""

    path: Path
    kubeconfig: str
    server: str = "https://k8s.example.test:6443"
    """The only address the API server answers on from the guests (the join endpoint)."""
    nodes: list[str] = field(default_factory=list)
    pods: list[Pod] = field(default_factory=list)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    """Node -> labels (what the label patch and mig-manager write; set them with ``set_labels``)."""

    def save(self, api_down: bool = False, leases: dict[str, Any] | None = None) -> None:
        state = {
            "nodes": self.nodes, "cordoned": [], "pods": [vars(p) for p in self.pods], "api_down": api_down,
            "server": self.server, "leases": leases or {}, "annotations": {}, "labels": self.labels, "events": [],
        }  # fmt: skip
        self.path.write_text(json.dumps(state))
        (self.path.parent / "expected-kubeconfig").write_text(self.kubeconfig)

    def set_labels(self, node: str, **labels: str) -> None:
        """Change a node's labels in the running API server (as a NodePatch or mig-manager would)."""
        self.change(lambda state: state.setdefault("labels", {}).setdefault(node, {}).update(labels), node)

    def flaky(self, rate: float, seed: int = 0) -> None:
        """From now on, fail that share of requests (pseudo-randomly, by request number and seed) before they act."""
        self.change(lambda state: state.update(flaky=[rate, seed]))

    def change(self, edit: Callable[[dict[str, Any]], object], node: str | None = None) -> None:
        """Edit the running API server's state under its lock (moving ``node``'s resourceVersion on)."""
        with self.path.open("r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            state = json.load(f)
            edit(state)
            if node:
                state["version"] = state.get("version", 0) + 1
                state.setdefault("node_versions", {})[node] = str(state["version"])
            f.seek(0)
            f.truncate()
            json.dump(state, f)

    def command(self) -> list[str]:
        """The fake kubectl as an argv prefix, for calling it without a FakeRoot (the agent's unit tests)."""
        script = self.path.parent / "fake-kubectl.py"
        script.write_text(_KUBECTL)
        return ["python3", str(script), str(self.path), str(self.path.parent / "expected-kubeconfig")]

    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.path.read_text())
        return result

    def modes(self) -> list[str]:
        """File modes of every kubeconfig kubectl was given."""
        modes = Path(f"{self.path}.modes")
        return modes.read_text().split() if modes.exists() else []

    def install(self, guest: FakeRoot) -> None:
        (guest.bin / "kubectl.py").write_text(_KUBECTL)
        expected = self.path.parent / "expected-kubeconfig"
        guest.stub_script("kubectl", f'python3 "{guest.bin}/kubectl.py" "{self.path}" "{expected}" "$@"')


def install_qm(host: FakeRoot, guest: FakeRoot, status: str = "running") -> None:
    """``qm`` on ``host`` for one VM that runs ``guest`` (``status``: running, stopped or missing)."""
    (host.bin / "qm.py").write_text(_QM)
    host.write("fake-vm-status", status)
    guest_path = f"{guest.bin}:/usr/bin:/bin"
    host.stub_script("qm", f'python3 "{host.bin}/qm.py" "{host.root}" "{guest.root}" "{guest_path}" "$@"')
    host.stub_script("id", 'if [ "$1" = -u ]; then echo 0; else echo root; fi')
