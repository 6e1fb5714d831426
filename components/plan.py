"""``python -m proxmox_gpu_cluster.plan``: the offline plan CLI (see ``proxmox_gpu_cluster.stacks.plan``)."""

from __future__ import annotations

import sys

from proxmox_gpu_cluster.stacks.plan import main

if __name__ == "__main__":
    sys.exit(main())
