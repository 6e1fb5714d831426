"""Pulumi.yaml declares the config the program reads, in a form the Pulumi CLI accepts, and its `template:` section
prompts only for secrets the program reads.

There is no CLI here, so its rules are restated from pulumi/pulumi (sdk/go/common/workspace): project.go
`Project.Validate` (declared types are string, integer, boolean and array; an array needs `items`; not both
`default` and `value`; a key of another namespace has neither a type nor a default) and config.go `mergeConfig` /
`validateStackConfigValue` (a declared key of the project's namespace without a default or value is required; an
explicitly typed `secret: true` key must be stored encrypted; a default is stored as a plain value).
"""

from __future__ import annotations

import itertools
from typing import Any

import yaml

from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.stacks.config import ALL_SECRETS, PROJECT, SPEC_KEY, required_secrets
from tests.support import ROOT, base_spec, make_vm_worker

PROJECT_FILE = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
TYPES = {"string", "integer", "boolean", "array"}
DECLARATION_KEYS = {"type", "items", "description", "secret", "default", "value"}


def declarations() -> dict[str, dict[str, Any]]:
    """The project's config declarations, shorthand values rewritten as Pulumi does (RewriteShorthandConfigValues)."""
    out = {}
    for key, value in PROJECT_FILE["config"].items():
        own = ":" not in key or key.startswith(f"{PROJECT}:")
        out[key] = value if isinstance(value, dict) else {"default" if own else "value": value}
    return out


def project_problems(decls: dict[str, dict[str, Any]]) -> list[str]:
    problems = []
    for key, decl in decls.items():
        own = ":" not in key or key.startswith(f"{PROJECT}:")
        if set(decl) - DECLARATION_KEYS:
            problems.append(f"{key}: unknown attributes {sorted(set(decl) - DECLARATION_KEYS)}")
        if "default" in decl and "value" in decl:
            problems.append(f"{key}: both default and value")
        if "type" in decl and decl["type"] not in TYPES:
            problems.append(f"{key}: type {decl['type']!r} is not one of {sorted(TYPES)}")
        if decl.get("type") == "array" and "items" not in decl:
            problems.append(f"{key}: an array needs items")
        if not own and ("type" in decl or "default" in decl):
            problems.append(f"{key}: not namespaced by the project, so neither type nor default")
    return problems


def merge_problems(decls: dict[str, dict[str, Any]], stack: dict[str, Any]) -> list[str]:
    """What `pulumi preview` says about a stack's config before the program runs (Pulumi's mergeConfig)."""
    config = {(k if ":" in k else f"{PROJECT}:{k}"): v for k, v in (stack.get("config") or {}).items()}
    problems = []
    for key, decl in decls.items():
        full = key if ":" in key else f"{PROJECT}:{key}"
        if full not in config and "default" not in decl and "value" not in decl and full.startswith(f"{PROJECT}:"):
            problems.append(f"missing configuration value '{key}'")
        elif decl.get("secret") and "type" in decl and not isinstance(config.get(full), dict):
            problems.append(f"configuration key '{key}' must be encrypted as it's secret")
    return problems


def test_the_project_file_follows_pulumis_rules() -> None:
    assert PROJECT_FILE["name"] == PROJECT
    assert project_problems(declarations()) == []
    assert set(PROJECT_FILE["template"]) <= {"description", "quickstart", "important", "config", "displayName"}
    for key, prompt in PROJECT_FILE["template"]["config"].items():
        assert set(prompt) <= {"description", "default", "secret"}, key


def test_the_rules_would_catch_an_object_type_and_a_namespaced_default() -> None:
    assert project_problems({"cluster": {"type": "object"}, "proxmoxve:endpoint": {"default": "x"}}) == [
        "cluster: type 'object' is not one of ['array', 'boolean', 'integer', 'string']",
        "proxmoxve:endpoint: not namespaced by the project, so neither type nor default",
    ]


def _always_required() -> set[str]:
    """The secret keys every spec needs, whatever its auth mode, join method, vGPU use and SSH authentication."""
    needed = []
    combos = itertools.product(("token", "password"), ("kubeadm", "none"), (False, True), (False, True))
    for auth, join, vgpu, agent in combos:
        raw = make_vm_worker(base_spec(), 2, "vm-vgpu") if vgpu else base_spec()
        raw["proxmox"]["authMode"] = auth
        raw["proxmox"]["sshAgent"] = agent
        raw["kubernetes"]["joinMethod"] = join
        needed.append({s.key for s in required_secrets(load_spec(raw))})
    covered = {"vgpuRegistryPassword", "proxmoxPassword", "kubeadmCaCertHash", "sshPrivateKey"}
    assert covered <= set.union(*needed)  # combos covered
    return set.intersection(*needed)


def test_declared_keys_are_the_spec_and_exactly_the_secrets_every_stack_needs() -> None:
    decls = declarations()
    assert decls[SPEC_KEY].get("description") and set(decls[SPEC_KEY]) == {"description"}  # required, untyped
    typed_secrets = {k for k, d in decls.items() if d.get("secret")}
    # sshPrivateKey is not declared: with proxmox.sshAgent (the repository's stacks) no stack needs it.
    assert typed_secrets == _always_required() == {"kubeconfig"}
    for key in typed_secrets:
        assert decls[key]["type"] == "string" and decls[key]["description"], key
    undeclared = {k for k in decls if ":" not in k} - {SPEC_KEY} - {s.key for s in ALL_SECRETS}
    assert undeclared == set(), "the project declares a key the program never reads"


def test_pulumi_accepts_every_stack_file_once_its_secrets_are_set() -> None:
    decls = declarations()
    secrets = {f"{PROJECT}:kubeconfig": {"secure": "v1:encrypted"}}
    for path in sorted(ROOT.glob("Pulumi.*.yaml")):
        stack = yaml.safe_load(path.read_text())
        assert merge_problems(decls, stack) == ["missing configuration value 'kubeconfig'"], path
        stack["config"].update(secrets)
        assert merge_problems(decls, stack) == [], path
    plain = {"config": {f"{PROJECT}:{SPEC_KEY}": {}, **secrets, f"{PROJECT}:kubeconfig": "apiVersion: v1"}}
    assert merge_problems(decls, plain) == ["configuration key 'kubeconfig' must be encrypted as it's secret"]
    assert merge_problems(decls, {"config": secrets}) == ["missing configuration value 'cluster'"]


def test_the_template_prompts_only_for_secrets_the_program_reads() -> None:
    prompts = PROJECT_FILE["template"]["config"]
    assert set(prompts) <= {s.key for s in ALL_SECRETS}
    assert all(p["secret"] is True and p["description"] for p in prompts.values())
    # The multi-line secrets cannot be typed at a prompt; the quickstart says how to set them.
    quickstart = PROJECT_FILE["template"]["quickstart"]
    for key in set(_always_required()) - set(prompts):
        assert f"pulumi config set --secret {key} <" in quickstart
