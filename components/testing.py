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

import gc
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pulumi
from pulumi import _types as pulumi_types
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import resource as pulumi_resource
from pulumi.runtime import rpc
from pulumi.runtime.settings import ROOT
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.recording import (
    REDACTED,
    SECRET_SIG,
    SECRET_VALUE,
    UNKNOWN,
    RecordedInvoke,
    RecordedResource,
    Recording,
    is_secret,
    redact,
    unwrap,
)
from proxmox_gpu_cluster.testing_pci import pci_invokes

ResourceHook = Callable[[pulumi.runtime.MockResourceArgs], Mapping[str, Any]]
InvokeHook = Callable[[Mapping[str, Any]], Mapping[str, Any]]

__all__ = [
    "REDACTED", "SECRET_SIG", "SECRET_VALUE", "UNKNOWN", "DuplicateUrnError", "InvokeHook", "RecordedInvoke",
    "RecordedResource", "Recording", "RecordingMocks", "RecordingMonitor", "ResourceHook", "is_secret", "redact",
    "run", "unwrap",
]  # fmt: skip


def _urn_of(ref: str) -> str:
    # Provider references are "<urn>::<id>".
    return ref.rsplit("::", 1)[0] if ref else ""


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
        self.urns: dict[str, RecordedResource] = {}
        # (kind, path) -> content hash: every machine's agent copy names the same few directories, and hashing one
        # again for each (a directory walk and a read of every file) was a fifth of a large plan.
        self.hashes: dict[tuple[str, str], str] = {}
        # Registrations arrive on several threads at once: without the lock, copies registered together each hash
        # the same directory before any stored its hash.
        self.hash_lock = threading.Lock()

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
        if response.urn in self.urns:
            # The engine refuses it (pkg/engine: TestDuplicateURN); the mock monitor alone would accept it. Raised by
            # run() once the program has settled: failing this RPC would leave the SDK's futures half-resolved.
            self.recording.duplicate_urns.append(response.urn)
        state = self.resources.get(response.urn)
        self.urns[response.urn] = recorded = RecordedResource(
            type=request.type,
            name=request.name,
            urn=response.urn,
            parent=request.parent,
            custom=bool(request.custom),
            provider=_urn_of(request.provider),
            dependencies=list(request.dependencies),
            property_dependencies={k: list(v.urns) for k, v in request.propertyDependencies.items()},
            inputs=_assets(rpc.deserialize_properties(request.object, keep_unknowns=True), self.hashes, self.hash_lock),
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
        self.recording.resources.append(recorded)
        return response

    def RegisterResourceOutputs(self, request: Any) -> Any:
        outputs = rpc.deserialize_properties(request.outputs, keep_unknowns=True)
        recorded = self.urns.get(request.urn)
        if recorded is not None:
            recorded.outputs = dict(outputs)
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


def _assets(value: Any, hashes: dict[tuple[str, str], str], lock: threading.Lock) -> Any:
    """``value`` with each file asset or archive as ``{"asset"|"archive": {"hash": ...}}``: the engine compares them
    by hash alone (pulumi sdk/go/common/resource/properties_diff.go), so the local path, which differs from one
    checkout to the next, is left out and the hash (sha256 over relative names and contents) is what a plan shows.
    ``hashes`` keeps each path's hash for the rest of the run (the files do not change while a program runs)."""
    if isinstance(value, dict):
        return {k: _assets(v, hashes, lock) for k, v in value.items()}
    if isinstance(value, list):
        return [_assets(v, hashes, lock) for v in value]
    if isinstance(value, (pulumi.FileArchive, pulumi.FileAsset)):
        kind = "archive" if isinstance(value, pulumi.FileArchive) else "asset"
        key = (kind, value.path)
        with lock:
            if key not in hashes:
                hashes[key] = _content_hash(Path(value.path))
            return {kind: {"hash": hashes[key]}}
    return value


def _content_hash(path: Path) -> str:
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        name = file.relative_to(path).as_posix() if path.is_dir() else file.name
        digest.update(f"{name}\0{file.stat().st_size}\0".encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def _alias(alias: Any) -> dict[str, Any]:
    spec = alias.spec
    out: dict[str, Any] = {"name": spec.name, "type": spec.type}
    return out | {f: getattr(spec, f) for f in ("parentUrn", "noParent") if spec.HasField(f)}


def _config_value(value: Any) -> str:
    # Pulumi hands config to programs as strings; structured values are JSON (what `pulumi config set --path`
    # and YAML objects in Pulumi.<stack>.yaml become).
    return value if isinstance(value, str) else json.dumps(value)


def _default_mocks(config: Mapping[str, Any] | None) -> RecordingMocks:
    """Recording mocks whose ``get_pci`` answers like the hosts of every valid cluster spec in ``config`` (each
    ``<namespace>:cluster`` key), and for a node none describes, without a device list: the preflight then checks
    the node as the program itself describes it (``pci_invokes``)."""
    specs = []
    for key, raw in (config or {}).items():
        if not key.endswith(":cluster"):
            continue
        try:
            specs.append(load_spec(json.loads(raw) if isinstance(raw, str) else raw))
        except (SpecError, ValueError):
            continue  # the program reports its own spec's problems
    return RecordingMocks(invokes=pci_invokes(specs))


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
    answers with hosts shaped like the specs in ``config`` (every ``<namespace>:cluster``), and for any other node
    the program preflights, as the program describes it (see ``pci_invokes``).
    """
    recording = recording if recording is not None else Recording()
    mocks = mocks or _default_mocks(config)
    logger = logging.getLogger(f"{__name__}.{id(recording)}")
    logger.propagate = False
    # Info and above: the SDK logs a debug line for every step of every resource, which nothing reads and which
    # cost a twentieth of a large plan to record.
    logger.setLevel(logging.INFO)
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

    # The SDK allocates a few dozen futures, tasks and closures per resource, all long-lived until the program
    # settles, so the collector's full passes rescan a growing heap and cost about a third of a 1000-worker plan
    # (benchmarks/plan_scale.py); nothing collectable piles up meanwhile, so collect once afterwards instead.
    collecting = gc.isenabled()
    gc.disable()
    restore_sdk = _lighter_sdk()
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
        restore_sdk()
        logger.removeHandler(handler)
        if collecting:
            gc.enable()
    return recording


def _lighter_sdk() -> Callable[[], None]:
    """Skip, until the returned function is called, three things the SDK does per resource that a mock run
    throws away (together about a quarter of a large plan's time):

    - the registering code's stack (``traceback.extract_stack``, then a file URI per frame), which the SDK sends
      for the engine to show source positions: the mock monitor reads none, so an empty stack goes instead;
    - its debug log lines (several per resource), which ``run`` records from info level up only;
    - the output types of the resource's class (``typing.get_type_hints`` over its annotations, for every
      instance): the same for every instance of a class, so worked out once per class and run.

    SDKs without one of these are left as they are."""
    undo: list[Callable[[], None]] = []

    def swap(module: Any, name: str, replacement: Any) -> None:
        original = getattr(module, name, None)
        if original is not None:
            setattr(module, name, replacement(original))
            undo.append(lambda: setattr(module, name, original))

    if hasattr(pulumi_resource, "_get_stack_trace"):
        from pulumi.runtime.proto import source_pb2  # noqa: PLC0415 (only SDKs that send stack traces have it)

        swap(pulumi_resource, "_get_stack_trace", lambda _: source_pb2.StackTrace)
    swap(pulumi.log, "debug", lambda _: _no_debug)
    swap(pulumi_types, "resource_types", _per_class)

    def restore() -> None:
        for step in reversed(undo):
            step()

    return restore


def _no_debug(*_: Any, **__: Any) -> None:
    """``pulumi.log.debug`` while a program runs under ``run``: its lines would be dropped below info level."""


def _per_class(resource_types: Callable[[type], dict[str, type]]) -> Callable[[type], dict[str, type]]:
    known: dict[type, dict[str, type]] = {}

    def types_of(cls: type) -> dict[str, type]:
        if cls not in known:
            known[cls] = resource_types(cls)
        return dict(known[cls])  # the SDK's own answer is a new dict each time

    return types_of


def _resolve(value: Any) -> Any:
    """An exported value, resolved; secrets stay wrapped in an envelope so ``redact`` hides them."""
    output = pulumi.Output.from_input(value)
    plain = _sync_await(output.future(with_unknowns=True))
    if _sync_await(output.is_secret()):
        return {SECRET_SIG: SECRET_VALUE, "value": plain}
    return plain
