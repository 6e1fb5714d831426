"""State size per worker: what one worker's resources put into the stack's state, for the repository's stacks.

Pulumi keeps every resource's inputs in the state and writes the whole state after each step on the file and S3
backends, so the inputs per worker multiply into every checkpoint of an ``up``. Secrets are counted at their plain
size (state holds them encrypted, somewhat larger) twice: with the offline plan's short placeholders and with
realistic values (a 5 KB admin kubeconfig, a 400-byte SSH private key, a kubeadm token and CA hash).

A DHCP worker's address is unknown in a plan, and Pulumi then marks its steps' whole ``connection`` unknown; each
such connection is counted as the plan's own known connection (the same user, port, limits and key or none) with
a 15-character address, so the figures hold for DHCP and static workers alike.

The ``ssh`` column is how the SSH connections authenticate: the stack's own mode (``proxmox.sshAgent``) in the
plan and realistic rows, then one more realistic row in the other mode, so both can be cited: ``agent`` (no
connection carries the key) or ``key`` (the ``sshPrivateKey`` secret in every remote step's connection).

    python benchmarks/state_size.py                 # dev and prod
    python benchmarks/state_size.py --stacks prod --top 8
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
UNKNOWN = "[unknown]"
"""How ``unwrap`` writes a value a plan cannot know."""
REALISTIC = {
    "kubeconfig": "k" * 5000,
    "sshPrivateKey": "s" * 400,
    "kubeadmToken": "abcdef.0123456789abcdef",
    "kubeadmCaCertHash": "sha256:" + "0" * 64,
    "proxmoxApiToken": "root@pam!pulumi=" + "0" * 36,
    "proxmoxPassword": "p" * 24,
}
"""Realistic sizes of the secrets; any other secret key keeps its placeholder."""


def ssh_agent(document: Mapping[str, Any]) -> bool:
    """Whether a parsed stack file's spec turns the ssh-agent on (``proxmox.sshAgent``)."""
    spec = next(v for k, v in document["config"].items() if k.endswith(":cluster"))
    return bool(spec["proxmox"].get("sshAgent", False))


def plan_inputs(stack: str, secrets: Mapping[str, str] | None, agent: bool | None = None) -> list[dict[str, Any]]:
    """Every resource's name and inputs (secrets unwrapped) of ``stack``'s offline plan, with ``secrets`` (key ->
    value) instead of the placeholders where given, and ``proxmox.sshAgent`` set to ``agent`` unless None."""
    sys.path.insert(0, str(ROOT))
    import proxmox_gpu_cluster.stacks.plan.run as cli  # noqa: PLC0415
    from proxmox_gpu_cluster.testing import unwrap  # noqa: PLC0415

    original: Callable[..., tuple[dict[str, Any], list[str]]] = cli.stack_config

    def with_secrets(
        document: Mapping[str, Any], project: str = cli.PROJECT, clusters: Any = (), **options: Any
    ) -> tuple[dict[str, Any], list[str], list[str]]:
        config, keys, assumed = original(document, project, clusters, **options)
        for full in keys:
            value = (secrets or {}).get(full.split(":", 1)[1])
            if value is not None:
                config[full] = value
        return config, keys, assumed

    cli.stack_config = with_secrets  # type: ignore[assignment]
    try:
        document = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
        if agent is not None:
            spec = next(v for k, v in document["config"].items() if k.endswith(":cluster"))
            spec["proxmox"]["sshAgent"] = agent
        recording, _ = cli.plan(stack, document, ROOT / "__main__.py", placeholder_secrets=True)
    finally:
        cli.stack_config = original  # type: ignore[assignment]
    return [{"name": r.name, "type": r.type, "inputs": unwrap(r.inputs)} for r in recording.resources]


def fill_unknown_connections(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``resources`` with every unknown ``connection`` replaced by the plan's first known one, its host set to a
    15-character IPv4 address (the longest), so a DHCP worker's steps weigh what they will in state."""
    known = next(
        (r["inputs"]["connection"] for r in resources if isinstance(r["inputs"].get("connection"), dict)), None
    )
    if known is None:
        return resources
    stand_in = {**known, "host": "255.255.255.255"}
    return [
        {**r, "inputs": {**r["inputs"], "connection": stand_in}} if r["inputs"].get("connection") == UNKNOWN else r
        for r in resources
    ]


def per_worker(resources: list[dict[str, Any]], workers: list[str]) -> dict[str, dict[str, int]]:
    """Worker -> resource name -> bytes of its inputs' JSON, for the resources named after the worker
    (``<prefix>-<worker>-...``)."""
    sizes: dict[str, dict[str, int]] = {w: {} for w in workers}
    for r in resources:
        for w in workers:
            if f"-{w}-" in r["name"]:
                sizes[w][r["name"]] = len(json.dumps(r["inputs"]))
                break
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stacks", nargs="+", default=["dev", "prod"])
    parser.add_argument("--top", type=int, default=5, help="the largest resources of the largest worker")
    args = parser.parse_args(argv)
    print(f"{'stack':>6} {'secrets':>10} {'ssh':>5} {'workers':>7} {'max KiB/worker':>14} {'mean KiB/worker':>15}")
    largest: list[tuple[str, str, dict[str, int]]] = []
    for stack in args.stacks:
        document = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())
        spec = next(v for k, v in document["config"].items() if k.endswith(":cluster"))
        workers = [w["name"] for w in spec["workers"]]
        own = ssh_agent(document)
        # The stack's own mode with both secret sizes, then the realistic figure in the other mode.
        rows = (("plan", None, own), ("realistic", REALISTIC, own), ("realistic", REALISTIC, not own))
        for label, secrets, agent in rows:
            sizes = per_worker(fill_unknown_connections(plan_inputs(stack, secrets, agent)), workers)
            totals = {w: sum(s.values()) for w, s in sizes.items()}
            top = max(totals, key=lambda w: totals[w])
            mean = sum(totals.values()) / len(totals) / 1024
            ssh = "agent" if agent else "key"
            print(f"{stack:>6} {label:>10} {ssh:>5} {len(workers):>7} {totals[top] / 1024:>14.1f} {mean:>15.1f}")
            largest.append((f"{stack}/{label}/{ssh}", top, sizes[top]))
    for where, worker, sizes in largest if args.top else []:
        heaviest = sorted(sizes.items(), key=lambda kv: -kv[1])[: args.top]
        print(f"\n{where}, worker {worker}: " + ", ".join(f"{name} {size / 1024:.1f}" for name, size in heaviest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
