"""The README's diagram, privilege table and links stay true to the code they describe."""

from __future__ import annotations

import importlib
import pkgutil
import re

import pulumi

import proxmox_gpu_cluster
from proxmox_gpu_cluster.render.proxmox_acl import ROLES, roles_table
from tests.support import ROOT

README = (ROOT / "README.md").read_text()

# Proxmox VE 9's privileges: the "Privileges" list of pveum(1) (pve-docs, pveum.adoc), and Sys.AccessNetwork, which
# the download-url permission check names (pve-manager, PVE/API2/Storage/Status.pm). VM.Monitor is gone in 9.
PVE9_PRIVILEGES = {
    "Group.Allocate", "Mapping.Audit", "Mapping.Modify", "Mapping.Use", "Permissions.Modify", "Pool.Allocate",
    "Pool.Audit", "Realm.AllocateUser", "Realm.Allocate", "SDN.Allocate", "SDN.Audit", "Sys.AccessNetwork",
    "Sys.Audit", "Sys.Console", "Sys.Incoming", "Sys.Modify", "Sys.PowerMgmt", "Sys.Syslog", "User.Modify",
    "SDN.Use", "VM.Allocate", "VM.Audit", "VM.Backup", "VM.Clone", "VM.Config.CDROM", "VM.Config.CPU",
    "VM.Config.Cloudinit", "VM.Config.Disk", "VM.Config.HWType", "VM.Config.Memory", "VM.Config.Network",
    "VM.Config.Options", "VM.Console", "VM.GuestAgent.Audit", "VM.GuestAgent.FileRead",
    "VM.GuestAgent.FileSystemMgmt", "VM.GuestAgent.FileWrite", "VM.GuestAgent.Unrestricted", "VM.Migrate",
    "VM.PowerMgmt", "VM.Replicate", "VM.Snapshot.Rollback", "VM.Snapshot", "Datastore.Allocate",
    "Datastore.AllocateSpace", "Datastore.AllocateTemplate", "Datastore.Audit",
}  # fmt: skip


def section(title: str) -> str:
    start = README.index(f"\n{title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end > 0 else None]


def component_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(proxmox_gpu_cluster.__path__, "proxmox_gpu_cluster."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, pulumi.ComponentResource):
                found[name] = value
    return found


def test_the_diagram_names_real_components_and_every_layer() -> None:
    (diagram,) = re.findall(r"```mermaid\n(.*?)```", README, re.DOTALL)
    assert diagram.startswith("flowchart")
    named = set(re.findall(r"\b((?:Gpu|Proxmox|Worker|Guest|Node|KubeVirt|Dra|Mig)[A-Za-z]+)\b", diagram))
    classes = component_classes()
    assert named - set(classes) == set(), "the diagram names components that do not exist"
    layers = {"ProxmoxHostGpuPrep", "GpuPciMappings", "GpuWorkerVm", "GuestBootstrap", "GpuNodeLabels", "GpuOperator"}
    assert layers <= named


def test_the_role_table_is_generated_from_the_roles_the_tool_grants() -> None:
    (table,) = re.findall(r"<!-- proxmox-roles:[^\n]*-->\n(.*?)<!-- /proxmox-roles -->", README, re.DOTALL)
    assert table == roles_table(), "regenerate the table between the proxmox-roles markers from roles_table()"


def test_every_role_names_real_privileges_and_the_ones_the_guides_name() -> None:
    named = {p for role in ROLES for p in role.privileges}
    assert named - PVE9_PRIVILEGES == set()
    assert "VM.Monitor" not in named  # removed in Proxmox VE 9
    guides = {"VM.Allocate", "VM.Config.HWType", "Datastore.AllocateSpace", "Datastore.AllocateTemplate"}
    assert guides | {"Mapping.Use", "Mapping.Modify", "Sys.Audit", "SDN.Use"} <= named
    assert all(role.why and role.on for role in ROLES)


def test_the_troubleshooting_table_covers_the_guides_failure_modes() -> None:
    table = section("## Troubleshooting")
    for symptom in ("Pending", 'no runtime for "nvidia"', "`pending`, or `failed`", "Time-slicing not applied",
                    "is not permitted in permittedHostDevices", "Driver/library version mismatch"):  # fmt: skip
        assert symptom in table, symptom
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| symptom")]
    assert len(rows) >= 6 and all(len(row.split(" | ")) == 3 for row in rows)


def test_files_the_readme_links_exist() -> None:
    for target in re.findall(r"\]\(((?:stacks|docs|examples)/[^)#]+)\)", README):
        assert (ROOT / target).exists(), target
