"""Read the cluster spec and the secrets from the stack's Pulumi config.

The spec is one structured key, ``<namespace>:cluster`` (the namespace is the program's project name unless the
program names another, e.g. ``proxmox-gpu-cluster:cluster`` here). Secrets are separate secret keys, read with
``require_secret`` so they stay Pulumi secrets end to end; which ones are required depends on the spec (auth
mode, join method). Every problem, in the spec or a missing secret, is reported at once as one
``pulumi.RunError`` (the CLI prints it without a traceback) before any resource registers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import pulumi
from pydantic import BaseModel, ValidationError

from proxmox_gpu_cluster.cluster.providers import Secrets, needed_secrets
from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.input_safety import MAX_DEPTH, budget_problem, escape_lines, spec_problems
from proxmox_gpu_cluster.core.nodes import ExistingGpuNode, GpuNode
from proxmox_gpu_cluster.core.scheduling_spec import Quota
from proxmox_gpu_cluster.core.spec import ClusterSpec, load_spec
from proxmox_gpu_cluster.core.spec_base import validate_stack_data

M = TypeVar("M", bound=BaseModel)
PROJECT = "proxmox-gpu-cluster"
"""This repository's project name, the default config namespace of its own stacks."""
SPEC_KEY = "cluster"


@dataclass(frozen=True)
class SecretKey:
    """A secret config key, the ``Secrets`` field it fills, and when it is needed."""

    key: str
    field: str
    purpose: str


PROXMOX_API_TOKEN = SecretKey(
    "proxmoxApiToken", "proxmox_api_token", "Proxmox API token, 'user@realm!tokenid=uuid' (authMode token)"
)
PROXMOX_PASSWORD = SecretKey("proxmoxPassword", "proxmox_password", "password of proxmox.username (authMode password)")
SSH_PRIVATE_KEY = SecretKey(
    "sshPrivateKey",
    "ssh_private_key",
    "SSH private key for Proxmox nodes and guest VMs (or the ssh-agent: proxmox.sshAgent true)",
)
KUBECONFIG = SecretKey("kubeconfig", "kubeconfig", "kubeconfig of the target cluster")
JOIN_TOKEN = SecretKey(
    "kubeadmJoinToken",
    "join_token",
    "kubeadm bootstrap token (joinMethod kubeadm); optional: without it each join mints its own, valid for an hour",
)
CA_CERT_HASH = SecretKey(
    "kubeadmCaCertHash", "ca_cert_hash", "kubeadm discovery CA cert hash, sha256:... (joinMethod kubeadm)"
)
VGPU_REGISTRY_PASSWORD = SecretKey(
    "vgpuRegistryPassword",
    "vgpu_registry_password",
    "password of kubevirt.vgpuManager's registry, e.g. an NGC API key (vm-vgpu nodes)",
)
ALL_SECRETS = (
    PROXMOX_API_TOKEN, PROXMOX_PASSWORD, SSH_PRIVATE_KEY, KUBECONFIG, JOIN_TOKEN, CA_CERT_HASH, VGPU_REGISTRY_PASSWORD
)  # fmt: skip


class InvalidStackConfig(pulumi.RunError):
    """The stack's config is invalid; the message has one line per problem, control characters escaped."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = escape_lines(lines)
        super().__init__("invalid stack configuration:\n" + "\n".join(self.lines))


def required_secrets(spec: ClusterSpec) -> list[SecretKey]:
    """The secret keys this spec needs (the rule ``GpuClusterArgs`` applies: ``needed_secrets``)."""
    needed = needed_secrets(spec)
    return [key for key in ALL_SECRETS if key.field in needed]


def secret_problems(
    namespace: str,
    required: list[SecretKey],
    value_of: Callable[[str], str | None],
    is_secret: Callable[[str], bool],
) -> list[str]:
    """One line per secret key that is required but unset or empty, or set at all but in plain text.

    Plain text is refused for every secret key, needed or not: a value that was not stored with ``--secret`` sits
    readable in ``Pulumi.<stack>.yaml`` and in git. ``Pulumi.yaml`` cannot declare the conditional keys
    ``secret: true`` (a declared key without a default is required by the CLI), so the program enforces it.
    An empty value counts as unset: ``pulumi new`` stores an empty answer to a prompt as an empty secret.
    """
    lines = []
    for key in ALL_SECRETS:
        full, value = f"{namespace}:{key.key}", value_of(key.key)
        fix = f"pulumi config set --secret {full} ..."
        if value is not None and not is_secret(full):
            lines.append(f"{full}: stored in plain text; it must be a secret ({fix})")
        elif key in required and (value is None or not value.strip()):
            state = "is not set" if value is None else "is empty"
            lines.append(f"{full}: required secret {state} ({key.purpose}); {fix}")
    return lines


def agent_problems(namespace: str, spec: ClusterSpec, environ: Mapping[str, str], dry_run: bool) -> list[str]:
    """With ``proxmox.sshAgent``, an ``up`` (not a preview, which connects nowhere) where no agent socket is set.

    The providers are started by the same ``pulumi`` process as the program and inherit its environment, and both
    find the agent through ``SSH_AUTH_SOCK`` (components/ssh.py, cluster/providers.py); without it every SSH step
    would fail on its own with no authentication method, after its dial retries."""
    if not spec.proxmox.ssh_agent or dry_run or environ.get("SSH_AUTH_SOCK"):
        return []
    return [
        f"{namespace}:{SPEC_KEY}.proxmox.sshAgent: the ssh-agent is on but SSH_AUTH_SOCK is not set where pulumi "
        'runs; start one and load the key first (eval "$(ssh-agent)"; ssh-add ~/.ssh/id_ed25519)'
    ]


def parse_spec(raw: Any, namespace: str = PROJECT) -> ClusterSpec:
    """Validate the raw ``cluster`` value; InvalidStackConfig lists every problem."""
    if raw is None:
        raise InvalidStackConfig([f"{namespace}:{SPEC_KEY}: required config key is not set"])
    try:
        return load_spec(raw, root=f"{namespace}:{SPEC_KEY}")
    except SpecError as err:
        raise InvalidStackConfig(err.lines) from None


def load(namespace: str | None = None) -> tuple[ClusterSpec, Secrets]:
    """Load and validate the spec and every secret it needs from the config ``namespace`` (default: the
    program's project name), or raise InvalidStackConfig with all problems."""
    ns = namespace or pulumi.get_project()
    cfg = pulumi.Config(ns)
    raw = _config_object(ns, SPEC_KEY, "a mapping (the cluster spec)")
    spec = parse_spec(raw, ns)
    problems = secret_problems(ns, required_secrets(spec), cfg.get, pulumi.runtime.is_config_secret)
    problems += agent_problems(ns, spec, os.environ, pulumi.runtime.is_dry_run())
    if problems:
        raise InvalidStackConfig(problems)

    def secret(key: SecretKey, needed: bool = True) -> pulumi.Output[str] | None:
        if needed:
            return cfg.require_secret(key.key)
        return cfg.get_secret(key.key)

    kubeadm = spec.kubernetes.join_method == "kubeadm"
    token_mode = spec.proxmox.auth_mode == "token"
    # Optional ones are still read as secrets: a password given in token mode unlocks root-only features.
    secrets = Secrets(
        ssh_private_key=None if spec.proxmox.ssh_agent else cfg.require_secret(SSH_PRIVATE_KEY.key),
        kubeconfig=cfg.require_secret(KUBECONFIG.key),
        proxmox_api_token=secret(PROXMOX_API_TOKEN, token_mode),
        proxmox_password=secret(PROXMOX_PASSWORD, not token_mode),
        join_token=secret(JOIN_TOKEN, False),
        ca_cert_hash=secret(CA_CERT_HASH, kubeadm),
        vgpu_registry_password=secret(VGPU_REGISTRY_PASSWORD, spec.kubevirt.vgpu_manager is not None),
    )
    return spec, secrets


def raw_spec_from_stack_file(document: Mapping[str, Any], namespace: str = PROJECT) -> Any:
    """The ``cluster`` value of a parsed ``Pulumi.<stack>.yaml`` (None if absent, or if ``config`` is no mapping)."""
    config = document.get("config") or {}
    if not isinstance(config, Mapping):
        return None
    return config.get(f"{namespace}:{SPEC_KEY}", config.get(SPEC_KEY))


def load_model(model: type[M], key: str, namespace: str | None = None) -> M:
    """Any spec model from one structured config key (camelCase keys, as in stack files), e.g.
    ``load_model(GpuOperatorSpec, "gpuOperator")``; InvalidStackConfig lists every problem."""
    ns = namespace or pulumi.get_project()
    return parse_model(model, _config_object(ns, key), f"{ns}:{key}")


def parse_model(model: type[M], raw: Any, root: str) -> M:
    """Validate ``raw`` as ``model``; problems are reported under ``root`` (e.g. ``team:gpuNodes[1].gpus``)."""
    if raw is None:
        raise InvalidStackConfig([f"{root}: required config key is not set"])
    too_big = budget_problem(raw)
    if too_big is not None:
        raise InvalidStackConfig([f"{root}: {too_big}"])
    try:
        return validate_stack_data(model, raw)
    except ValidationError as err:
        raise InvalidStackConfig(SpecError(spec_problems(err, model), root).lines) from None


def load_nodes(key: str = "gpuNodes", namespace: str | None = None) -> list[GpuNode]:
    """Existing GPU nodes from a config key holding a list of ``ExistingGpuNode`` (camelCase keys), for programs
    that run the GPU stack on nodes they did not provision; every problem at once, as InvalidStackConfig."""
    ns = namespace or pulumi.get_project()
    raw = _config_object(ns, key)
    if not isinstance(raw, list) or not raw:
        raise InvalidStackConfig([f"{ns}:{key}: expected a non-empty list of GPU nodes"])
    lines: list[str] = []
    nodes: list[GpuNode] = []
    for i, item in enumerate(raw):
        try:
            nodes.append(parse_model(ExistingGpuNode, item, f"{ns}:{key}[{i}]").resolve())
        except InvalidStackConfig as err:
            lines += err.lines
    if lines:
        raise InvalidStackConfig(lines)
    return nodes


def load_quotas(key: str = "quotas", namespace: str | None = None) -> list[Quota]:
    """GPU quotas from a config key holding a list of ``Quota`` (camelCase keys), for ``GpuQuotasArgs.quotas``;
    every problem of every entry at once, as InvalidStackConfig (``<ns>:quotas[1].resources: ...``)."""
    ns = namespace or pulumi.get_project()
    raw = _config_object(ns, key)
    if not isinstance(raw, list) or not raw:
        raise InvalidStackConfig([f"{ns}:{key}: expected a non-empty list of quotas"])
    lines: list[str] = []
    quotas: list[Quota] = []
    for i, item in enumerate(raw):
        try:
            quotas.append(parse_model(Quota, item, f"{ns}:{key}[{i}]"))
        except InvalidStackConfig as err:
            lines += err.lines
    if lines:
        raise InvalidStackConfig(lines)
    return quotas


def _config_object(namespace: str, key: str, expected: str = "structured YAML") -> Any:
    try:
        return pulumi.Config(namespace).get_object(key)
    except pulumi.ConfigTypeError:
        raise InvalidStackConfig([f"{namespace}:{key}: expected {expected}, got plain text"]) from None
    except RecursionError:  # json.loads of junk nested thousands of levels deep
        raise InvalidStackConfig([f"{namespace}:{key}: nested more than {MAX_DEPTH} levels deep"]) from None
