"""Small helpers for Pulumi outputs and runtime facts shared by the components."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import pulumi

from proxmox_gpu_cluster.core.names import StackScope

T = TypeVar("T")


def item(mapping: pulumi.Input[Mapping[str, T]], key: str) -> pulumi.Output[T]:
    """``mapping[key]`` of a mapping that may not be known yet (it keeps the mapping's dependencies)."""
    return pulumi.Output.from_input(mapping).apply(lambda m: m[key])


def current_scope() -> StackScope:
    """The project and stack this program runs as (what names on Proxmox are scoped to)."""
    return StackScope(pulumi.get_project(), pulumi.get_stack())
