"""``python -m proxmox_gpu_cluster.plan``: the offline plan CLI (see ``proxmox_gpu_cluster.stacks.plan``)."""

from __future__ import annotations

from proxmox_gpu_cluster.stacks.plan import exit_without_teardown, main

if __name__ == "__main__":
    exit_without_teardown(main())
