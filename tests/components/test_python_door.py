"""Specs and args built in Python: every problem at once, each naming its object, as the library's one error type
(``SpecError``; a ``pulumi.RunError`` too under Pulumi), through constructors, ``model_validate`` and
``collect_problems`` alike; never a pydantic traceback."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from proxmox_gpu_cluster.core.errors import SpecError
from proxmox_gpu_cluster.core.python_door import collect_problems
from proxmox_gpu_cluster.core.scheduling_spec import Quota
from proxmox_gpu_cluster.core.spec import ClusterSpec, load_spec
from proxmox_gpu_cluster.core.worker_spec import Worker
from proxmox_gpu_cluster.gpu.gpu_quota import GpuQuotasArgs
from tests.support import base_spec


def worker(i: int, **changes: Any) -> Worker:
    values: dict[str, Any] = {"name": f"gpu-a10-{'abcd'[i]}", "vmid": 300 + i, "node": "pve2", "gpus": ("a10-0",)}
    return Worker(**{**values, **changes})


def test_model_validate_reports_every_problem_as_the_librarys_error() -> None:
    raw = base_spec()
    raw["workers"] = [{**raw["workers"][0], "memoryMiB": 5}]  # the only worker fails: pydantic adds "too_short"
    raw["quotas"][0]["namespace"] = "Not A Label"
    with pytest.raises(SpecError) as err:
        ClusterSpec.model_validate(raw)
    assert not isinstance(err.value, ValidationError)
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert "ClusterSpec.workers[0] (mig-1).memory_mib: Input should be greater than or equal to 2048" in err.value.lines
    assert any(
        line.startswith("ClusterSpec.quotas[0] (") is False and ".namespace:" in line for line in err.value.lines
    )
    assert not [line for line in err.value.lines if "at least 1 item" in line]  # no bogus "workers" line


def test_model_validate_of_a_valid_spec_still_works_and_load_spec_keeps_stack_file_paths() -> None:
    assert ClusterSpec.model_validate(base_spec()) == load_spec(base_spec())
    raw = base_spec()
    raw["workers"][1]["memoryMiB"] = 5
    with pytest.raises(SpecError) as err:
        load_spec(raw)
    assert err.value.lines == ["cluster.workers[1].memoryMiB: Input should be greater than or equal to 2048"]


def test_a_bad_constructor_names_which_object() -> None:
    with pytest.raises(SpecError) as err:
        worker(2, memory_mib=5)
    assert err.value.lines == ["Worker (gpu-a10-c).memory_mib: Input should be greater than or equal to 2048"]


def test_every_mistake_of_a_block_at_once_each_naming_its_object() -> None:
    spec = load_spec(base_spec())
    with pytest.raises(SpecError) as err, collect_problems():
        workers = (worker(0), worker(1, cores=0), worker(2, memory_mib=5), worker(3, vmid=7))
        quota = Quota(namespace="team-a", gpus={"nvidia.com/gpu": -1})
        ClusterSpec(proxmox=spec.proxmox, kubernetes=spec.kubernetes, guest=spec.guest, workers=workers,
                    quotas=(quota,), gpu_operatr={})  # type: ignore[call-arg]  # fmt: skip
    lines = err.value.lines
    assert lines == [
        "ClusterSpec.gpu_operatr: unknown field (check the spelling)",
        *[line for line in lines if line.startswith("ClusterSpec.quotas[0]")],
        "ClusterSpec.workers[1] (gpu-a10-b).cores: Input should be greater than or equal to 1",
        "ClusterSpec.workers[2] (gpu-a10-c).memory_mib: Input should be greater than or equal to 2048",
        "ClusterSpec.workers[3] (gpu-a10-d).vmid: Input should be greater than or equal to 100",
    ]
    assert [line for line in lines if line.startswith("ClusterSpec.quotas[0]")]  # the quota's own problem too
    assert len(lines) == len(set(lines))  # each nested problem once, not again as its own model's


def test_a_block_without_a_whole_spec_reports_each_model() -> None:
    with pytest.raises(SpecError) as err, collect_problems():
        worker(0, memory_mib=5)
        Quota(namespace="BAD")  # type: ignore[call-arg]
    assert "Worker (gpu-a10-a).memory_mib: Input should be greater than or equal to 2048" in err.value.lines
    assert "Quota.resources: required field is missing" in err.value.lines
    assert any(line.startswith("Quota.namespace: String should match pattern") for line in err.value.lines)


def test_a_good_block_raises_nothing() -> None:
    with collect_problems():
        built = worker(0)
    assert built.name == "gpu-a10-a" and built.memory_mib > 0


def test_component_args_name_their_items_and_join_a_block() -> None:
    from proxmox_gpu_cluster.errors import InvalidComponentArgs

    with pytest.raises(InvalidComponentArgs) as args_err:
        GpuQuotasArgs(quotas=({"namespace": "team-a", "resources": {"nvidia.com/gpu": -1}},), capacity=())  # type: ignore[arg-type]
    assert any(line.startswith("GpuQuotasArgs.quotas[0].resources") for line in args_err.value.lines)
    with pytest.raises(SpecError) as err, collect_problems():
        GpuQuotasArgs(quotas=(Quota(namespace="team-a", resources={"nvidia.com/gpu": -1}),), capacity=())
    assert len(err.value.lines) == len(set(err.value.lines)) and err.value.lines


def test_a_hostile_name_is_not_echoed_into_the_path() -> None:
    with pytest.raises(SpecError) as err:
        ClusterSpec.model_validate({"workers": [{"name": "x" * 200_000, "memoryMiB": 5}]})
    assert all(len(line) < 400 for line in err.value.lines)
    assert "ClusterSpec.workers[0].memory_mib: Input should be greater than or equal to 2048" in err.value.lines
