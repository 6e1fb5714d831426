"""Building blocks shared by the spec models: the strict base model, field types and their validators. Pure."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from components.catalog import CATALOG

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
PCI_PATH = r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}$"
VENDOR_DEVICE = r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$"
EXTENDED_RESOURCE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


class SpecModel(BaseModel):
    """Base for every spec model: immutable, no unknown keys, camelCase keys only."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
        str_strip_whitespace=True,
    )


def known_model(key: str) -> str:
    if key not in CATALOG:
        raise ValueError(f"unknown GPU model {key!r}; known: {', '.join(CATALOG)}")
    return key


def check_pci_path(value: str) -> str:
    if not re.fullmatch(PCI_PATH, value):
        raise ValueError(f"expected a PCI path domain:bus:device without function, like 0000:41:00; got {value!r}")
    return value.lower()


def check_vendor_device(value: str) -> str:
    if not re.fullmatch(VENDOR_DEVICE, value):
        raise ValueError(f"expected a PCI vendor:device id like 10de:20f1; got {value!r}")
    return value.lower()


def ip_or_cidr(value: str) -> str:
    if value == "dhcp":
        return value
    try:
        ipaddress.IPv4Interface(value)
    except ValueError:
        raise ValueError(f"expected 'dhcp' or an IPv4 address with prefix like 10.0.0.5/24, got {value!r}") from None
    if "/" not in value:
        raise ValueError(f"static address needs a prefix length (e.g. {value}/24)")
    return value


def ip(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"not an IP address: {value!r}") from None
    return value


Name = Annotated[str, Field(pattern=DNS_LABEL, description="A lower-case DNS label (RFC 1123).")]
GpuModelKey = Annotated[str, AfterValidator(known_model)]
IpAddress = Annotated[str, AfterValidator(ip)]
DriverBranch = Annotated[str, Field(pattern=r"^\d{3}$")]
"""An NVIDIA driver branch, e.g. ``580``."""
DriverVersion = Annotated[str, Field(pattern=r"^\d{3}\.\d{1,3}(\.\d{1,3})?$")]
"""An exact NVIDIA driver version, e.g. ``580.95.05``."""
ToolkitVersion = Annotated[str, Field(pattern=r"^\d+\.\d+\.\d+(~rc\.\d+)?-\d+$")]
"""An apt version of the NVIDIA Container Toolkit packages, e.g. ``1.18.2-1``."""
DEFAULT_TOOLKIT_VERSION = "1.18.2-1"
VgpuType = Annotated[str, Field(pattern=r"^[A-Z0-9]+-\d+[QCBA]$")]
"""An NVIDIA vGPU type: board prefix, framebuffer GB and series, e.g. ``A10-24Q``."""
ApiEndpoint = Annotated[str, Field(pattern=r"^[A-Za-z0-9.-]+:\d{1,5}$")]
"""A Kubernetes API server host:port."""


def on_branch(version: str | None, branch: str) -> bool:
    """Whether ``version`` (None: any) belongs to driver ``branch``."""
    return version is None or version.split(".")[0] == branch


MigConfig = str | dict[str, int]
"""A named operator MIG config (``all-1g.5gb``) or a custom geometry ``{profile: count}`` for one GPU."""
