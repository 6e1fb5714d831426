"""What the offline plan gives a program besides its code: the cluster specs of the stack file (any number of
clusters, one per config namespace) and its config, with secrets as ``pulumi preview`` would have them.

A program may build several clusters, each from its own namespace (``load("team-a")`` reads ``team-a:cluster``
and ``team-a:kubeconfig``...). The plan validates every ``<namespace>:cluster`` of the stack file (or the
namespaces given), so the capacity table, the disruption and the hosts ``get_pci`` answers for cover all of them.

Secrets: a value stored encrypted (``secure:``) cannot be decrypted offline and gets a placeholder (one per
ciphertext, so a rotated secret shows in a diff), so the program runs its real secret handling. A secret the stack
does not set at all is not invented: the program reports it as under ``pulumi preview`` (``load`` lists every
missing one), unless ``placeholder_secrets`` asks for placeholders, for stack files that deliberately carry no
secrets (this repository's templates); the plan then says which it assumed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxmox_gpu_cluster.core.capacity import WorkerCapacity, capacity_from_output, capacity_output, capacity_table
from proxmox_gpu_cluster.core.spec import ClusterSpec
from proxmox_gpu_cluster.recording import Recording, unwrap
from proxmox_gpu_cluster.stacks.config import (
    ALL_SECRETS,
    SPEC_KEY,
    InvalidStackConfig,
    parse_spec,
    raw_spec_from_stack_file,
    required_secrets,
)

PROVIDER_NAMESPACES = frozenset({"pulumi", "proxmoxve", "kubernetes", "command"})
"""Config namespaces of Pulumi itself and the providers: never a cluster's."""


@dataclass(frozen=True)
class PlannedCluster:
    """One cluster spec of the stack file and the config namespace it came from."""

    namespace: str
    spec: ClusterSpec


def spec_namespaces(document: Mapping[str, Any], project: str) -> list[str]:
    """Every namespace with a ``<namespace>:cluster`` key in the stack file, the project's first (a bare
    ``cluster`` key is the project's, as Pulumi reads it)."""
    config = document.get("config") or {}
    if not isinstance(config, Mapping):
        return []
    found = {str(k).partition(":")[0] for k in config if str(k).partition(":")[2] == SPEC_KEY}
    found -= PROVIDER_NAMESPACES
    if SPEC_KEY in config:
        found.add(project)
    return sorted(found, key=lambda ns: (ns != project, ns))


def cluster_specs(document: Mapping[str, Any], namespaces: Sequence[str]) -> list[PlannedCluster]:
    """The validated spec of each namespace that has one; every problem of all of them at once."""
    planned: list[PlannedCluster] = []
    lines: list[str] = []
    for ns in namespaces:
        raw = raw_spec_from_stack_file(document, ns)
        if raw is None:
            continue
        try:
            planned.append(PlannedCluster(ns, parse_spec(raw, ns)))
        except InvalidStackConfig as err:
            lines += err.lines
    if lines:
        raise InvalidStackConfig(lines)
    return planned


def stack_config(
    document: Mapping[str, Any],
    project: str,
    clusters: Sequence[PlannedCluster] = (),
    *,
    placeholder_secrets: bool = False,
) -> tuple[dict[str, Any], list[str], list[str]]:
    """Config map, secret keys and the keys given placeholders for the mock engine, from a parsed stack file.

    Encrypted values get a placeholder. With ``placeholder_secrets``, so does every secret a cluster needs
    (``required_secrets``) that the stack does not set; for a program without a cluster spec in its config, every
    secret key of the project's namespace. The third list names the ones assumed that way.
    """
    config: dict[str, Any] = {}
    secret_keys: list[str] = []
    for key, value in (document.get("config") or {}).items():
        full = key if ":" in key else f"{project}:{key}"
        if isinstance(value, Mapping) and set(value) == {"secure"}:
            config[full] = f"plan-placeholder-{full.split(':', 1)[1]}-{_ciphertext_digest(value['secure'])}"
            secret_keys.append(full)
        else:
            config[full] = value
    assumed: list[str] = []
    if placeholder_secrets:
        wanted = [(c.namespace, k.key) for c in clusters for k in required_secrets(c.spec)]
        wanted = wanted or [(project, k.key) for k in ALL_SECRETS]
        for ns, key in wanted:
            full = f"{ns}:{key}"
            if full not in config:
                config[full] = f"plan-placeholder-{key}"
                secret_keys.append(full)
                assumed.append(full)
    return config, secret_keys, assumed


def _ciphertext_digest(ciphertext: Any) -> str:
    """A short digest of an encrypted value's ciphertext, so a placeholder changes when the stack file's ciphertext
    does (a rotated secret shows in a diff as "changed (secret)"; a value encrypted again, e.g. by `pulumi stack
    change-secrets-provider`, shows the same: the plan cannot decrypt to tell). The ciphertext is in the stack file
    already; its digest tells nothing about the value."""
    text = ciphertext if isinstance(ciphertext, str) else json.dumps(ciphertext, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


Specs = ClusterSpec | Sequence[PlannedCluster] | None
"""The program's cluster spec, or the specs of a program with several clusters (one per config namespace)."""


def clusters_of(spec: Specs) -> list[PlannedCluster]:
    """The planned clusters of ``spec`` (a single spec has no namespace of its own)."""
    if spec is None:
        return []
    return [PlannedCluster("", spec)] if isinstance(spec, ClusterSpec) else list(spec)


GPU_CLUSTER = "proxmox-gpu-cluster:cluster:GpuCluster"


def built_capacity(clusters: Sequence[PlannedCluster], recording: Recording) -> list[WorkerCapacity]:
    """The capacity table of the clusters the program really built: a stack file's ``<namespace>:cluster`` only
    when a GpuCluster of the run advertises exactly its table (a program may read one namespace and leave the
    others alone), then each GpuCluster built from a spec of its own (Python), from its ``capacity`` output. A
    program without a GpuCluster: the table it exports (``capacity_output``), if any."""
    built = [unwrap(r.outputs.get("capacity")) for r in recording.of_type(GPU_CLUSTER)]
    if not built:
        return capacity_from_output(recording.outputs.get("capacity"))
    rows: list[WorkerCapacity] = []
    for cluster in clusters:
        table = capacity_table(cluster.spec)
        if capacity_output(table) in built:
            built.remove(capacity_output(table))
            rows += table
    for output in built:
        rows += capacity_from_output(output)
    return rows
