"""What a program registered under the mock engine: resources with their parents, providers, dependencies,
options and inputs, and the queries tests and the offline plan ask of them (``testing.run`` records them)."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pulumi.output import Unknown
from pulumi.runtime import rpc

SECRET_SIG = rpc._special_sig_key  # "4dabf18193072939515e22adb298388d"
SECRET_VALUE = rpc._special_secret_sig
UNKNOWN = rpc.UNKNOWN
REDACTED = "[secret]"


def is_secret(value: Any) -> bool:
    """Whether ``value`` is a secret envelope as the mock monitor receives it."""
    return isinstance(value, Mapping) and value.get(SECRET_SIG) == SECRET_VALUE


def _walk(value: Any, secret: Callable[[Mapping[str, Any]], Any]) -> Any:
    """A copy of ``value`` with each secret envelope replaced by ``secret(envelope)`` and unknowns by
    ``"[unknown]"``."""
    if is_secret(value):
        return secret(value)
    if isinstance(value, Mapping):
        return {k: _walk(v, secret) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(v, secret) for v in value]
    if value == UNKNOWN or isinstance(value, Unknown):
        return "[unknown]"
    return value


def redact(value: Any, key: bytes | None = None) -> Any:
    """A copy of ``value`` with every secret replaced by ``"[secret]"`` and unknowns by ``"[unknown]"``.

    With ``key`` (a plan diff's random key, never stored or printed), a secret becomes ``"[secret:<hex>]"``: a
    truncated HMAC-SHA256 of its value under ``key``, so two plans of one diff tell a changed secret from an
    unchanged one, while nobody without the key can test a guess against it (a plain hash of a short token could
    be). A secret holding an unknown stays ``"[secret]"``: its value is not known, so neither is whether it changed."""
    if key is None:
        return _walk(value, lambda _: REDACTED)
    return _walk(value, lambda envelope: _fingerprint(envelope, key))


def _fingerprint(envelope: Mapping[str, Any], key: bytes) -> str:
    plain = unwrap(envelope["value"])
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"), default=str)
    if '"[unknown]"' in text or plain == "[unknown]":
        return REDACTED
    return f"[secret:{hmac.new(key, text.encode(), hashlib.sha256).hexdigest()[:16]}]"


def unwrap(value: Any) -> Any:
    """A copy of ``value`` with secret envelopes replaced by their plain values and unknowns by
    ``"[unknown]"``, so two plans compare equal when they would register the same thing (for assertions only)."""
    return _walk(value, lambda envelope: unwrap(envelope["value"]))


@dataclass
class RecordedResource:
    """One registered resource, as the engine would see it."""

    type: str
    name: str
    urn: str
    parent: str
    """Parent URN; empty for the stack itself."""
    custom: bool
    provider: str
    """URN of the explicit provider; empty when none was given (or for components)."""
    dependencies: list[str]
    """URNs this resource waits for: explicit depends_on plus those of its inputs."""
    property_dependencies: dict[str, list[str]]
    inputs: dict[str, Any]
    protect: bool
    ignore_changes: list[str]
    replace_on_changes: list[str]
    additional_secret_outputs: list[str]
    delete_before_replace: bool
    retain_on_delete: bool
    replace_with: list[str] = field(default_factory=list)
    """URNs whose replacement replaces this resource too."""
    aliases: list[dict[str, Any]] = field(default_factory=list)
    """Alias specs as sent to the engine: ``name``, ``type``, ``parentUrn`` or ``noParent`` (empty: unchanged)."""
    id: str = ""
    custom_timeouts: dict[str, str] = field(default_factory=dict)
    """create/update/delete timeouts that were set (e.g. ``{"create": "660s"}``)."""
    outputs: dict[str, Any] = field(default_factory=dict)
    """Outputs registered with register_outputs (components) or returned by the mocks."""

    @property
    def plain_inputs(self) -> dict[str, Any]:
        """Inputs with secrets unwrapped, for assertions."""
        result: dict[str, Any] = unwrap(self.inputs)
        return result


@dataclass
class RecordedInvoke:
    """One function call (data source), e.g. ``proxmoxve:hardware/getPci:getPci``."""

    token: str
    args: dict[str, Any]
    provider: str


@dataclass
class Recording:
    """What a program registered, in registration order."""

    resources: list[RecordedResource] = field(default_factory=list)
    invokes: list[RecordedInvoke] = field(default_factory=list)
    logs: list[tuple[str, str]] = field(default_factory=list)
    """(level, message) for every pulumi.log call at info level or above."""
    duplicate_urns: list[str] = field(default_factory=list)
    """URNs registered more than once (``run`` raises DuplicateUrnError for the first)."""

    @property
    def stack(self) -> RecordedResource:
        """The root stack resource."""
        return next(r for r in self.resources if r.type == "pulumi:pulumi:Stack")

    @property
    def outputs(self) -> dict[str, Any]:
        """Stack exports."""
        return self.stack.outputs

    def by_urn(self, urn: str) -> RecordedResource:
        """The resource with this URN."""
        return next(r for r in self.resources if r.urn == urn)

    def of_type(self, type_: str) -> list[RecordedResource]:
        """All resources of a type token."""
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str, name: str | None = None) -> RecordedResource:
        """The single resource of ``type_`` (and ``name``); AssertionError otherwise."""
        found = [r for r in self.of_type(type_) if name is None or r.name == name]
        assert len(found) == 1, f"expected one {type_} {name or ''}, found {[r.name for r in found]}"
        return found[0]

    def named(self, name: str) -> RecordedResource:
        """The single resource called ``name``."""
        found = [r for r in self.resources if r.name == name]
        assert len(found) == 1, f"expected one resource named {name}, found {len(found)}"
        return found[0]

    def children(self, parent: RecordedResource) -> list[RecordedResource]:
        """Direct children of ``parent``."""
        return [r for r in self.resources if r.parent == parent.urn]

    def descendants(self, parent: RecordedResource) -> Iterator[RecordedResource]:
        """Children, grandchildren, ... of ``parent``."""
        for child in self.children(parent):
            yield child
            yield from self.descendants(child)

    def depends_on(self, resource: RecordedResource, other: RecordedResource) -> bool:
        """Whether ``resource`` waits for ``other``, directly or through a chain of dependencies or parents.

        A component's dependencies count for its children, as the engine orders them that way too.
        """
        targets = {other.urn, *(d.urn for d in self.descendants(other))}
        seen: set[str] = set()
        todo = [resource.urn]
        while todo:
            urn = todo.pop()
            if urn in seen:
                continue
            seen.add(urn)
            r = self.by_urn(urn)
            if targets.intersection(r.dependencies):
                return True
            todo.extend(r.dependencies)
            if r.parent:
                todo.append(r.parent)
        return False


def critical_path(
    recording: Recording, weight: Callable[[RecordedResource], float] | None = None
) -> list[RecordedResource]:
    """The longest chain of custom resources, each waiting for the previous one: through its dependencies, and
    through those of its ancestors (the SDK registers a resource only once its parent is registered, and a
    component only once its own dependencies are). Its length is the depth of a first ``pulumi up``; with
    ``weight`` (a resource's duration), the chain of the largest total instead (benchmarks/critical_path.py)."""
    size = weight or (lambda _: 1.0)

    def _rank(chain: list[RecordedResource]) -> tuple[float, list[str]]:
        # Longest first; among equals the same one every run (registration order and set order vary between runs).
        return sum(size(r) for r in chain), [r.urn for r in chain]

    by_urn = {r.urn: r for r in recording.resources}
    memo: dict[str, list[RecordedResource]] = {}

    def waits_for(r: RecordedResource) -> set[str]:
        found: set[str] = set(r.dependencies)
        parent = by_urn.get(r.parent)
        if parent is not None and parent.custom:
            found.add(parent.urn)  # a custom parent's URN is known once it exists
        while parent is not None:
            found.update(parent.dependencies)
            parent = by_urn.get(parent.parent)
        return found

    def chain(r: RecordedResource) -> list[RecordedResource]:
        if r.urn not in memo:
            memo[r.urn] = []  # a cycle (the SDK refuses them) ends here
            best = max((chain(by_urn[u]) for u in waits_for(r) if u in by_urn), key=_rank, default=[])
            memo[r.urn] = [*best, r] if r.custom else best
        return memo[r.urn]

    return max((chain(r) for r in recording.resources), key=_rank, default=[])
