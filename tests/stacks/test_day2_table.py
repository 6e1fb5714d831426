"""docs/day2.md holds the change-class table as core/change_classes.py has it (stacks/day2_table.py renders it)."""

from __future__ import annotations

from proxmox_gpu_cluster.core.change_classes import CHANGE_CLASSES, REMOVALS
from proxmox_gpu_cluster.stacks.day2_table import BEGIN, END, render_table, with_table
from tests.support import ROOT


def test_day2_md_holds_the_current_table() -> None:
    committed = (ROOT / "docs" / "day2.md").read_text()
    regenerate = "regenerate: python -m proxmox_gpu_cluster.stacks.day2_table --write docs/day2.md"
    assert with_table(committed) == committed, regenerate
    table = committed.split(BEGIN, 1)[1].split(END, 1)[0]
    for key, c in CHANGE_CLASSES.items():
        assert f"| `{key}` | {c.change}" in table, key
    for key, c in REMOVALS.items():
        assert f"| `{key} (an item removed)` | {c.change}" in table, key


def test_the_table_states_what_is_not_carried_out_and_the_procedure() -> None:
    rows = {line.split("|")[1].strip(" `"): line for line in render_table().splitlines()[2:]}
    assert len(rows) == len(CHANGE_CLASSES) + len(REMOVALS)
    model = rows["HostGpu.model"]
    assert "vm-restart (not carried out by `pulumi up`)" in model and "qm shutdown" in model
    assert rows["Worker.cores"].startswith("| `Worker.cores` | vm-restart | ")  # carried out: the vm-restart step
    assert "Refused when the new size is smaller" in rows["Worker.diskGiB"]
    assert "\\|" not in rows["DrainSpec.maxUnavailable"]  # a cell never breaks the table


def test_only_the_marked_section_is_rewritten() -> None:
    document = f"# Title\n\nbefore\n\n{BEGIN}\nstale\n{END}\n\nafter\n"
    out = with_table(document)
    assert out.startswith("# Title\n\nbefore\n\n") and out.endswith(f"{END}\n\nafter\n")
    assert "stale" not in out and render_table() in out
