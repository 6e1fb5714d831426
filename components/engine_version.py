"""The oldest Pulumi CLI (engine) the library runs under, and the check every component makes before it registers
anything.

Why 3.207.0: the components replace each machine's steps with the machine through the ``replaceWith`` resource
option (pulumi/pulumi#20693, first released in CLI 3.207.0). An older engine does not advertise the feature, and the
Python SDK then fails the registration of the first such resource ("The Pulumi CLI does not support the ReplaceWith
option", pulumi/runtime/resource.py), halfway through a program. Asking the engine once, up front, refuses the run
before anything registers, in one line.

The engine answers ``RequirePulumiVersion`` (proto/engine.proto) with an error naming its version when the range
does not match, and an engine older than that RPC answers UNIMPLEMENTED. Pulumi's mock engine
(``pulumi.runtime.set_mocks``) has no such RPC and no version, so under mocks nothing is checked.
"""

from __future__ import annotations

import grpc  # type: ignore[import-untyped]
import pulumi
from pulumi.runtime import settings
from pulumi.runtime.proto import engine_pb2

MINIMUM_CLI = "3.207.0"
"""The oldest Pulumi CLI the components run under (README, pyproject.toml's comment, tools/recipes/pulumi.sh)."""

_asked: list[object] = []
"""The engine already asked in this process: one RPC per program, however many components."""


class UnsupportedPulumiCli(pulumi.RunError):
    """The Pulumi CLI running the program is older than ``MINIMUM_CLI`` (a RunError: the CLI prints the message
    alone, without a traceback)."""


def require_cli() -> None:
    """Refuse, in one line, a Pulumi CLI older than ``MINIMUM_CLI``; nothing without a real engine (plain Python,
    Pulumi's mocks)."""
    engine = settings.get_engine()
    ask = getattr(engine, "RequirePulumiVersion", None)
    if ask is None or any(engine is seen for seen in _asked):
        return
    try:
        ask(engine_pb2.RequirePulumiVersionRequest(pulumi_version_range=f">={MINIMUM_CLI}"))
    except grpc.RpcError as err:
        code = err.code() if callable(getattr(err, "code", None)) else None
        if code == grpc.StatusCode.UNIMPLEMENTED:
            saw = "a CLI older than the version check itself"
        else:
            details = err.details() if callable(getattr(err, "details", None)) else None
            saw = " ".join(str(details or err).split())[:300]
        raise UnsupportedPulumiCli(
            f"proxmox-gpu-cluster needs the Pulumi CLI {MINIMUM_CLI} or later (the replaceWith resource option): "
            f"saw {saw}; update the CLI (https://www.pulumi.com/docs/install/)"
        ) from None
    _asked[:] = [engine]
