"""Errors a component raises for arguments it cannot use, as ``pulumi.RunError`` (the CLI prints the message
without a traceback), one ``path: message`` line per problem like the spec's errors."""

from __future__ import annotations

from collections.abc import Iterable

import pulumi

from proxmox_gpu_cluster.core.errors import Problem, SpecError


class InvalidComponentArgs(SpecError, pulumi.RunError):
    """A component's arguments are unusable; ``lines`` holds ``<component>.<path>: <message>`` per problem. The
    library's one error type (a ``SpecError``, as a bad spec's), and a ``pulumi.RunError`` for the CLI."""

    def __init__(self, component: str, problems: Iterable[Problem]) -> None:
        SpecError.__init__(self, problems, root=component)
        self.args = (f"invalid arguments of {component}:\n" + "\n".join(self.lines),)
