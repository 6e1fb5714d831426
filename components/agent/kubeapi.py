"""The node steps' access to the Kubernetes API, as the node itself: kubectl (argv lists) with kubelet's kubeconfig
(/etc/kubernetes/kubelet.conf), failures as one line, the drain and the retirement. Runs on the machine (python3
3.10+, stdlib only) beside cluster.py, which imports it (the bundle's directory is sys.path[0]).

As the node (user system:node:<name>, group system:nodes) kubectl may, through the Node authorizer and the
NodeRestriction admission plugin (kubernetes plugin/pkg/auth/authorizer/node, plugin/pkg/admission/noderestriction),
read and patch its own Node (cordon, annotations, labels outside kubernetes.io; never taints), list its own pods
(a spec.nodeName field selector) and evict them; the cluster's node-steps RBAC (render/node_rbac.py) adds reading
other Nodes and deleting its own Node.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

_NO_ANSWER = re.compile(r"refused|Unable to connect|i/o timeout|no such host|deadline exceeded|Client.Timeout|EOF")


class Failure(Exception):
    """One failure line, ``<step>: <what>: expected <x>, saw <y>``, and the tool's output shown below it."""

    def __init__(self, step: str, what: str, expected: str, saw: str, output: str = "") -> None:
        super().__init__(f"{step}: {what}: expected {expected}, saw {saw}")
        self.output = output.strip()


def say(line: str, err: bool = False) -> None:
    print(line, file=sys.stderr if err else sys.stdout, flush=True)


def pause(seconds: int) -> None:
    """Wait through the sleep command, like the shell steps (a stub on PATH shortens it in tests)."""
    subprocess.run(["sleep", str(seconds)], check=False)


class Kube:
    """kubectl with a kubeconfig file, at ``server`` (https://HOST:PORT) when given, bounded per request."""

    def __init__(self, step: str, kubeconfig: str, server: str | None = None, *, timeout: str = "30s",
                 command: Sequence[str] = ("kubectl",), env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.step, self.kubeconfig, self.server, self.timeout = step, kubeconfig, server, timeout
        self.command, self.env = list(command), env

    def call(self, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
        argv = [*self.command, "--kubeconfig", self.kubeconfig]
        argv += ["--server", f"https://{self.server}"] if self.server else []
        argv += [f"--request-timeout={self.timeout}", *args]
        feed: dict[str, Any] = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, check=False, env=self.env, **feed)
        except FileNotFoundError:
            return 127, "", f"{self.command[0]}: command not found"
        return proc.returncode, proc.stdout, proc.stderr

    def __call__(self, *args: str) -> str:
        code, out, err = self.call(*args)
        if code:
            raise self.failure(args, code, err or out)
        return out

    def json(self, *args: str) -> Any:
        out = self(*args, "-o", "json")
        return json.loads(out) if out.strip() else None

    def failure(self, args: Sequence[str], code: int, output: str) -> Failure:
        text = output.strip()
        last = text.splitlines()[-1] if text else f"exit code {code}"
        saw = "Unauthorized (the API server refused the credentials)" if "Unauthorized" in text else last
        # The API server's reason follows "is forbidden: ": an authorizer's "User ... cannot VERB resource ...",
        # then the Node authorizer's own words (which alone, such as "No Object name found", say little), or an
        # admission plugin's (NodeRestriction) alone. kubectl cordon prints it without "(Forbidden)".
        forbidden = re.search(r" is forbidden: (.*)", last)
        if "(Forbidden)" in text or forbidden:
            reason = forbidden.group(1) if forbidden else last.rsplit(": ", 1)[-1]
            saw = f"Forbidden ({reason}; is the cluster's node-steps RBAC applied?)"
        saw = f"no answer ({last})" if _NO_ANSWER.search(text) else saw
        what = "kubectl " + " ".join(a for a in args[:3] if not a.startswith("-"))
        where = f" at https://{self.server}" if self.server else ""
        return Failure(self.step, what, f"an answer from the API server{where}", saw, text)


def cordon(kube: Kube, node: str, on: bool = True) -> None:
    """kubectl cordon (``on``) or uncordon, failing when the Node's patch failed: kubectl then prints "error: unable
    to cordon node ..." and still exits 0 (k8s.io/kubectl v0.34.4 pkg/cmd/drain/drain.go, RunCordonOrUncordon)."""
    verb = "cordon" if on else "uncordon"
    code, out, err = kube.call(verb, node)
    if code or "error: unable to" in err:
        raise kube.failure([verb, node], code or 1, err or out)


def metadata(obj: dict[str, Any] | None, kind: str = "annotations") -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get(kind) or {})


def cordoned(obj: dict[str, Any] | None) -> bool:
    return bool(((obj or {}).get("spec") or {}).get("unschedulable"))


def stays(pod: dict[str, Any]) -> bool:
    """A pod a drain leaves: a DaemonSet's (its controller would put it back) or a static pod's mirror."""
    meta = pod.get("metadata") or {}
    owners = [o.get("kind") for o in meta.get("ownerReferences") or [] if o.get("controller", True)]
    return "DaemonSet" in owners or "kubernetes.io/config.mirror" in (meta.get("annotations") or {})


def drain(kube: Kube, node: str, timeout: int, *, emptydir: bool, force: bool, advice: str,
          sleep: Callable[[int], None] = pause, poll: int = 5) -> None:  # fmt: skip
    """``kubectl drain --ignore-daemonsets`` as the node may do it: list its own pods (field selector), evict each
    (policy/v1 Eviction: a PodDisruptionBudget that refuses answers 429 and the eviction is retried), until none is
    left or ``timeout`` passed. kubectl drain itself reads each pod's DaemonSet and each evicted pod by name, which
    the Node authorizer refuses a node (upstream node_authorizer.go). Pods without a controller need ``force`` and
    pods with emptyDir data ``emptydir``, checked before anything is evicted; finished pods need neither."""
    waited, refused, said = 0, set(), ""
    while True:
        listing = kube.json("get", "pods", "--all-namespaces", "--field-selector", f"spec.nodeName={node}") or {}
        pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in listing.get("items", [])}
        pods = {name: p for name, p in pods.items() if not stays(p)}
        live = {n: p for n, p in pods.items() if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
        bare = [n for n, p in live.items() if not (p["metadata"].get("ownerReferences") or []) and not force]
        local = [n for n, p in live.items() if not emptydir and any(
            "emptyDir" in v for v in (p.get("spec") or {}).get("volumes") or [])]  # fmt: skip
        if bare or local:
            why = [f"{n} (no controller: kubernetes.drain.force deletes it)" for n in bare]
            why += [f"{n} (emptyDir data: kubernetes.drain.deleteEmptydirData evicts it)" for n in local]
            raise Failure(kube.step, f"pods on {node}", "pods a drain may evict", f"{', '.join(why)}; {advice}")
        if not pods:
            return
        if waited >= timeout:
            saw = ", ".join(f"{n} (a PodDisruptionBudget refuses its eviction)" if n in refused else n for n in pods)
            raise Failure(kube.step, f"pods on {node}", f"none left within {timeout}s", f"{saw}; {advice}", said)
        for name, pod in pods.items():
            refusal = evict(kube, name) if pod["metadata"].get("deletionTimestamp") is None else ""  # else: wait
            if refusal:
                refused.add(name)
                said = refusal
            else:
                refused.discard(name)
        sleep(poll)
        waited += poll


def evict(kube: Kube, name: str) -> str:
    """POST one pod's Eviction: the API server's answer when a PodDisruptionBudget refuses it now (429), "" when
    it was accepted or the pod is gone."""
    namespace, pod = name.split("/", 1)
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction"
    code, out, err = kube.call("create", "--raw", path, "-f", "-", stdin=json.dumps(body))
    if code and "(TooManyRequests)" in err:
        return err.strip()
    if code and "(NotFound)" not in err:
        raise kube.failure(["create", "eviction", name], code, err or out)
    return ""


def retire(kube: Kube, node: str, timeout: int, *, emptydir: bool, force: bool, reset: bool) -> None:
    """Cordon, drain (bounded) and delete the Node, then kubeadm reset (when asked), before the machine goes away.
    The kubelet stops first, so the deleted Node is not registered again; the Node goes before the reset, which
    removes the credential that deletes it (a node may delete only itself: NodeRestriction)."""
    present = kube.json("get", "node", node, "--ignore-not-found") is not None
    if present:
        cordon(kube, node)
        say(f"retire: cordoned {node}")
        advice = (f"{node} stays cordoned: relax the budget or move the pods (or set kubernetes.drain.force for pods "
                  "without a controller), then run pulumi up again")  # fmt: skip
        drain(kube, node, timeout, emptydir=emptydir, force=force, advice=advice)
        say(f"retire: drained {node}")
    else:
        say(f"retire: {node} is not in the cluster; nothing to drain")

    def run(*argv: str) -> None:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode:
            raise Failure("drain", " ".join(argv), "exit 0", str(proc.returncode), proc.stderr)
        say(f"retire: {' '.join(argv[:2])}")

    if reset and present:
        # Asked first (a SelfSubjectAccessReview, which every authenticated user may create): without the grant the
        # delete below would fail after the kubelet stopped, leaving a drained node NotReady for nothing.
        code, out, err = kube.call("auth", "can-i", "delete", f"node/{node}")
        if out.strip() != "yes":
            raise Failure("drain", f"kubectl auth can-i delete node/{node}", "yes (the cluster's node-steps RBAC)",
                          (out or err).strip() or f"exit code {code}", err)  # fmt: skip
        run("systemctl", "stop", "kubelet")  # a running kubelet would register the deleted Node again
    if present:
        kube("delete", "node", node, "--ignore-not-found")
        say(f"retire: deleted Node {node}")
    if reset:
        run("kubeadm", "reset", "--force")
