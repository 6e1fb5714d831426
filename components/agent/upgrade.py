"""The join step's Kubernetes minor upgrade of a joined worker, the parts that ask the API server (as the node
itself, kubelet's kubeconfig): whether the control plane is at the new minor yet, and whether the restarted kubelet
reports the new version. Runs on the machine (python3 3.10+, stdlib only) with kubeapi.py beside it.

    upgrade.py server --minor NN --kubeconfig FILE --api HOST:PORT
    upgrade.py kubelet --node N --version vX.Y.Z --timeout S --poll S --kubeconfig FILE --api HOST:PORT

``server`` fails unless the API server's minor is at least NN: a kubelet is never newer than the API server (the
version skew policy, kubernetes.io/releases/version-skew-policy/#kubelet). ``/version`` is readable by every
authenticated user (the system:public-info-viewer ClusterRole), so the node may ask. ``kubelet`` waits (bounded)
until the Node's ``status.nodeInfo.kubeletVersion`` is the version: the kubelet writes it at its start
(pkg/kubelet/nodestatus/setters.go, VersionInfo). A failure prints ``<step>: <what>: expected <x>, saw <y>`` and
exits 1.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence

if __package__:  # imported as part of the package (type checks)
    from .kubeapi import Failure, Kube, pause, say
else:  # run from its bundle directory, where kubeapi.py sits beside it (sys.path[0])
    from kubeapi import Failure, Kube, pause, say  # type: ignore[no-redef,import-not-found]

STEP = "join"


def server_minor(kube: Kube) -> tuple[int, str]:
    """The API server's minor version and its gitVersion (``v1.34.4``)."""
    # Not ``-o json``: kubectl refuses --raw with --output (k8s.io/kubectl pkg/cmd/get/get.go, Validate).
    out = kube("get", "--raw", "/version")
    try:
        info = json.loads(out)
    except ValueError:
        info = {}
    version = str((info if isinstance(info, dict) else {}).get("gitVersion", ""))
    found = re.match(r"v1\.(\d+)\.", version)
    if not found:
        raise Failure(STEP, "API server /version", "a gitVersion v1.N.P", repr(version)[:80])
    return int(found.group(1)), version


def check_server(kube: Kube, minor: int) -> None:
    have, version = server_minor(kube)
    if have < minor:
        raise Failure(
            STEP, "API server version", f"1.{minor} or later (a kubelet is never newer than its API server)",
            f"{version}: upgrade the control plane first (kubeadm upgrade apply), then run pulumi up again",
        )  # fmt: skip
    say(f"kubernetes: API server {version}")


def wait_kubelet(kube: Kube, node: str, version: str, timeout: int, *, poll: int,
                 sleep: Callable[[int], None] = pause) -> None:  # fmt: skip
    waited, seen = 0, ""
    while True:
        obj = kube.json("get", "node", node) or {}
        seen = str(((obj.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", ""))
        if seen == version:
            return say(f"kubernetes: {node} reports kubelet {version}")
        if waited >= timeout:
            raise Failure(STEP, f"node {node} kubeletVersion within {timeout}s", version, seen or "none")
        sleep(poll)
        waited += poll


def main(argv: Sequence[str]) -> int:
    """``server`` or ``kubelet`` and ``--flag value`` pairs (the shell step checked every value)."""
    command = (argv[:1] or [""])[0]
    pairs = iter(argv[1:])
    o = {flag.lstrip("-"): value for flag, value in zip(pairs, pairs, strict=False)}
    try:
        kube = Kube(STEP, o["kubeconfig"], o["api"])
        if command == "server":
            check_server(kube, int(o["minor"]))
        elif command == "kubelet":
            wait_kubelet(kube, o["node"], o["version"], int(o["timeout"]), poll=int(o["poll"]))
        else:
            raise Failure(STEP, "upgrade.py command", "server or kubelet", command or "none")
    except Failure as failure:
        say(f"{failure}\n{failure.output}".rstrip("\n"), err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
