"""The Proxmox VE roles and ACL entries an API token needs for a spec: least privilege, path by path. Pure.

Each role is one purpose (the worker VMs, their disks, the cloud image download, ...), granted only on the paths the
spec uses: ``/vms/<vmid>`` of each worker, ``/storage/<datastore>`` of each datastore, the bridges, the nodes that
download an image. Privilege names are Proxmox VE 9's (pveum(1), "Privileges"); which API call needs which is the
API's own permission check, cited per role. ``pveum_commands`` prints the commands that create them.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from proxmox_gpu_cluster.core.spec import ClusterSpec


@dataclass(frozen=True)
class Role:
    """A role of this project: its privileges and what needs them."""

    name: str
    privileges: tuple[str, ...]
    on: str
    why: str


VM_ROLE = Role(
    "PGC-VM",
    (
        "VM.Allocate", "VM.Audit", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.HWType", "VM.Config.Disk",
        "VM.Config.CDROM", "VM.Config.Cloudinit", "VM.Config.Network", "VM.Config.Options", "VM.PowerMgmt",
        "VM.GuestAgent.Audit",
    ),
    "/vms/<vmid> of each worker",
    "create and destroy the VM (VM.Allocate on /vms/<vmid>, qemu-server's create check); cpu host, cores, memory; "
    "q35, OVMF, SCSI controller, serial console (HWType); boot, EFI and cloud-init disks (Disk, CDROM: the cloud-init "
    "drive is a CD-ROM type drive); user, keys, addresses, vendor-data snippet (Cloudinit); the NIC; name, tags, "
    "agent, start on boot (Options); start and stop; the addresses the guest agent reports (Proxmox VE 8 called "
    "this VM.Monitor)",
)  # fmt: skip
TEMPLATE_ROLE = Role(
    "PGC-Template", ("VM.Audit", "VM.Clone"), "/vms/<templateVmid>", "full clones of a template (image.templateVmid)"
)
DISKS_ROLE = Role(
    "PGC-Disks",
    ("Datastore.AllocateSpace", "Datastore.Audit"),
    "/storage/<datastore> of the workers' disks and the snippets",
    "allocate the VM disks; read the imported image and the vendor-data snippet the VMs reference",
)
IMAGES_ROLE = Role(
    "PGC-Images",
    ("Datastore.AllocateTemplate", "Datastore.Audit"),
    "/storage/<image.datastore>",
    "download the cloud image (download-url: Datastore.AllocateTemplate on the storage)",
)
DOWNLOAD_ROLE = Role(
    "PGC-Download",
    ("Sys.AccessNetwork",),
    "/nodes/<node> that downloads an image",
    "download-url also needs Sys.AccessNetwork on the node (or Sys.Audit and Sys.Modify on /, much more)",
)
PCI_LIST_ROLE = Role(
    "PGC-PciList",
    ("Sys.Audit",),
    "/ (not propagated)",
    "list the node's PCI devices for the IOMMU preflight (GET /nodes/<node>/hardware/pci: Sys.Audit or Sys.Modify "
    "on /)",
)
MAPPINGS_ROLE = Role(
    "PGC-Mappings",
    ("Mapping.Audit", "Mapping.Modify", "Mapping.Use"),
    "/mapping/pci (propagated)",
    "create, update, read and delete the stack's PCI mappings; attach mapped GPUs to VMs (an API token cannot "
    "attach raw PCI ids)",
)
BRIDGE_ROLE = Role(
    "PGC-Bridge", ("SDN.Use",), "/sdn/zones/localnetwork/<bridge> (propagated: VLANs)", "attach the NIC to the bridge"
)
ROLES = (
    VM_ROLE, TEMPLATE_ROLE, DISKS_ROLE, IMAGES_ROLE, DOWNLOAD_ROLE, PCI_LIST_ROLE, MAPPINGS_ROLE, BRIDGE_ROLE
)  # fmt: skip


@dataclass(frozen=True)
class Grant:
    """One ACL entry: ``role`` on ``path``; ``propagate``: also below it."""

    path: str
    role: Role
    propagate: bool = False


def proxmox_grants(spec: ClusterSpec) -> list[Grant]:
    """The ACL entries the spec needs, without duplicates, in a stable order."""
    grants = [Grant("/", PCI_LIST_ROLE), Grant("/mapping/pci", MAPPINGS_ROLE, propagate=True)]
    snippet_stores = {n.name: n.snippet_datastore for n in spec.proxmox.nodes}
    for worker in spec.workers:
        grants.append(Grant(f"/vms/{worker.vmid}", VM_ROLE))
        grants.append(Grant(f"/storage/{worker.datastore}", DISKS_ROLE))
        grants.append(Grant(f"/storage/{snippet_stores[worker.node]}", DISKS_ROLE))
        grants.append(Grant(f"/sdn/zones/localnetwork/{worker.network.bridge}", BRIDGE_ROLE, propagate=True))
        if worker.image.template_vmid is not None:
            grants.append(Grant(f"/vms/{worker.image.template_vmid}", TEMPLATE_ROLE))
        else:
            grants.append(Grant(f"/storage/{worker.image.datastore}", IMAGES_ROLE))
            grants.append(Grant(f"/nodes/{worker.node}", DOWNLOAD_ROLE))
    return list(dict.fromkeys(grants))


def pveum_commands(spec: ClusterSpec, user: str = "pulumi@pve", token_name: str = "gpu-cluster") -> list[str]:  # noqa: S107 (a token id, not its secret)
    """Shell lines, run as root on a Proxmox node, that create (or bring up to date) the roles this spec uses, a
    user without a password (it cannot log in), its ACL entries and its API token. Running them again changes
    nothing: a role that exists gets exactly these privileges, ``acl modify`` adds an entry that is already there,
    and an existing token is kept (a new one would print a new secret). The token shares the user's privileges
    (``--privsep 0``): a separated token would get only the intersection of its own ACLs and the user's."""
    grants = proxmox_grants(spec)
    used = [r for r in ROLES if any(g.role is r for g in grants)]

    def either(first: list[str], second: list[str]) -> str:
        return f"{shlex.join(first)} || {shlex.join(second)}"

    lines = [
        either(["pveum", "role", "add", r.name, "--privs", ",".join(r.privileges)],
               ["pveum", "role", "modify", r.name, "--privs", ",".join(r.privileges)])
        for r in used
    ]  # fmt: skip
    comment = "proxmox-gpu-cluster (Pulumi)"
    lines.append(
        either(
            ["pveum", "user", "add", user, "--comment", comment],
            ["pveum", "user", "modify", user, "--comment", comment],
        )
    )
    for g in sorted(grants, key=lambda g: (ROLES.index(g.role), g.path)):
        propagate = "1" if g.propagate else "0"
        command = ["pveum", "acl", "modify", g.path, "--users", user, "--roles", g.role.name, "--propagate", propagate]
        lines.append(shlex.join(command))
    info = shlex.join(["pveum", "user", "token", "info", user, token_name])
    lines.append(
        f"{info} >/dev/null 2>&1 || {shlex.join(['pveum', 'user', 'token', 'add', user, token_name, '--privsep', '0'])}"
    )
    return lines


def roles_table() -> str:
    """The Markdown table of ``ROLES`` (the README's, kept current by a test); ``<placeholders>`` escaped, since
    Markdown would take them for HTML tags."""

    def text(value: str) -> str:
        return value.replace("<", "&lt;").replace(">", "&gt;")

    rows = ["| role | privileges | on | what for |", "|---|---|---|---|"]
    for r in ROLES:
        privileges = ", ".join(f"`{p}`" for p in r.privileges)
        rows.append(f"| `{r.name}` | {privileges} | {text(r.on)} | {text(r.why)} |")
    return "\n".join(rows) + "\n"
