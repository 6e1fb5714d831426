"""Building blocks shared by the spec models: the strict base model, field types and their validators. Pure."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, Self, TypeVar, get_args
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    GetJsonSchemaHandler,
    ModelWrapValidatorHandler,
    Tag,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from proxmox_gpu_cluster.core.catalog import CATALOG
from proxmox_gpu_cluster.core.errors import Problem, SpecViolations, invalid_spec_model, problems_from_validation_error
from proxmox_gpu_cluster.core.net_checks import DNS_NAME, check_api_endpoint, check_host, check_ip
from proxmox_gpu_cluster.core.python_door import named_path, object_name, record_stand_in, stand_in_problems
from proxmox_gpu_cluster.core.quoting import LINE_BREAKERS, shown

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
PCI_PATH = r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}$"
VENDOR_DEVICE = r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$"
EXTENDED_RESOURCE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


_Init = TypeVar("_Init", bound=Callable[..., None])
M = TypeVar("M", bound=BaseModel)


def _validates_nested_without_init(init: _Init) -> _Init:
    """Mark an ``__init__`` the way pydantic marks ``BaseModel.__init__``: with a custom ``__init__`` pydantic
    would otherwise validate every nested dict by calling it (its ``custom_init``), so a nested model would raise
    its own error at its own root instead of leaving the problem, with its path, to the outermost model."""
    setattr(init, "__pydantic_base_init__", True)  # noqa: B010 - a function attribute pydantic reads
    return init


class SpecModel(BaseModel):
    """Base for every spec model: immutable, no unknown keys; camelCase keys in YAML, field names in Python.

    No field takes ``Field(alias=...)``: type checkers that read pydantic's ``dataclass_transform`` (pyright, mypy
    without the pydantic plugin) name that ``__init__`` parameter after the alias, the plugin (``validate_by_name``)
    after the field, so no spelling would pass both. A key that is not plain camelCase comes from ``camel_alias``."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=True,  # Python callers use field names; load_spec refuses them in YAML (by_name=False)
        serialize_by_alias=True,
        str_strip_whitespace=True,
    )

    @_validates_nested_without_init
    def __init__(self, /, **data: Any) -> None:
        """Built from Python: every problem at once as one ``InvalidSpecModel`` (``<Model> (<name>).<path>:
        message``, paths in field names, each list item followed by its name; a ``pulumi.RunError`` too under
        Pulumi), without pydantic's chained traceback. Only the outermost model converts: pydantic validates nested
        values without calling ``__init__``, and ``load_spec`` keeps its ``cluster.<camelCase path>`` lines. Inside
        ``collect_problems()`` a bad model records its problems instead of raising (``core/python_door.py``)."""
        try:
            super().__init__(**data)
        except ValidationError as err:
            problems = python_problems(type(self), err, data)
            if not record_stand_in(self, _root(type(self), data), problems, data):
                raise invalid_spec_model(_root(type(self), data), problems) from None

    @classmethod
    def model_validate(
        cls,
        obj: Any,
        *,
        strict: bool | None = None,
        extra: Literal["allow", "ignore", "forbid"] | None = None,
        from_attributes: bool | None = None,
        context: Any | None = None,
        by_alias: bool | None = None,
        by_name: bool | None = None,
    ) -> Self:
        """pydantic's ``model_validate``, with the problems as the constructor reports them: every one at once as
        one ``InvalidSpecModel`` (the library's error type), never a ``ValidationError`` traceback. A stack file
        goes through ``load_spec`` / ``load_model`` instead (camelCase keys only, ``cluster.<path>`` lines)."""
        try:
            return super().model_validate(
                obj, strict=strict, extra=extra, from_attributes=from_attributes, context=context,
                by_alias=by_alias, by_name=by_name,
            )  # fmt: skip
        except ValidationError as err:
            data = obj if isinstance(obj, Mapping) else {}
            raise invalid_spec_model(_root(cls, data), python_problems(cls, err, data)) from None

    @model_validator(mode="wrap")
    @classmethod
    def _no_stand_in(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        # A stand-in (a bad model built inside collect_problems) given to this model: its problems are this
        # model's, under the field it was given for. pydantic runs wrap validators for instances too.
        problems = stand_in_problems(data)
        if problems is not None:
            raise SpecViolations(problems)
        return handler(data)


def validate_stack_data(model: type[M], data: Any) -> M:
    """``model`` from stack-file data (camelCase keys only), raising pydantic's ``ValidationError`` for the
    stack-file loaders to report (``load_spec``, ``stacks.config.parse_model``)."""
    return BaseModel.model_validate.__func__(model, data, by_alias=True, by_name=False)  # type: ignore[attr-defined,no-any-return]


def python_problems(model: type[BaseModel], err: ValidationError, data: Any) -> list[Problem]:
    """The problems of ``model`` built from Python ``data``: paths in field names, items named
    (``workers[2] (gpu-a10-c).memory_mib``)."""
    problems = problems_from_validation_error(err, python=True)
    return [Problem(named_path(field_path(model, p.path), data), p.message) for p in problems]


def _root(model: type[BaseModel], data: Any) -> str:
    name = object_name(data)
    return f"{model.__name__} ({name})" if name else model.__name__


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds (itself, or inside ``X | None`` / ``Annotated``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for arg in get_args(annotation) if (m := _model_in(arg)) is not None), None)


def _item(annotation: Any) -> Any:
    """The type of an item (``[i]``) of a tuple, list or mapping annotation, through ``Annotated`` and ``| None``."""
    for arg in (annotation, *get_args(annotation)):
        args = [a for a in get_args(arg) if a is not Ellipsis and a is not type(None)]
        origin = getattr(arg, "__origin__", None)
        if origin in (tuple, list, frozenset, set) and args:
            return args[0]
        if origin is dict and len(args) == 2:  # key and value
            return args[1]
    return None


def field_path(model: type[BaseModel], path: str) -> str:
    """``path`` (keys as the stack file spells them, e.g. ``gpus[0].timeSlicing``) in ``model``'s Python field
    names (``gpus[0].time_slicing``); a part no field matches is kept as it is."""
    current: Any = model
    out = ""
    for token in re.findall(r"\[[^\]]*\]|[^.\[]+", path):
        if token.startswith("["):
            out += token
            current = _item(current)
            continue
        owner = _model_in(current)
        fields = owner.model_fields.items() if owner is not None else ()
        found = next(((n, f) for n, f in fields if token in (n, f.alias)), None)
        name, current = (found[0], found[1].annotation) if found is not None else (token, None)
        out += f".{name}" if out else name
    return out


def camel_alias(**keys: str) -> Callable[[str], str]:
    """An alias generator: ``to_camel``, except the stack-file keys given by field name (``memory_mib="memoryMiB"``).
    For a model's ``model_config = ConfigDict(alias_generator=...)``; it changes the YAML key, never the Python name."""

    def alias(name: str) -> str:
        return keys.get(name) or to_camel(name)

    return alias


def with_string_shorthand(
    core_schema: CoreSchema, handler: GetJsonSchemaHandler, shorthand: JsonSchemaValue
) -> JsonSchemaValue:
    """The JSON Schema of a model whose ``mode="before"`` validator also takes a plain string: either form, so an
    editor accepts what the loader accepts. For a model's ``__get_pydantic_json_schema__``."""
    full = dict(handler.resolve_ref_schema(handler(core_schema)))
    description = full.pop("description", None)
    return {**({"description": description} if description else {}), "anyOf": [shorthand, full]}


def known_model(key: str) -> str:
    if key not in CATALOG:
        raise ValueError(f"unknown GPU model {shown(key)}; known: {', '.join(CATALOG)}")
    return key


def check_pci_path(value: str) -> str:
    if not re.fullmatch(PCI_PATH, value):
        raise ValueError(f"expected a PCI path domain:bus:device without function, like 0000:41:00; got {shown(value)}")
    return value.lower()


def check_vendor_device(value: str) -> str:
    if not re.fullmatch(VENDOR_DEVICE, value):
        raise ValueError(f"expected a PCI vendor:device id like 10de:20f1; got {shown(value)}")
    return value.lower()


INSTALLER_IMAGE = re.compile(r"\.iso(\.(gz|xz|bz2|zst))?$", re.IGNORECASE)


def check_cloud_image(value: str) -> str:
    """Not an installer ISO: the VM boots the image as its disk, and an installer waits at its first screen."""
    if INSTALLER_IMAGE.search(urlsplit(value).path):
        raise ValueError(
            "an installer ISO, not a cloud image (the VM would boot the installer); use a cloud image such as "
            "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"
        )
    return value


MAX_COUNT = 10_000


def check_count_or_percent(value: object) -> object:
    """A node count (1 to ``MAX_COUNT``) or a percentage ``N%`` (1% to 100%), with one message for either."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_COUNT:
        return value
    if isinstance(value, str) and re.fullmatch(r"(100|[1-9][0-9]?)%", value):
        return value
    shown = repr(value)[:40] if isinstance(value, str) else value if isinstance(value, int) else type(value).__name__
    raise ValueError(f"expected a count from 1 to {MAX_COUNT} or a percentage from 1% to 100%, got {shown}")


def no_bool(value: object) -> object:
    """Refuse booleans where a number is expected: YAML's ``true`` is not 1."""
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    return value


Name = Annotated[str, Field(pattern=DNS_LABEL, description="A lower-case DNS label (RFC 1123).")]
GpuModelKey = Annotated[str, AfterValidator(known_model), WithJsonSchema({"type": "string", "enum": list(CATALOG)})]
IpAddress = Annotated[str, AfterValidator(check_ip)]
DriverBranch = Annotated[str, Field(pattern=r"^[0-9]{3}$")]
"""An NVIDIA driver branch, e.g. ``580``."""
DriverVersion = Annotated[str, Field(pattern=r"^[0-9]{3}\.[0-9]{1,3}(\.[0-9]{1,3})?$")]
"""An exact NVIDIA driver version, e.g. ``580.95.05``."""
ToolkitVersion = Annotated[str, Field(pattern=r"^[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}(~rc\.[0-9]{1,4})?-[0-9]{1,4}$")]
"""An apt version of the NVIDIA Container Toolkit packages, e.g. ``1.18.2-1``."""
DEFAULT_TOOLKIT_VERSION = "1.18.2-1"
VGPU_TYPE = r"^[A-Z0-9]{1,16}-[0-9]{1,4}[QCBA]$"
VgpuType = Annotated[str, Field(pattern=VGPU_TYPE)]
"""An NVIDIA vGPU type: board prefix, framebuffer GB and series, e.g. ``A10-24Q``."""
ApiEndpoint = Annotated[str, AfterValidator(check_api_endpoint)]
"""A Kubernetes API server ``host:port`` or ``[IPv6]:port``."""
HostName = Annotated[str, AfterValidator(check_host)]
"""A DNS name or an IP address."""
Int = Annotated[int, BeforeValidator(no_bool)]
"""An integer that refuses booleans; every Int field also carries explicit bounds."""
StorageId = Annotated[str, Field(pattern=r"^[A-Za-z][-A-Za-z0-9_.]{0,98}[A-Za-z0-9]$")]
"""A Proxmox storage id (pve-common ``parse_id``: a letter first, letters, digits, ``-_.``, no trailing punctuation)."""
BridgeId = Annotated[str, Field(pattern=r"^[-_.A-Za-z0-9]{1,15}$")]
"""A Proxmox bridge (a Linux interface name: at most 15 characters)."""
DnsName = Annotated[str, Field(pattern=DNS_NAME, max_length=253)]
"""A DNS name, e.g. ``lab.internal``."""
Text = Annotated[str, Field(pattern=f"^[^{LINE_BREAKERS}]*$", max_length=1024)]
"""Free text on one line: no control or line-separator characters."""
CountOrPercent = Annotated[
    int | str,
    BeforeValidator(check_count_or_percent),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": MAX_COUNT},
                {"type": "string", "pattern": "^(100|[1-9][0-9]?)%$"},
            ]
        }
    ),
]
"""A node count or a percentage of the nodes (``25%``), as Kubernetes' int-or-string ``maxUnavailable``."""


def on_branch(version: str | None, branch: str) -> bool:
    """Whether ``version`` (None: any) belongs to driver ``branch``."""
    return version is None or version.split(".")[0] == branch


def _mig_kind(value: object) -> str:
    return "named" if isinstance(value, str) else "geometry"


MigConfig = Annotated[
    Annotated[str, Tag("named")] | Annotated[dict[str, Annotated[Int, Field(ge=0, le=64)]], Tag("geometry")],
    Discriminator(_mig_kind),
]
"""A named operator MIG config (``all-1g.5gb``) or a custom geometry ``{profile: count}`` for one GPU. The input's
shape picks the branch, so a bad geometry reports the geometry's problem, not also "not a string"."""
