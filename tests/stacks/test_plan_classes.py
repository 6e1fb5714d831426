"""plan/classes.py: each changed spec value of a diff named by its field and class, the drains the classes allow,
and the refusals only a diff can make (it alone sees the old value). Plan documents here carry only the validated
specs, as ``plan.plan_document`` writes them (``spec_view``); the whole offline plan of prod runs in
test_change_matrix.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from proxmox_gpu_cluster.core.spec import load_spec
from proxmox_gpu_cluster.stacks.plan.classes import ALL, field_changes, refused_rows, rolled_machines
from proxmox_gpu_cluster.stacks.plan.context import spec_view
from tests.support import prod_spec

Edit = Callable[[dict[str, Any]], None]


def documents(edit: Edit, base: Edit | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two plan documents' ``specs``: prod (after ``base``), then with ``edit``; both validated."""
    old, new = prod_spec(), prod_spec()
    for step in (base, None):
        if step is not None:
            step(old)
            step(new)
    edit(new)
    return (
        {"specs": spec_view([("proxmox-gpu-cluster", load_spec(old))])},
        {"specs": spec_view([("proxmox-gpu-cluster", load_spec(new))])},
    )


def worker(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(w for w in spec["workers"] if w["name"] == name)


def mig_geometry(s: dict[str, Any]) -> None:
    """The golden scenario's new geometry on gpu-a100-b, and the quota that named a profile it drops."""
    worker(s, "gpu-a100-b")["gpus"][0]["mig"] = {"3g.20gb": 2}
    research = next(q for q in s["quotas"] if q["namespace"] == "ml-research" and "priorityClass" not in q)
    research["resources"] = {"nvidia.com/gpu": 4, "nvidia.com/mig-3g.20gb": 2}


def test_each_changed_value_is_named_by_its_path_and_field() -> None:
    def edit(s: dict[str, Any]) -> None:
        worker(s, "gpu-a10-a")["cores"] = 48
        s["kubernetes"].setdefault("drain", {})["maxUnavailable"] = 2

    changes = {c.path: c for c in field_changes(*documents(edit))}
    cores = changes["cluster.workers[gpu-a10-a].cores"]
    assert (cores.field, cores.new, cores.owner) == ("Worker.cores", 48, "gpu-a10-a") and cores.old != 48
    assert cores.klass is not None and cores.klass.change == "vm-restart" and cores.klass.supported
    drain = changes["cluster.kubernetes.drain.maxUnavailable"]
    assert (drain.field, drain.owner, drain.refused) == ("DrainSpec.maxUnavailable", "", "")
    assert set(changes) == {"cluster.workers[gpu-a10-a].cores", "cluster.kubernetes.drain.maxUnavailable"}


def test_drain_slot_and_connection_settings_drain_nothing_but_a_driver_or_geometry_does() -> None:
    quiet: list[Edit] = [
        lambda s: s["kubernetes"].setdefault("drain", {}).update(timeoutSeconds=900, slotWaitSeconds=600),
        lambda s: s["proxmox"].update(sshAgent=True),
        lambda s: s["proxmox"].update(authMode="password"),
        lambda s: s["kubernetes"].update(joinMethod="none"),
    ]
    for edit in quiet:
        assert rolled_machines(*documents(edit)) == set()
    assert rolled_machines(*documents(lambda s: s["gpuOperator"].update(driverVersion="580.105.08"))) == {ALL}
    geometry = rolled_machines(*documents(mig_geometry))
    assert geometry == {"gpu-a100-b"}
    assert rolled_machines({}, {"specs": {}}) is None  # an older revision's document: nothing can be said


def test_the_next_kubernetes_minor_rolls_every_joined_worker_and_is_not_refused() -> None:
    before, after = documents(lambda s: s["kubernetes"].update(version="1.35"))
    [change] = field_changes(before, after)
    assert not change.refused and change.klass is not None and change.klass.change == "rolled"
    assert "kubeadm upgrade node" in change.klass.what
    assert rolled_machines(before, after) == {ALL} and refused_rows(before, after, "cluster-") == {}


@pytest.mark.parametrize(("version", "shown"), [("1.36", "1.34 → 1.36"), ("1.33", "1.34 → 1.33")])
def test_a_lower_minor_or_a_skipped_one_fails_every_joined_workers_join_step_with_the_procedure(
    version: str, shown: str
) -> None:
    before, after = documents(lambda s: s["kubernetes"].update(version=version))
    [change] = field_changes(before, after)
    assert change.refused.startswith("the minor goes down, or up by more than one, while workers that joined")
    assert "instead: upgrade the control plane first; then one minor at a time" in change.refused
    rows = refused_rows(before, after, "cluster-")
    assert set(rows) == {f"cluster-{w}-bootstrap-join" for w in ("gpu-a10-a", "gpu-a10-b", "gpu-a100-a", "gpu-a100-b")}
    assert all(line.startswith(f"will fail: cluster.kubernetes.version {shown}: ") for r in rows.values() for line in r)


def test_a_new_minor_with_no_joined_worker_left_is_not_refused() -> None:
    def replace_all(s: dict[str, Any]) -> None:
        s["kubernetes"]["version"] = "1.35"
        for w in s["workers"]:
            w["name"] += "-new"  # every worker is new: it joins at the new minor
            w["vmid"] += 1000

    assert not any(c.refused for c in field_changes(*documents(replace_all)))
    patch_only = documents(lambda s: s["kubernetes"].update(version="1.34"))  # the same minor: no change at all
    assert field_changes(*patch_only) == []


def test_a_smaller_disk_and_a_datastore_move_fail_the_vm_row_a_larger_disk_does_not() -> None:
    def shrink(s: dict[str, Any]) -> None:
        w = worker(s, "gpu-a10-b")
        w["diskGiB"] = w.get("diskGiB", 100) - 10

    rows = refused_rows(*documents(shrink), "cluster-")
    assert list(rows) == ["cluster-gpu-a10-b-vm"] and "Cannot shrink" in rows["cluster-gpu-a10-b-vm"][0]
    grow = documents(lambda s: worker(s, "gpu-a10-b").update(diskGiB=worker(s, "gpu-a10-b").get("diskGiB", 100) + 50))
    assert refused_rows(*grow) == {} and not any(c.refused for c in field_changes(*grow))
    move = documents(lambda s: worker(s, "gpu-a10-b").update(datastore="ceph"))
    assert "--replace" in refused_rows(*move, "cluster-")["cluster-gpu-a10-b-vm"][0]


def test_a_rename_that_keeps_the_vmid_is_refused() -> None:
    before, after = documents(lambda s: worker(s, "gpu-a10-b").update(name="gpu-a10-z"))
    changes = field_changes(before, after)
    [rename] = [c for c in changes if c.field == "Worker.name"]
    assert (rename.old, rename.new) == ("gpu-a10-b", "gpu-a10-z") and "new vmid" in rename.refused
    removed = [c for c in changes if c.path == "cluster.workers[gpu-a10-b]"]
    assert removed and removed[0].klass is not None and removed[0].klass.change == "replace"  # retired


def test_a_lower_driver_or_toolkit_pin_is_carried_out_like_a_higher_one() -> None:
    # The steps install a pin up or down (guest_lib.sh apt_install passes --allow-downgrades; the real apt lowers
    # and raises both under holds in tests/components/scripts/test_real_apt.py): nothing is refused, and the driver
    # rolls through the slots either way.
    def pin(version: str) -> Edit:
        return lambda s: s["gpuOperator"].update(driverVersion=version)

    for before, after in (documents(pin("580.95.05"), base=pin("580.105.08")), documents(pin("580.105.08"))):
        [change] = field_changes(before, after)
        assert not change.refused and refused_rows(before, after, "cluster-") == {}
        assert rolled_machines(before, after) == {ALL}
    toolkit = documents(lambda s: s["guest"].update(toolkitVersion="1.17.8-1"))
    [change] = field_changes(*toolkit)
    assert not change.refused and change.klass is not None and change.klass.change == "in-place"
    assert refused_rows(*toolkit) == {} and rolled_machines(*toolkit) == set()


def test_unpinning_the_driver_drains_nothing_but_pinning_it_does() -> None:
    # Unpinned, the branch pin keeps the installed build (the driver step changes nothing: the change matrix in the
    # fake world found the diff announcing drains there that never happened).
    pin = lambda s: s["gpuOperator"].update(driverVersion="580.95.05")  # noqa: E731
    unpin = lambda s: s["gpuOperator"].pop("driverVersion", None)  # noqa: E731
    before, after = documents(unpin, base=pin)
    assert [c.field for c in field_changes(before, after)] == ["GpuOperatorSpec.driverVersion"]
    assert rolled_machines(before, after) == set()
    assert rolled_machines(*documents(pin, base=unpin)) == {ALL}
