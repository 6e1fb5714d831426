"""What the fair floor must share with the plan (``graph_shape``), resource by resource role."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any


def role(name: str) -> str:
    """A resource's role: its name without the cluster prefix, worker, node, PCI path and image hash."""
    name = re.sub(r"^cluster-?", "", name)
    name = re.sub(r"\bw\d+\b", "W", name)
    name = re.sub(r"\bpve\d+\b", "N", name)
    name = re.sub(r"0000:[0-9a-f]{2}:00", "PCI", name)
    return re.sub(r"image-[0-9a-f]{8}", "image-H", name)


def graph_shape(resources: list[Any]) -> dict[str, Counter[Any]]:
    """What the floor must share with the plan, counted by (type, role): resources, parent and dependency edges
    (explicit and through inputs), providers, option names set, top-level input keys and aliases."""
    by_urn = {r.urn: r for r in resources}

    def key(urn: str) -> tuple[str, str]:
        r = by_urn[urn]
        return (r.type, role(r.name) if r.type != "pulumi:pulumi:Stack" else "stack")

    options = (
        "protect",
        "ignore_changes",
        "replace_on_changes",
        "additional_secret_outputs",
        "delete_before_replace",
        "retain_on_delete",
        "replace_with",
        "custom_timeouts",
    )
    return {
        "resources": Counter(key(r.urn) for r in resources),
        "parents": Counter((key(r.urn), key(r.parent)) for r in resources if r.parent),
        "dependencies": Counter((key(r.urn), key(d)) for r in resources for d in set(r.dependencies)),
        "providers": Counter((key(r.urn), key(r.provider)) for r in resources if r.provider),
        "options": Counter(
            (
                key(r.urn),
                o,
                json.dumps(getattr(r, o), sort_keys=True)
                if o != "replace_with"
                else json.dumps(sorted(key(u) for u in r.replace_with)),
            )
            for r in resources
            for o in options
            if getattr(r, o)
        ),
        "inputs": Counter((key(r.urn), k) for r in resources for k in r.inputs),
        "aliases": Counter((key(r.urn), len(r.aliases)) for r in resources),
    }
