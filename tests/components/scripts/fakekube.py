"""A fake Kubernetes API for the drain scripts, and a fake ``qm`` that runs guest commands in a FakeGuest.

``FakeCluster`` keeps nodes and pods in a JSON file (locked, so several guests can drain at once against one
cluster) and installs a ``kubectl`` into a FakeGuest that reads and changes it the way the real API would for
``get``, ``cordon``, ``drain`` (evictions: a PodDisruptionBudget refuses them; pods without a controller need
``--force``; DaemonSet pods stay), ``delete node``, ``annotate``, ``uncordon`` and coordination.k8s.io Leases
(``create -f -`` fails when one exists, ``replace -f -`` when its resourceVersion moved on: both atomic under the
lock, as the API server's are). Every cordon, uncordon, lease write and release is logged with its time. kubectl only works with the expected kubeconfig, read from
the ``--kubeconfig`` file, whose mode is recorded.

``install_qm`` gives a FakeRoot (the Proxmox node) a ``qm`` whose ``guest exec`` runs the command inside a FakeGuest
and answers with the JSON ``qm guest exec`` prints.
"""

from __future__ import annotations

import fcntl
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.components.scripts.fakeroot import FakeRoot

_KUBECTL = r"""
import fcntl, json, os, stat, sys, time
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
with open(state_path, "r+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    state = json.load(f)
    if state.get("api_down") or server != state["server"]:
        sys.exit(print("The connection to the server 10.0.0.1:6443 was refused", file=sys.stderr) or 1)
    out, code = [], 0
    verb = args[0]
    leases = state.setdefault("leases", {})
    annotations = state.setdefault("annotations", {})
    def event(what, node):
        state.setdefault("events", []).append([time.time(), what, node])
    if verb == "get" and args[1] == "node" and "-o" in args and args[args.index("-o") + 1].startswith("jsonpath="):
        # {.metadata.labels.KEY} or {.metadata.annotations.KEY}, dots in KEY escaped
        path = args[args.index("-o") + 1].removeprefix("jsonpath={.metadata.").removesuffix("}")
        kind, key = path.split(".", 1)
        out.append(state.setdefault(kind, {}).get(args[2], {}).get(key.replace("\\.", "."), ""))
    elif verb == "get" and args[1] == "node":
        if args[2] in state["nodes"]:
            out.append("node/" + args[2])
    elif verb == "get" and args[1] == "lease":
        if args[2] in leases:
            out.append(json.dumps(leases[args[2]]))
    elif verb in ("create", "replace") and args[1:3] == ["-f", "-"]:
        lease = json.loads(sys.stdin.read())
        assert lease["kind"] == "Lease" and lease["metadata"]["namespace"] == "kube-system", lease
        name = lease["metadata"]["name"]
        current = leases.get(name)
        if verb == "create" and current is not None:
            out.append(f'Error from server (AlreadyExists): leases.coordination.k8s.io "{name}" already exists')
            code = 1
        elif verb == "replace" and (current is None or
                                    current["metadata"]["resourceVersion"] != lease["metadata"].get("resourceVersion")):
            out.append(f'Error from server (Conflict): Operation cannot be fulfilled on leases "{name}"')
            code = 1
        else:
            state["version"] = state.get("version", 0) + 1
            lease["metadata"]["resourceVersion"] = str(state["version"])
            leases[name] = lease
            event("lease", lease["spec"]["holderIdentity"])
            out.append(f"lease.coordination.k8s.io/{name} {verb}d")
    elif verb == "delete" and args[1] == "lease":
        holder = leases.pop(args[2], {}).get("spec", {}).get("holderIdentity")
        event("release", holder)
        out.append(f'lease.coordination.k8s.io "{args[2]}" deleted')
    elif verb == "annotate":
        node, change = args[2], next(a for a in args[3:] if not a.startswith("--"))
        if change.endswith("-"):
            annotations.get(node, {}).pop(change[:-1], None)
        else:
            key, value = change.split("=", 1)
            annotations.setdefault(node, {})[key] = value
        out.append(f"node/{node} annotated")
    elif verb == "uncordon":
        state["cordoned"] = sorted(set(state["cordoned"]) - {args[1]})
        event("uncordon", args[1])
        out.append(f"node/{args[1]} uncordoned")
    elif verb == "get" and args[1] == "pods":
        node = next(a for a in args if a.startswith("spec.nodeName=")).split("=", 1)[1]
        for p in state["pods"]:
            if p["node"] == node:
                out.append(f'{p["ns"]}/{p["name"]} {p.get("owner") or ""} ')
    elif verb == "cordon":
        state["cordoned"] = sorted({*state["cordoned"], args[1]})
        event("cordon", args[1])
        out.append(f"node/{args[1]} cordoned")
    elif verb == "drain":
        node, force = args[1], "--force" in args
        mine = [p for p in state["pods"] if p["node"] == node and p.get("owner") != "DaemonSet"]
        bare = [p for p in mine if not p.get("owner")]
        if bare and not force:
            names = ",".join(f'{p["ns"]}/{p["name"]}' for p in bare)
            out.append(f'error: unable to drain node "{node}" due to error: cannot delete Pods that declare no '
                       f"controller (use --force to override): {names}")
            code = 1
        else:
            for p in mine:
                out.append(f'evicting pod {p["ns"]}/{p["name"]}')
                if p.get("pdb"):
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
    command = args[args.index("--") + 1:]
    stdin = sys.stdin.read()
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
        with self.path.open("r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            state = json.load(f)
            state.setdefault("labels", {}).setdefault(node, {}).update(labels)
            f.seek(0)
            f.truncate()
            json.dump(state, f)

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
        guest.stub_script("kubectl", f'exec python3 "{guest.bin}/kubectl.py" "{self.path}" "{expected}" "$@"')


def install_qm(host: FakeRoot, guest: FakeRoot, status: str = "running") -> None:
    """``qm`` on ``host`` for one VM that runs ``guest`` (``status``: running, stopped or missing)."""
    (host.bin / "qm.py").write_text(_QM)
    host.write("fake-vm-status", status)
    guest_path = f"{guest.bin}:/usr/bin:/bin"
    host.stub_script("qm", f'exec python3 "{host.bin}/qm.py" "{host.root}" "{guest.root}" "{guest_path}" "$@"')
    host.stub_script("id", 'if [ "$1" = -u ]; then echo 0; else echo root; fi')
