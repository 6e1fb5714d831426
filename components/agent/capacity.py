"""The capacity gate: this node advertises exactly what the plan's capacity table says. Runs on the machine (python3
3.10+, stdlib only, copied there alone) and changes nothing.

    capacity.py --kubeconfig /etc/kubernetes/kubelet.conf --node N --expect RESOURCE=COUNT [--expect ...]
                [--timeout SECONDS] [--interval SECONDS] [--device-plugin-config NAME]

Reads the Node with kubelet's own credential (the Node authorizer lets a node read its own Node object, so no admin
credential is needed). Waits until .status.allocatable holds every expected count (the device plugin restarts with
a new config, MIG reconfigures, the operator labels the node): at most timeout/interval pauses, each read bounded
by kubectl's --request-timeout. Prints "capacity: ok: ..." or fails with one line ``capacity: <what>: expected
<x>, saw <y>`` naming the node, the expected and seen counts and the likely cause read from the node's labels.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

_NAME = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_EXPECT = r"[a-z0-9.-]+/[A-Za-z0-9_.-]+=[0-9]{1,7}"


class Failure(Exception):
    """``capacity: <what>: expected <x>, saw <y>``."""

    def __init__(self, what: str, expected: str, saw: str) -> None:
        super().__init__(f"capacity: {what}: expected {expected}, saw {saw}")


def pause(seconds: int) -> None:
    """Wait through the sleep command, like the shell steps (a stub on PATH shortens it in tests)."""
    subprocess.run(["sleep", str(seconds)], check=False)


def read_node(kubeconfig: str, node: str) -> tuple[int, str, str]:
    """``kubectl get node -o json`` with kubelet's kubeconfig (its own server), 20 s at most."""
    argv = ["kubectl", "--kubeconfig", kubeconfig, "--request-timeout=20s", "get", "node", node, "-o", "json"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return 127, "", "kubectl: command not found"
    return proc.returncode, proc.stdout, proc.stderr


def verdict(node: dict[str, Any], config: str, expected: dict[str, str]) -> tuple[str, str, str]:
    """("ok" | "wait" | "stop", what is advertised, the likely cause read from the node's labels); "stop" when
    waiting cannot help (the MIG reconfiguration failed)."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    seen = " ".join(f"{r}={allocatable.get(r, 0)}" for r in sorted(expected))
    if all(str(allocatable.get(r, "0")) == n for r, n in expected.items()):
        return "ok", seen, ""
    mig, have = labels.get("nvidia.com/mig.config.state", ""), labels.get("nvidia.com/device-plugin.config", "")
    if mig == "failed":
        geometry = labels.get("nvidia.com/mig.config", "?")
        cause = (f"the MIG configuration failed (nvidia.com/mig.config.state=failed, config {geometry}): see the "
                 "nvidia-mig-manager pod logs on this node")  # fmt: skip
        return "stop", seen, cause
    if mig in ("pending", "rebooting"):
        cause = f"MIG reconfiguration is {mig} (nvidia.com/mig.config.state): GPU pods may still hold the GPUs"
    elif "nvidia.com/gpu.present" not in labels:
        cause = "the GPU Operator has not labelled this node yet (operator or Node Feature Discovery not ready)"
    elif config and have != config:
        cause = f"the device-plugin config label is not applied (want {config}, seen {have or None})"
    else:
        cause = "the device plugin has not advertised this configuration yet: see the nvidia-device-plugin pod on "
        cause += "this node"
    return "wait", seen, cause


def gate(
    kubeconfig: str,
    node: str,
    expects: Sequence[str],
    *,
    timeout: int,
    interval: int,
    config: str = "",
    read: Callable[[str, str], tuple[int, str, str]] = read_node,
    sleep: Callable[[int], None] = pause,
) -> str:
    """Poll until the node advertises ``expects`` (RESOURCE=COUNT): the ok line, or a Failure."""
    expected = dict(e.split("=", 1) for e in expects)
    pauses, seen, cause = timeout // interval, "nothing read", "the API server did not answer"
    while True:
        code, out, err = read(kubeconfig, node)
        if code == 0:
            try:
                obj = json.loads(out)
            except ValueError:
                raise Failure(f"node {node}", "its Node object as JSON", "unreadable output") from None
            state, seen, cause = verdict(obj, config, expected)
            if state == "ok":
                return f"capacity: ok: {node} advertises {seen}"
            if state == "stop":
                raise Failure(f"node {node} allocatable", " ".join(expects), f"{seen}; {cause}")
        else:
            cause = "kubectl failed: " + " ".join(err.split())
        if pauses <= 0:
            raise Failure(f"node {node} allocatable", " ".join(expects), f"{seen} after {timeout}s; likely: {cause}")
        pauses -= 1
        sleep(interval)


def main(argv: Sequence[str]) -> int:
    values = {"--kubeconfig": "", "--node": "", "--timeout": "600", "--interval": "10", "--device-plugin-config": ""}
    expects: list[str] = []
    try:
        for i in range(0, len(argv), 2):
            flag, value = argv[i], (argv[i + 1] if i + 1 < len(argv) else "")
            if flag == "--expect":
                expects.append(value)
            elif flag in values:
                values[flag] = value
            else:
                raise Failure("arguments", "known flags", f"unknown argument {flag}")
        if not re.fullmatch(_NAME, values["--node"]):
            raise Failure("--node", "a node name", f"'{values['--node']}'")
        if not expects:
            raise Failure("arguments", "at least one --expect", "none")
        for e in expects:
            if not re.fullmatch(_EXPECT, e):
                raise Failure("--expect", "RESOURCE=COUNT", f"'{e}'")
        timeout, interval = values["--timeout"], values["--interval"]
        if not (re.fullmatch(r"[0-9]{1,5}", timeout) and re.fullmatch(r"[1-9][0-9]{0,3}", interval)):
            raise Failure("--timeout/--interval", "seconds", f"'{timeout}'/'{interval}'")
        config = values["--device-plugin-config"]
        if config and not re.fullmatch(r"[a-z0-9][a-z0-9.-]{0,62}", config):
            raise Failure("--device-plugin-config", "a name", f"'{config}'")
        kubeconfig = values["--kubeconfig"]
        if not os.path.isfile(kubeconfig) or not os.path.getsize(kubeconfig):
            raise Failure("kubelet credential", "/etc/kubernetes/kubelet.conf (the node has joined)", "no such file")
        line = gate(kubeconfig, values["--node"], expects, timeout=int(timeout), interval=int(interval), config=config)
    except Failure as failure:
        print(failure, file=sys.stderr)
        return 1
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
