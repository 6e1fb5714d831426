"""A fake Kubernetes API for the node agent (cluster.py, kubeapi.py), and a fake ``qm`` running commands in a FakeGuest.

``FakeCluster`` keeps nodes, pods, labels, annotations and ConfigMaps (the rollout slots) in a JSON file, every
request served under one file lock (so several guests can roll or drain at once against one cluster, and each request
is atomic, as the API server's writes are), and installs a ``kubectl`` that reads and changes it with the real API's
semantics and kubectl's messages:

- ``get node N -o json`` (``--ignore-not-found``: nothing for a missing node, else NotFound), with the Node's
  resourceVersion, which every change of the node (cordon, uncordon, annotate, labels) moves on;
- ``get configmaps -n NS -o json`` (a List); ``create -f -`` of a ConfigMap: AlreadyExists when it exists;
  ``replace -f -``: NotFound when it does not, Conflict when the resourceVersion sent is not the current one
  (optimistic concurrency: a PUT at a stale version); ``delete configmap``;
- ``annotate node`` (with ``--resource-version=V``: Conflict unless V is the node's current version), ``cordon``,
  ``uncordon`` (NotFound for a missing node);
- ``get pods --all-namespaces --field-selector spec.nodeName=N -o json`` (owners, emptyDir volumes, phase);
- ``create --raw /api/v1/namespaces/NS/pods/P/eviction -f -``: the pod goes, or 429 TooManyRequests when its
  PodDisruptionBudget refuses (``Pod.pdb``); ``delete node``; ``auth can-i VERB RESOURCE/NAME`` (yes, or no and exit 1).

Who asks is read from the ``--kubeconfig`` file (its mode is recorded): the cluster's admin kubeconfig may do
anything; a kubelet credential (``kubelet_conf(node)``: user ``system:node:<node>``) is authorized as the real API
server does it: the Node authorizer (its own Node only for reads, unless RBAC grants more; pods listed only with its
own spec.nodeName selector), RBAC (the grants of render/node_rbac.py, which ``save`` applies unless ``rbac=False``)
and the NodeRestriction admission plugin (only its own Node patched or deleted, only its own pods evicted, Leases
only in kube-node-lease), with the API server's Forbidden messages; anything else is Unauthorized. kubectl answers
only at the expected ``--server`` (else, or with ``api_down``, connection refused). ``flaky(rate)`` makes that share
of requests fail before doing anything (an etcd timeout, InternalError). Every cordon, uncordon, eviction, slot write
and release is logged with its time, and ``peak`` is the most nodes that were ever cordoned and annotated by a
rollout (proxmox-gpu-cluster.io/rollout) at once, checked after every request.

Why a fake still: the fault-injection harnesses and rollout simulations kill or fail the steps at every kubectl call
and inject etcd timeouts, hundreds of runs each, which a real server cannot serve at that pace or on demand. Every
request the agent sends is also run, as a node, against a real kube-apiserver (Node authorizer, RBAC,
NodeRestriction; tests/agent/test_fakekube_contract.py), which holds this fake to its exit codes, status reasons and
Forbidden wording: an authorizer's refusal names the user, verb and scope, then the Node authorizer's reason
(plugin/pkg/auth/authorizer/node/node_authorizer.go, v1.34.4), an admission plugin's is its reason alone
(plugin/pkg/admission/noderestriction/admission.go); ``kubectl cordon`` reports a refused patch and exits 0
(k8s.io/kubectl v0.34.4 pkg/cmd/drain/drain.go); ``auth can-i`` asks the authorizers only, never admission.

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

from proxmox_gpu_cluster.render import node_rbac
from tests.components.scripts.fakeqm import FAKE_QM
from tests.components.scripts.fakeroot import FakeRoot

SLOT_NAMESPACE = "proxmox-gpu-cluster"


def kubelet_conf(node: str) -> str:
    """/etc/kubernetes/kubelet.conf as kubeadm join writes it for ``node`` (its client certificate names the user)."""
    return (
        "apiVersion: v1\nkind: Config\nusers:\n- name: default-auth\n  user:\n"
        f"    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem  # CN=system:node:{node}\n"
    )


def grants(namespace: str = SLOT_NAMESPACE) -> dict[str, Any]:
    """The node-steps RBAC for nodes, as the fake authorizes with it."""
    return {"cluster": [dict(r) for r in node_rbac.NODE_RULES],
            "namespaced": {namespace: [dict(r) for r in node_rbac.SLOT_RULES]}}  # fmt: skip


_KUBECTL = r"""
import fcntl, json, os, random, re, stat, sys, time
state_path, expected = sys.argv[1], open(sys.argv[2]).read()
args = sys.argv[3:]
config = args[args.index("--kubeconfig") + 1]
with open(state_path + ".modes", "a") as m:
    m.write(oct(stat.S_IMODE(os.stat(config).st_mode)) + "\n")
text = open(config).read()
who = "admin" if text.rstrip("\n") == expected.rstrip("\n") else None
found = re.search(r"system:node:([a-z0-9.-]+)", text)
if who is None and found:
    who = found.group(1)  # a kubelet credential: the node's client certificate
if who is None:
    sys.exit(print("error: You must be logged in to the server (Unauthorized)", file=sys.stderr) or 1)
server = args[args.index("--server") + 1] if "--server" in args else None
args = [a for a in args if not a.startswith("--request-timeout")]
for flag in ("--kubeconfig", "--server"):
    args = [a for i, a in enumerate(args) if a != flag and (i == 0 or args[i - 1] != flag)]
version_arg = next((a.split("=", 1)[1] for a in args if a.startswith("--resource-version=")), None)
args = [a for a in args if not a.startswith("--resource-version=")]
namespace = args[args.index("-n") + 1] if "-n" in args else None
if "-n" in args:
    i = args.index("-n"); args = args[:i] + args[i + 2:]
ANNOTATION = "proxmox-gpu-cluster.io/rollout"
USER = f"system:node:{who}"

class Refused(Exception):
    pass

def rbac(state, verb, resource, ns):
    # The grants bound to group system:nodes (render/node_rbac.py as the cluster applied it).
    rules = state.get("rbac", {}).get("cluster", []) + (state.get("rbac", {}).get("namespaced", {}).get(ns, []) if ns else [])
    return any(verb in r["verbs"] and resource in r["resources"] and "" in r["apiGroups"] for r in rules)

def forbid(resource, name, verb, ns=None, why=None, admission=False):
    # kube-apiserver's words: an authorizer's refusal names the user, verb and scope, then the Node authorizer's
    # reason when it gave one; an admission plugin's (NodeRestriction) is its reason alone. A request without a
    # name (a list, a create) says "<resource> is forbidden".
    scope = f'in the namespace "{ns}"' if ns else "at the cluster scope"
    reason = f'User "{USER}" cannot {verb} resource "{resource}" in API group "" {scope}' + (f": {why}" if why else "")
    what = f'{resource} "{name}"' if name else resource
    raise Refused(f"Error from server (Forbidden): {what} is forbidden: {why if admission else reason}")

def authorize(state, verb, resource, name="", ns=None, node_of_pod=None, selector=None, admission=True):
    # The Node authorizer, then RBAC, then (``admission``) the NodeRestriction admission plugin, for a node's
    # credential. A SelfSubjectAccessReview (kubectl auth can-i) asks the authorizers only, never admission.
    if who == "admin":
        return
    if resource == "nodes":
        if verb in ("patch", "update"):
            if name != who and admission:
                forbid("nodes", name, verb, why=f'node "{who}" is not allowed to modify node "{name}"', admission=True)
        elif verb == "get":
            if name != who and not rbac(state, "get", "nodes", None):
                forbid("nodes", name, verb, why=f"node '{who}' cannot read '{name}', only its own Node object")
        elif verb == "delete":
            if not rbac(state, "delete", "nodes", None):
                forbid("nodes", name, verb)
            if name != who and admission:
                forbid("nodes", name, verb, why=f'node "{who}" is not allowed to modify node "{name}"', admission=True)
    elif resource == "pods" and verb == "list":
        if selector != who:
            forbid("pods", "", verb, why="can only list/watch pods with spec.nodeName field selector")
    elif resource == "pods/eviction":
        if node_of_pod is not None and node_of_pod != who:
            forbid("pods", name, "create", ns, why=f"node {who} can only evict pods with spec.nodeName set to itself",
                   admission=True)
    elif resource == "leases":
        if ns != "kube-node-lease":
            forbid("leases", name, verb, ns, why='can only access leases in the "kube-node-lease" system namespace')
    elif resource == "configmaps":
        if not rbac(state, verb, "configmaps", ns):  # the Node authorizer lets a node read only its pods' ones
            reads = verb in ("get", "list", "watch")
            forbid("configmaps", name, verb, ns, "No Object name found" if reads else "can only read resources of this type")
    else:
        forbid(resource, name, verb, ns)

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
    out, code, stream = [], 0, None
    verb = args[0]
    slots = state.setdefault("configmaps", {})
    annotations = state.setdefault("annotations", {})
    labels = state.setdefault("labels", {})
    versions = state.setdefault("node_versions", {})
    def bump(node=None):  # one counter for every object, as etcd's revision; nodes start at "1"
        state["version"] = max(state.get("version", 0), 1) + 1
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
    def pod_json(p):
        owners = [{"apiVersion": "apps/v1", "kind": p["owner"], "name": p["name"] + "-owner", "controller": True}]
        volumes = [{"name": "scratch", "emptyDir": {}}] if p.get("emptydir") else []
        return {"metadata": {"namespace": p["ns"], "name": p["name"], "ownerReferences": owners if p.get("owner") else []},
                "spec": {"nodeName": p["node"], "volumes": volumes}, "status": {"phase": "Running"}}
    try:
        if verb == "get" and args[1] == "node":
            authorize(state, "get", "nodes", args[2])
            if args[2] in state["nodes"]:
                out.append(json.dumps(node_json(args[2])))
            elif "--ignore-not-found" not in args:
                code = int(missing(args[2]))
        elif verb == "get" and args[1] == "configmaps":  # a list in one namespace
            authorize(state, "list", "configmaps", "", namespace)
            items = [c for c in slots.values() if c["metadata"]["namespace"] == namespace]
            out.append(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        elif verb in ("create", "replace") and args[1:3] == ["-f", "-"]:
            obj = json.loads(sys.stdin.read())
            assert obj["kind"] == "ConfigMap", obj
            name, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
            authorize(state, "create" if verb == "create" else "update", "configmaps", "" if verb == "create" else name, ns)
            key, current = f"{ns}/{name}", slots.get(f"{ns}/{name}")
            if verb == "create" and current is not None:
                out.append(f'Error from server (AlreadyExists): error when creating "STDIN": configmaps "{name}" already exists')
                code = 1
            elif verb == "replace" and current is None:
                out.append(f'Error from server (NotFound): error when replacing "STDIN": configmaps "{name}" not found')
                code = 1
            elif verb == "replace" and current["metadata"]["resourceVersion"] != obj["metadata"].get("resourceVersion"):
                out.append(f'Error from server (Conflict): error when replacing "STDIN": Operation cannot be fulfilled on '
                           f'configmaps "{name}": the object has been modified; please apply your changes to the latest '
                           "version and try again")
                code = 1
            else:
                obj["metadata"]["resourceVersion"] = bump()
                slots[key] = obj
                holder, before = obj["data"].get("holder"), (current or {}).get("data", {}).get("holder")
                event("lease", holder) if holder else event("release", before)
                out.append(f"configmap/{name} {verb}d")
        elif verb == "create" and args[1] == "--raw":  # POST an Eviction
            _, _, _, _, ns, _, pod_name, _ = args[2].split("/")
            pod = next((p for p in state["pods"] if p["ns"] == ns and p["name"] == pod_name), None)
            authorize(state, "create", "pods/eviction", pod_name, ns, node_of_pod=pod and pod["node"])
            if pod is None:
                out.append(f'Error from server (NotFound): pods "{pod_name}" not found')
                code = 1
            elif pod.get("pdb"):
                out.append("Error from server (TooManyRequests): Cannot evict pod as it would violate the pod's "
                           "disruption budget.")
                code = 1
            else:
                state["pods"].remove(pod)
                event("evict", pod["node"])
                out.append(json.dumps({"kind": "Status", "status": "Success"}))
        elif verb == "annotate":
            node, change = args[2], next(a for a in args[3:] if not a.startswith("--"))
            authorize(state, "patch", "nodes", node)
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
        elif verb in ("cordon", "uncordon"):
            authorize(state, "patch", "nodes", args[1])
            if missing(args[1]):
                code = 1
            else:
                now = {*state["cordoned"], args[1]} if verb == "cordon" else set(state["cordoned"]) - {args[1]}
                state["cordoned"] = sorted(now)
                bump(args[1])
                event(verb, args[1])
                out.append(f"node/{args[1]} {verb}ed")
        elif verb == "get" and args[1] == "pods":
            node = next(a for a in args if a.startswith("spec.nodeName=")).split("=", 1)[1]
            authorize(state, "list", "pods", selector=node)
            items = [pod_json(p) for p in state["pods"] if p["node"] == node]
            out.append(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        elif verb == "delete" and args[1] == "node":
            authorize(state, "delete", "nodes", args[2])
            if args[2] in state["nodes"]:
                state["nodes"].remove(args[2])
            out.append(f'node "{args[2]}" deleted')
        elif verb == "delete" and args[1] == "configmap":
            authorize(state, "delete", "configmaps", args[2], namespace)
            held = slots.pop(f"{namespace}/{args[2]}", None)
            event("release", (held or {}).get("data", {}).get("holder"))
            out.append(f'configmap "{args[2]}" deleted')
        elif verb == "auth" and args[1] == "can-i":  # a SelfSubjectAccessReview: any authenticated user may ask
            resource, _, name = args[3].partition("/")
            try:
                authorize(state, args[2], {"node": "nodes"}.get(resource, resource), name, namespace, admission=False)
                out.append("yes")
            except Refused:
                out, code = ["no"], 1
        elif args[1] in ("lease", "leases"):
            authorize(state, verb, "leases", args[2] if len(args) > 2 else "", namespace)
            out.append("fake kubectl: leases are not modelled beyond the node's refusal")
            code = 2
        else:
            sys.exit(print("fake kubectl: unsupported " + " ".join(args), file=sys.stderr) or 2)
    except Refused as refused:
        out, code = [str(refused)], 1
        if verb in ("cordon", "uncordon"):  # kubectl reports a refused patch and exits 0 (kubectl pkg/cmd/drain)
            out, code = [f'error: unable to {verb} node "{args[1]}": ' + str(refused).split("): ", 1)[1]], 0
            stream = sys.stderr
    out_now = [n for n in state["nodes"] if n in state["cordoned"] and annotations.get(n, {}).get(ANNOTATION)]
    state["peak"] = max(state.get("peak", 0), len(out_now))
    f.seek(0)
    f.truncate()
    json.dump(state, f)
print("\n".join(out), file=stream or (sys.stderr if code and verb != "auth" else sys.stdout))  # can-i: "no" on stdout
sys.exit(code)
"""

_QM = (
    FAKE_QM
    + r"""
host_root, guest_root, guest_path = sys.argv[1], sys.argv[2], sys.argv[3]
args = sys.argv[4:]
status = open(os.path.join(host_root, "fake-vm-status")).read().strip()
if status == "missing" and args[:1] in (["status"], ["guest"]):
    vmid = args[1] if args[0] == "status" else args[2]
    sys.exit(print(f"Configuration file 'nodes/pve1/qemu-server/{vmid}.conf' does not exist", file=sys.stderr) or 2)
if args[:1] == ["status"]:
    sys.exit(print(f"status: {status}") or 0)
if args[:1] == ["guest"]:
    agent_gone(host_root, args[2], status)
if args[:3] == ["guest", "cmd", args[2]] and args[3] == "ping":
    sys.exit(0)
if args[:2] == ["guest", "exec"]:  # inside the guest: an absolute path names the guest's file, in its root
    command = [os.path.join(guest_root, a.lstrip("/")) if a.startswith("/") and os.path.exists(
        os.path.join(guest_root, a.lstrip("/"))) or a.startswith(("/home/", "/root/")) else a
        for a in args[args.index("--") + 1:]]
    stdin = sys.stdin.read() if "--pass-stdin" in args else ""
    guest_exec(host_root, args, command, {"PATH": guest_path, "PGC_ROOT": guest_root, "LC_ALL": "C"}, stdin)
sys.exit(print("fake qm: unsupported " + " ".join(args), file=sys.stderr) or 2)
"""
)


@dataclass
class Pod:
    ns: str
    name: str
    node: str
    owner: str | None = "ReplicaSet"
    pdb: bool = False
    """A PodDisruptionBudget refuses its eviction."""
    emptydir: bool = False
    """It has an emptyDir volume."""


@dataclass
class FakeCluster:
    """The API server's view: nodes, which are cordoned, pods. Shared by every guest given to ``install``.
    ``kubeconfig``: the admin credential (tests inspect with it; the node steps never have it)."""

    path: Path
    kubeconfig: str
    server: str = "https://k8s.example.test:6443"
    """The only address the API server answers on from the guests (the join endpoint)."""
    nodes: list[str] = field(default_factory=list)
    pods: list[Pod] = field(default_factory=list)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    """Node -> labels (what the label patch and mig-manager write; set them with ``set_labels``)."""

    def save(self, api_down: bool = False, configmaps: dict[str, Any] | None = None, rbac: bool = True) -> None:
        """Start the API server: ``configmaps`` by ``namespace/name``; ``rbac``: the node-steps RBAC is applied."""
        state = {
            "nodes": self.nodes, "cordoned": [], "pods": [vars(p) for p in self.pods], "api_down": api_down,
            "server": self.server, "configmaps": configmaps or {}, "annotations": {}, "labels": self.labels,
            "events": [], "rbac": grants() if rbac else {},
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
                state["version"] = max(state.get("version", 0), 1) + 1
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
    host.stub_script("sleep", ":")  # retire_vm.sh's waits between qm tries take no time
