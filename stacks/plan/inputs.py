"""What the offline plan reads besides the program: the stack file and ``--pci`` device lists, checked so that a
file it cannot use ends the plan with one clear line (exit 2) instead of a traceback."""

from __future__ import annotations

import datetime
import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from proxmox_gpu_cluster.stacks.stack_yaml import StackYamlError, load_stack_yaml, read_capped
from proxmox_gpu_cluster.testing_pci import API_FIELDS, GET_PCI

if TYPE_CHECKING:
    from proxmox_gpu_cluster.recording import Recording

PVESH_KEYS = API_FIELDS
"""The Proxmox API's snake-case PCI fields -> the provider's ``get_pci`` fields."""


class InputError(Exception):
    """A file given on the command line cannot be used; ``lines`` says why."""

    def __init__(self, line: str) -> None:
        self.lines = [line]
        super().__init__(line)


def read_inputs(path: Path, pci_args: Sequence[str]) -> tuple[Mapping[str, Any], dict[str, list[dict[str, Any]]]]:
    """The parsed stack file and the ``--pci NODE=FILE`` device lists (InputError when one is unusable)."""
    try:
        text = read_capped(path)
    except OSError as err:
        raise InputError(f"{path}: {err}") from None
    document = parse_stack_file(text, str(path))
    pci: dict[str, list[dict[str, Any]]] = {}
    for item in pci_args:
        node, _, file = item.partition("=")
        try:
            pci[node] = read_pci_file(Path(file))
        except (OSError, ValueError, RecursionError) as err:
            raise InputError(f"--pci {item}: {err}") from None
    return document, pci


def parse_stack_file(text: bytes | str, origin: str) -> Mapping[str, Any]:
    """A stack file's YAML as the plan can use it (InputError naming ``origin`` otherwise)."""
    try:
        document = load_stack_yaml(text, origin) or {}
    except StackYamlError as err:
        raise InputError(err.line) from None
    if not isinstance(document, Mapping):
        raise InputError(f"{origin}: expected a YAML mapping with a 'config' key")
    config = document.get("config")
    if config is not None and not isinstance(config, Mapping):
        raise InputError(f"{origin}: config: expected a mapping of config keys, got {_kind(config)}")
    problem = _non_json(config or {}, "config")
    if problem is not None:
        raise InputError(f"{origin}: {problem}")
    return document


def stack_file_at(ref: str, path: Path) -> Mapping[str, Any]:
    """The stack file ``path`` as it is in git at ``ref`` (``--diff-base``)."""
    if ref.startswith("-"):
        raise InputError(f"--diff-base {ref}: expected a git revision")
    proc = subprocess.run(
        ["git", "-C", str(path.parent), "show", f"{ref}:./{path.name}"], capture_output=True, check=False
    )
    if proc.returncode:
        said = proc.stderr.decode(errors="replace").strip().splitlines() or [f"git exited with {proc.returncode}"]
        raise InputError(f"--diff-base {ref}: {path.name}: {said[-1]}")
    return parse_stack_file(proc.stdout, f"{ref}:{path.name}")


def read_pci_file(path: Path) -> list[dict[str, Any]]:
    """A node's PCI device list as ``get_pci`` returns it, from the JSON of
    ``pvesh get /nodes/<node>/hardware/pci --pci-class-blacklist "" --output-format json`` (the API's own
    field names) or a list already in the provider's spelling. ValueError when it is neither, or when a device
    lacks its ids or an integer IOMMU group."""
    data = json.loads(path.read_text())
    if not isinstance(data, list) or not all(isinstance(d, dict) and "id" in d for d in data):
        raise ValueError("expected a JSON list of PCI devices with an 'id' each (pvesh ... --output-format json)")
    devices = [{PVESH_KEYS.get(k, k): v for k, v in d.items()} for d in data]
    for device in devices:
        where = f"device {str(device['id'])[:40]!r}"
        for key in ("vendor", "device", "class"):
            if not isinstance(device.get(key), str):
                raise ValueError(f"{where}: {key} is {_kind(device.get(key))}, expected a hex string like 0x10de")
        group = device.get("iommuGroup")
        if isinstance(group, bool) or not isinstance(group, int):
            raise ValueError(f"{where}: iommugroup is {_kind(group)}, expected an integer (-1 when the IOMMU is off)")
    return devices


def _kind(value: Any) -> str:
    return "missing" if value is None else f"a {type(value).__name__} ({repr(value)[:40]})"


_JSON_SCALARS = (str, int, float, bool, type(None))


def _non_json(value: Any, path: str) -> str | None:
    """Why ``value`` cannot be handed to the program as Pulumi config (which is JSON), or None."""
    if isinstance(value, (datetime.date, datetime.datetime)):
        return f"{path}: a YAML date ({value}); quote it if you mean the text"
    if isinstance(value, (bytes, bytearray)):
        return f"{path}: YAML binary data; config values are text, numbers, booleans, lists or mappings"
    if isinstance(value, Mapping):
        bad_key = next((k for k in value if not isinstance(k, str)), None)
        if bad_key is not None:
            return f"{path}: key {bad_key!r} is {_kind(bad_key)}; config keys are text (quote it)"
        children = [(f"{path}.{k}", v) for k, v in value.items()]
    elif isinstance(value, list):
        children = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    elif isinstance(value, _JSON_SCALARS):
        children = []
    else:
        return f"{path}: {_kind(value)} is not a config value"
    return next((p for child_path, child in children if (p := _non_json(child, child_path))), None)


@dataclass(frozen=True)
class Program:
    """A Pulumi program to plan: its entry file and project name."""

    main: Path
    project: str

    @property
    def directory(self) -> Path:
        """The project directory (where Pulumi.yaml and the stack files are)."""
        return self.main.parent


def find_program(main: Path | None) -> Program:
    """The program at ``main`` (a file, or a directory holding ``__main__.py``; default: the current directory)
    and the project name from the ``Pulumi.yaml`` beside it; InputError when either is missing."""
    path = (main or Path.cwd()).resolve()
    entry = path / "__main__.py" if path.is_dir() else path
    if not entry.is_file():
        raise InputError(f"{entry}: no Pulumi program here (pass --main PATH)")
    project_file = entry.parent / "Pulumi.yaml"
    try:
        project = yaml.safe_load(project_file.read_text()).get("name")
    except (OSError, yaml.YAMLError, AttributeError):
        project = None
    if not isinstance(project, str) or not project:
        raise InputError(f"{project_file}: no project name (a Pulumi.yaml with `name:` must sit beside the program)")
    return Program(main=entry, project=project)


def check_pci_used(pci: Mapping[str, object], recording: Recording) -> None:
    """InputError when ``--pci`` answered for a node the program never looked up: the program (its specs built
    in Python included) names the nodes, so a node it does not preflight is a typo or the wrong program."""
    looked_up = {str(i.args.get("nodeName")) for i in recording.invokes if i.token == GET_PCI}
    unknown = sorted(set(pci) - looked_up)
    if unknown:
        known = ", ".join(sorted(looked_up)) or "none"
        raise InputError(f"--pci: the program preflights no Proxmox node {', '.join(unknown)} (it preflights: {known})")
