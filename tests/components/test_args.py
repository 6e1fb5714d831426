"""ComponentArgs: every problem of a component's args at once, as one RunError naming each path."""

from __future__ import annotations

import pulumi
import pytest
from pydantic import Field, model_validator

from proxmox_gpu_cluster.args import ComponentArgs, Input
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations
from proxmox_gpu_cluster.errors import InvalidComponentArgs


class ExampleArgs(ComponentArgs):
    count: int = Field(ge=0, description="How many.")
    host: Input[str] = Field(description="An address, maybe from another resource.")

    @model_validator(mode="after")
    def _cross(self) -> ExampleArgs:
        if self.count == 3:
            raise SpecViolations([Problem("count", "three is not allowed")])
        return self


def test_inputs_take_plain_values_and_outputs() -> None:
    assert ExampleArgs(count=1, host="10.0.0.1").host == "10.0.0.1"
    output = pulumi.Output.from_input("10.0.0.2")
    assert ExampleArgs(count=1, host=output).host is output


@pytest.mark.parametrize(
    ("values", "lines"),
    [
        ({"count": -1, "host": "h", "extra": 1},
         ["ExampleArgs.count: Input should be greater than or equal to 0",
          "ExampleArgs.extra: unknown field (check the spelling)"]),
        ({"count": 3, "host": "h"}, ["ExampleArgs.count: three is not allowed"]),
        ({"count": "x"}, ["ExampleArgs.count: Input should be a valid integer, unable to parse string as an integer",
                          "ExampleArgs.host: required field is missing"]),
        ({"count": 1, "host": 5}, ["ExampleArgs.host: Input should be a valid string"]),
    ],
)  # fmt: skip
def test_every_problem_at_once_as_a_run_error(values: dict[str, object], lines: list[str]) -> None:
    with pytest.raises(InvalidComponentArgs) as err:
        ExampleArgs(**values)  # type: ignore[arg-type]
    assert isinstance(err.value, pulumi.RunError)
    assert err.value.lines == lines
    assert err.value.__cause__ is None and err.value.__suppress_context__  # no pydantic traceback chained


class OuterArgs(ComponentArgs):
    inner: ExampleArgs = Field(description="A nested args model.")


def test_a_nested_args_model_reports_through_the_outermost_with_its_path() -> None:
    with pytest.raises(InvalidComponentArgs) as err:
        OuterArgs(inner={"count": 3, "host": "h"})  # type: ignore[arg-type]
    assert err.value.lines == ["OuterArgs.inner.count: three is not allowed"]
    with pytest.raises(InvalidComponentArgs) as err:
        OuterArgs(inner={"count": -1})  # type: ignore[arg-type]
    assert err.value.lines == [
        "OuterArgs.inner.count: Input should be greater than or equal to 0",
        "OuterArgs.inner.host: required field is missing",
    ]
