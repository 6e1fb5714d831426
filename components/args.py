"""The base of every component's ``*Args``: one validation, whichever door a value comes through.

A component is called ``Component(name, ComponentArgs(...), opts)``. Its args class validates what it is given as
strictly as the stack file is validated, through the same rule functions (``proxmox_gpu_cluster.core``), and all
at once: a bad value never surfaces as a ``KeyError``, ``TypeError`` or pydantic traceback, but as one
``InvalidComponentArgs`` (a ``pulumi.RunError``, which the Pulumi CLI prints without a traceback) with one line
per problem, each naming the path in the caller's own terms (``GpuQuotasArgs.quotas[1].gpus: ...``).

Resources (providers, what a component waits for) never go into args: providers and dependencies come through
``opts`` like any Pulumi resource's. Values a caller gets from other resources (addresses, vmids, namespaces)
are ``pulumi.Input`` fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import pulumi
from pydantic import BaseModel, ConfigDict, ValidationError, ValidatorFunctionWrapHandler, WrapValidator

from proxmox_gpu_cluster.core.python_door import record_stand_in
from proxmox_gpu_cluster.core.spec_base import python_problems
from proxmox_gpu_cluster.errors import InvalidComponentArgs

__all__ = ["ComponentArgs", "Input"]

if TYPE_CHECKING:
    from pulumi import Input
else:

    def _unless_output(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return value if isinstance(value, pulumi.Output) else handler(value)

    class Input:
        """``Input[T]`` in an args field: what type checkers read as ``pulumi.Input[T]``; pydantic validates a plain
        value as a ``T`` and takes a ``pulumi.Output`` (whose value is not known yet) as it is. pulumi.Input itself
        names its Output by a forward reference pydantic cannot resolve."""

        def __class_getitem__(cls, item: Any) -> Any:
            return Annotated[item, WrapValidator(_unless_output)]


class ComponentArgs(BaseModel):
    """Immutable, no unknown fields, Python field names only (no aliases: the one spelling mypy with and without
    the pydantic plugin and pyright all accept). Spec models inside keep their own rules; their problems come out
    with the field's path in front."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        arbitrary_types_allowed=True,  # pulumi.Output and other SDK types in Input fields
        loc_by_alias=False,  # paths in the caller's terms: the Python field names
        validate_by_name=True,
        validate_by_alias=False,
    )

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            # One RunError with every problem, without the chained pydantic traceback; paths in field names, spec
            # models inside included (pydantic reports their fields by their stack-file keys).
            # Each list item named after its object (``quotas[1] (team-a).gpus``); inside collect_problems() the
            # problems are recorded and raised with the block's others instead.
            model = type(self)
            problems = python_problems(model, err, data)
            if not record_stand_in(self, model.__name__, problems, data):
                raise InvalidComponentArgs(model.__name__, problems) from None

    # Marked as pydantic marks BaseModel.__init__: with a custom __init__ pydantic would validate a nested args
    # model given as a dict by calling it (its ``custom_init``), so the nested model would raise its own error at
    # its own root instead of leaving the problem, with its path, to the outermost args.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]
