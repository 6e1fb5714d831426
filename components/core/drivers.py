"""Concrete NVIDIA data-center driver versions the operator's driver container installs per branch. Pure data.

With ``driverMode: operator`` the chart installs ``driver.version``; leaving it to the chart's default would
change the driver whenever the chart is bumped (v25.10.1 ships 580.x, v26.7.0 595.x) and ignore the spec's
branch. So a branch always resolves to a version from this table, or the spec must pin ``driverVersion``.

Source: the ``driver.version`` each supported GPU Operator release pins in its chart (``values.yaml`` at the
release tag, kept in ``../shared/reference/gpu-operator/<tag>/``); a test checks every entry against it. Those are
the builds NVIDIA tested with that operator release.
"""

from __future__ import annotations

from types import MappingProxyType

OPERATOR_DRIVER_VERSIONS = MappingProxyType(
    {
        "580": "580.105.08",  # GPU Operator v25.10.1
        "595": "595.91.07",  # GPU Operator v26.7.0
    }
)
"""Driver branch -> the driver container version installed when the spec pins none."""


def operator_driver_version(branch: str, pinned: str | None) -> str | None:
    """The driver version the operator installs: the pinned one, else the table's for ``branch`` (None: unknown)."""
    return pinned or OPERATOR_DRIVER_VERSIONS.get(branch)
