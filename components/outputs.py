"""Small helpers for Pulumi outputs shared by the components."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import pulumi

T = TypeVar("T")


def item(mapping: pulumi.Input[Mapping[str, T]], key: str) -> pulumi.Output[T]:
    """``mapping[key]`` of a mapping that may not be known yet (it keeps the mapping's dependencies)."""
    return pulumi.Output.from_input(mapping).apply(lambda m: m[key])
