"""MIG placement: real placements, not slice sums."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.mig import geometry_problems, place

A100 = CATALOG["A100-PCIE-40GB"]
A30 = CATALOG["A30"]


@pytest.mark.parametrize(
    ("geometry", "fits"),
    [
        ({"4g.20gb": 2}, False),  # 8 slices on paper, but both would have to start at slice 0
        ({"4g.20gb": 1, "3g.20gb": 1}, True),
        ({"1g.5gb": 7}, True),
        ({"1g.5gb": 8}, False),
        ({"3g.20gb": 2}, True),
        ({"3g.20gb": 2, "1g.5gb": 1}, False),
        ({"2g.10gb": 3, "1g.5gb": 1}, True),
        ({"1g.10gb": 4}, True),
        ({"1g.10gb": 3, "1g.5gb": 2}, True),
        ({"7g.40gb": 1}, True),
        ({"7g.40gb": 1, "1g.5gb": 1}, False),
        ({"4g.20gb": 1, "2g.10gb": 1, "1g.5gb": 1}, True),
        ({"4g.20gb": 1, "1g.10gb": 2}, True),
        ({"3g.20gb": 1, "2g.10gb": 2, "1g.5gb": 1}, False),  # 2g.10gb cannot start at 6
        ({}, True),
    ],
)
def test_a100_40gb_placements(geometry: dict[str, int], fits: bool) -> None:
    assert (place(A100, geometry) is not None) is fits


def test_placement_reports_start_slices() -> None:
    assert place(A100, {"4g.20gb": 1, "3g.20gb": 1}) == {"3g.20gb": [4], "4g.20gb": [0]}
    assert place(A100, {"1g.5gb": 7}) == {"1g.5gb": [0, 1, 2, 3, 4, 5, 6]}


@pytest.mark.parametrize(
    ("geometry", "fits"),
    [
        ({"1g.6gb": 4}, True),
        ({"2g.12gb": 2}, True),
        ({"2g.12gb": 1, "1g.6gb": 2}, True),
        ({"4g.24gb": 1, "1g.6gb": 1}, False),
    ],
)
def test_a30_placements(geometry: dict[str, int], fits: bool) -> None:
    assert (place(A30, geometry) is not None) is fits


def test_geometry_problem_messages() -> None:
    assert geometry_problems(A100, {"4g.20gb": 1, "3g.20gb": 1}) == []
    assert "cannot be placed" in geometry_problems(A100, {"3g.20gb": 1, "4g.20gb": 1, "1g.5gb": 1})[0]
    assert "has no MIG profile '1g.6gb'" in geometry_problems(A100, {"1g.6gb": 1})[0]
    assert "at most 7" in geometry_problems(A100, {"1g.5gb": 8})[0]
    assert "only one +me" in geometry_problems(A30, {"1g.6gb+me": 1, "2g.12gb+me": 1})[0]
    assert geometry_problems(CATALOG["A10"], {"1g.5gb": 1}) == ["A10 does not support MIG"]


def _slice_fits_by_brute_force(geometry: dict[str, int]) -> bool:
    """Independent oracle: try every assignment of starts (small grids only)."""
    from itertools import product

    mig = A100.mig
    assert mig is not None
    instances = [mig.profile(n) for n, c in geometry.items() for _ in range(c)]
    if sum(p.compute_slices for p in instances if p) > mig.compute_slices:
        return False
    for starts in product(*[p.starts for p in instances if p]):
        used = [0] * mig.memory_slices
        ok = True
        for p, s in zip(instances, starts, strict=True):
            assert p is not None
            for k in range(s, s + p.memory_slices):
                used[k] += 1
                ok = ok and used[k] == 1
        if ok:
            return True
    return False


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
                       st.integers(1, 4), max_size=4))  # fmt: skip
def test_search_agrees_with_brute_force(geometry: dict[str, int]) -> None:
    assert (place(A100, geometry) is not None) == _slice_fits_by_brute_force(geometry)
