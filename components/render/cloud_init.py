"""Cloud-init vendor data for the worker VMs. Pure.

Vendor data, not user data: Proxmox generates the user data itself (user, SSH keys, hostname) from the VM's
cloud-init settings, and cloud-init merges vendor data into it. A custom user-data snippet would replace
Proxmox's, user and keys included.

On first boot it blacklists nouveau (and unloads it: udev loaded it before cloud-init ran, but no display
uses it, the console is on the emulated VGA), rebuilds the initramfs so later boots never load it, and
installs and starts the QEMU guest agent, which reports the VM's IP to Proxmox. None of this needs a reboot.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import yaml

NOUVEAU_BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"


@cache
def vendor_data() -> str:
    """The ``#cloud-config`` vendor data document (one text, rendered once per process: every node sends it)."""
    document: dict[str, Any] = {
        "write_files": [
            {
                "path": NOUVEAU_BLACKLIST,
                "owner": "root:root",
                "permissions": "0644",
                "content": "# Managed by proxmox-gpu-cluster\nblacklist nouveau\noptions nouveau modeset=0\n",
            }
        ],
        "package_update": True,
        "packages": ["qemu-guest-agent"],
        "runcmd": [
            ["sh", "-c", "if lsmod | grep -q '^nouveau '; then modprobe -r nouveau; fi"],
            ["update-initramfs", "-u"],
            ["systemctl", "enable", "--now", "qemu-guest-agent"],
        ],
    }
    return "#cloud-config\n" + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
