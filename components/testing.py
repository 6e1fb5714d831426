"""Run a Pulumi program under the mock engine and record everything it registers.

Public so that users can unit-test their own programs that import these components::

    from proxmox_gpu_cluster.testing import run

    rec = run(my_program, config={"proxmox-gpu-cluster:cluster": {...}}, secret_keys=["..."])
    vm = rec.one("proxmoxve:index/vmLegacy:VmLegacy")
    assert vm.inputs["machine"] == "q35"

Pulumi's stock ``MockMonitor`` keeps only ids and states; ``RecordingMonitor`` also keeps what a plan needs:
parent, provider, dependencies, resource options and the raw inputs (secrets arrive as envelopes, see
``redact``). Mocks check nothing about argument names: use the providers' typed ``*Args`` classes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.output import Unknown
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc
from pulumi.runtime.settings import ROOT
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.testing_pci import pci_invokes

SECRET_SIG = rpc._special_sig_key  # "4dabf18193072939515e22adb298388d"
SECRET_VALUE = rpc._special_secret_sig
UNKNOWN = rpc.UNKNOWN
REDACTED = "[secret]"

ResourceHook = Callable[[pulumi.runtime.MockResourceArgs], Mapping[str, Any]]
InvokeHook = Callable[[Mapping[str, Any]], Mapping[str, Any]]


def is_secret(value: Any) -> bool:
    """Whether ``value`` is a secret envelope as the mock monitor receives it."""
    return isinstance(value, Mapping) and value.get(SECRET_SIG) == SECRET_VALUE


def redact(value: Any) -> Any:
    """A copy of ``value`` with every secret replaced by ``"[secret]"`` and unknowns by ``"[unknown]"``."""
    if is_secret(value):
        return REDACTED
    if isinstance(value, Mapping):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if value == UNKNOWN or isinstance(value, Unknown):
        return "[unknown]"
    return value


def unwrap(value: Any) -> Any:
    """A copy of ``value`` with secret envelopes replaced by their plain values and unknowns by
    ``"[unknown]"``, so two plans compare equal when they would register the same thing (for assertions only)."""
    if is_secret(value):
        return unwrap(value["value"])
    if isinstance(value, Mapping):
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [unwrap(v) for v in value]
    if value == UNKNOWN or isinstance(value, Unknown):
        return "[unknown]"
    return value


def _urn_of(ref: str) -> str:
    # Provider references are "<urn>::<id>".
    return ref.rsplit("::", 1)[0] if ref else ""


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
    """(level, message) for every pulumi.log call."""
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


def _timeouts(request: Any) -> dict[str, str]:
    if not request.HasField("customTimeouts"):
        return {}
    t = request.customTimeouts
    return {k: v for k, v in (("create", t.create), ("update", t.update), ("delete", t.delete)) if v}


class DuplicateUrnError(Exception):
    """Two resources registered the same URN (same type chain and name); the engine refuses that too."""

    def __init__(self, urn: str) -> None:
        self.urn = urn
        super().__init__(f"Duplicate resource URN '{urn}'; try giving it a unique name")


class RecordingMocks(pulumi.runtime.Mocks):
    """Mocks that echo inputs as outputs, with hooks to add provider-computed outputs and invoke results.

    ``resource_outputs`` maps a type token to a function of the mock args returning extra outputs;
    ``invokes`` maps a function token to a function of its args returning its result.
    """

    def __init__(
        self,
        resource_outputs: Mapping[str, ResourceHook] | None = None,
        invokes: Mapping[str, InvokeHook] | None = None,
    ) -> None:
        self.resource_outputs = dict(resource_outputs or {})
        self.invokes = dict(invokes or {})

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        state = dict(args.inputs)
        hook = self.resource_outputs.get(args.typ)
        if hook is not None:
            state.update(hook(args))
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        hook = self.invokes.get(args.token)
        if hook is None:
            raise NotImplementedError(f"no mock result for invoke {args.token}; pass invokes={{...}}")
        # An empty failure list, not None: the mock monitor iterates it.
        return dict(hook(args.args)), []


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """A MockMonitor that also records parents, providers, dependencies, options, invokes and outputs."""

    def __init__(self, mocks: RecordingMocks, recording: Recording) -> None:
        super().__init__(mocks)
        self.recording = recording
        self.urns: set[str] = set()

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
        if response.urn in self.urns:
            # The engine refuses it (pkg/engine: TestDuplicateURN); the mock monitor alone would accept it. Raised by
            # run() once the program has settled: failing this RPC would leave the SDK's futures half-resolved.
            self.recording.duplicate_urns.append(response.urn)
        self.urns.add(response.urn)
        state = self.resources.get(response.urn)
        self.recording.resources.append(
            RecordedResource(
                type=request.type,
                name=request.name,
                urn=response.urn,
                parent=request.parent,
                custom=bool(request.custom),
                provider=_urn_of(request.provider),
                dependencies=list(request.dependencies),
                property_dependencies={k: list(v.urns) for k, v in request.propertyDependencies.items()},
                inputs=rpc.deserialize_properties(request.object, keep_unknowns=True),
                protect=bool(request.protect),
                ignore_changes=list(request.ignoreChanges),
                replace_on_changes=list(request.replaceOnChanges),
                additional_secret_outputs=list(request.additionalSecretOutputs),
                delete_before_replace=bool(request.deleteBeforeReplace),
                retain_on_delete=bool(request.retainOnDelete),
                replace_with=list(request.replace_with),
                aliases=[_alias(a) for a in request.aliases],
                id=response.id,
                custom_timeouts=_timeouts(request),
                outputs=dict(state.state) if state is not None else {},
            )
        )
        return response

    def RegisterResourceOutputs(self, request: Any) -> Any:
        outputs = rpc.deserialize_properties(request.outputs, keep_unknowns=True)
        for r in self.recording.resources:
            if r.urn == request.urn:
                r.outputs = dict(outputs)
        return super().RegisterResourceOutputs(request)  # type: ignore[no-untyped-call]

    def Invoke(self, request: Any) -> Any:
        self.recording.invokes.append(
            RecordedInvoke(
                token=request.tok,
                args=rpc.deserialize_properties(request.args),
                provider=_urn_of(request.provider),
            )
        )
        return super().Invoke(request)  # type: ignore[no-untyped-call]


class _ListHandler(logging.Handler):
    def __init__(self, sink: list[tuple[str, str]]) -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append((record.levelname.lower(), record.getMessage()))


def _alias(alias: Any) -> dict[str, Any]:
    spec = alias.spec
    out: dict[str, Any] = {"name": spec.name, "type": spec.type}
    return out | {f: getattr(spec, f) for f in ("parentUrn", "noParent") if spec.HasField(f)}


def _config_value(value: Any) -> str:
    # Pulumi hands config to programs as strings; structured values are JSON (what `pulumi config set --path`
    # and YAML objects in Pulumi.<stack>.yaml become).
    return value if isinstance(value, str) else json.dumps(value)


def _default_mocks(config: Mapping[str, Any] | None) -> RecordingMocks:
    """Recording mocks; when ``config`` holds a valid cluster spec, ``get_pci`` answers like its hosts."""
    raw = (config or {}).get("proxmox-gpu-cluster:cluster")
    if isinstance(raw, str):
        raw = json.loads(raw)
    try:
        spec = load_spec(raw)
    except SpecError:
        return RecordingMocks()
    return RecordingMocks(invokes=pci_invokes(spec))


def run(
    program: Callable[[], object],
    *,
    project: str = "proxmox-gpu-cluster",
    stack: str = "test",
    config: Mapping[str, Any] | None = None,
    secret_keys: Sequence[str] = (),
    mocks: RecordingMocks | None = None,
    preview: bool = True,
    recording: Recording | None = None,
) -> Recording:
    """Run ``program`` under Pulumi's mock engine and return what it registered.

    ``config`` keys are full names (``project:key``); non-string values are passed as JSON, as the CLI does.
    Exceptions the program raises (for example ``pulumi.RunError``) propagate after the engine settles.
    Pass ``recording`` to keep what registered even when the program raises. Without ``mocks``, ``get_pci``
    answers with hosts shaped like the spec in ``config`` (see ``pci_invokes``).
    """
    recording = recording if recording is not None else Recording()
    mocks = mocks or _default_mocks(config)
    logger = logging.getLogger(f"{__name__}.{id(recording)}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = _ListHandler(recording.logs)
    logger.addHandler(handler)
    pulumi.runtime.set_all_config(
        {k: _config_value(v) for k, v in (config or {}).items()}, secret_keys=list(secret_keys)
    )
    ROOT.set(None)  # a fresh root stack per run, so several runs in one process stay independent
    monitor = RecordingMonitor(mocks, recording)
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=preview, logger=logger, monitor=monitor)

    def body() -> None:
        program()

    try:
        _sync_await(run_pulumi_func(body))
        if recording.duplicate_urns:
            raise DuplicateUrnError(recording.duplicate_urns[0])
        root = ROOT.get()
        if root is not None:
            # The mock engine finishes the root stack before the program runs, so exports never reach
            # RegisterResourceOutputs; read them from the stack object instead.
            recording.stack.outputs = {k: _resolve(v) for k, v in getattr(root, "outputs", {}).items()}
    finally:
        logger.removeHandler(handler)
    return recording


def _resolve(value: Any) -> Any:
    """An exported value, resolved; secrets stay wrapped in an envelope so ``redact`` hides them."""
    output = pulumi.Output.from_input(value)
    plain = _sync_await(output.future(with_unknowns=True))
    if _sync_await(output.is_secret()):
        return {SECRET_SIG: SECRET_VALUE, "value": plain}
    return plain
