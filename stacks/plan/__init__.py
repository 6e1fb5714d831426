"""The offline plan and diff: ``python -m proxmox_gpu_cluster.plan`` (``run.main``).

How data flows through the package:

1. ``inputs``: the program (``__main__.py`` or ``--main``), its stack file and ``--pci`` device lists, read with
   bounds; ``specs``: every cluster spec of the stack's config validated first (all problems at once, exit 2), with
   placeholder secrets where asked.
2. ``run``: the program under Pulumi's mock engine, recorded (``proxmox_gpu_cluster.recording``); the plan
   document (``run.plan_document``) carries every resource's inputs, with secrets as ``[secret]`` or keyed digests
   (``values``), and the validated specs (``context``). ``files`` writes them per resource (``--out``).
3. For a diff, ``compare`` plans the other side (a base revision's own code in a child process, or another config)
   and ``diff`` matches the two documents resource by resource, deciding replacements, aliases and protection as
   the engine does (``engine``).
4. ``classes`` classifies each changed spec field by the one table of change classes
   (``proxmox_gpu_cluster.core.change_classes``, the table ``docs/day2.md`` shows): in place, rolled through
   slots, VM restart, host reboot, replace, or refused with its procedure. The drains the diff announces and the
   rows it marks as failing come from that table, the same one the node steps' rollout follows.
5. ``impact`` says what the changes do once they run (each node's resources, restarts, retirements);
   ``report`` renders the summary, text, markdown (pull-request comments) and JSON.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxmox_gpu_cluster.stacks.plan.inputs import find_program
    from proxmox_gpu_cluster.stacks.plan.run import (
        exit_without_teardown,
        main,
        plan,
        plan_document,
        reboot_points,
        render_text,
        resource_entry,
    )

_WHERE = {
    "find_program": "inputs",
    **dict.fromkeys(
        ("exit_without_teardown", "main", "plan", "plan_document", "reboot_points", "render_text", "resource_entry"),
        "run",
    ),
}
__all__ = [
    "exit_without_teardown",
    "find_program",
    "main",
    "plan",
    "plan_document",
    "reboot_points",
    "render_text",
    "resource_entry",
]


def __getattr__(name: str) -> Any:
    """The entry points, imported when first asked for (PEP 562): a module of the package imported alone (as
    ``cli_checks`` imports ``inputs``) does not pull in ``run``, which imports it back."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
