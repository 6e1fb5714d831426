"""The one table of change classes (core/change_classes.py): every spec field has a class, a new field without one
fails here, and a change without a supported path says what to do instead (docs/day2.md: test_day2_table.py)."""

from __future__ import annotations

import typing

from proxmox_gpu_cluster.core.change_classes import CHANGE_CLASSES, CLASSES, REMOVALS, ChangeClass, field_class
from proxmox_gpu_cluster.stacks.reference import spec_models


def spec_fields() -> set[str]:
    """``<Model>.<key>`` of every field docs/spec.md lists (its generator's own model walk)."""
    return {f"{m.__name__}.{f.alias or name}" for m in spec_models() for name, f in m.model_fields.items()}


def test_every_spec_field_has_a_class_and_the_table_names_no_other() -> None:
    fields = spec_fields()
    missing = sorted(fields - set(CHANGE_CLASSES))
    assert not missing, f"classify the new field(s) in core/change_classes.py: {missing}"
    assert sorted(set(CHANGE_CLASSES) - fields) == [], "the table names a field the spec no longer has"
    assert set(REMOVALS) <= set(CHANGE_CLASSES)
    assert len(fields) > 150  # the walk reached the whole spec, not one model


def test_the_classes_are_the_issues_six_and_each_says_what_up_does() -> None:
    assert set(CLASSES) == set(typing.get_args(ChangeClass))
    for key, c in [*CHANGE_CLASSES.items(), *REMOVALS.items()]:
        assert c.change in CLASSES, key
        assert c.what and "\n" not in c.what, key
        if c.change == "refused" or not c.supported or c.refused_when:
            # a change with no supported path names the supported procedure in one line
            assert c.procedure and "\n" not in c.procedure, key
        if c.change == "refused":
            assert not c.supported, key


def test_only_rolled_fields_and_carried_out_vm_restarts_drain_and_the_issues_false_drains_do_not() -> None:
    # the issue's false announcements: tuning drain or slot settings, sshAgent, authMode, joinMethod
    quiet = [f"DrainSpec.{k}" for k in ("timeoutSeconds", "maxUnavailable", "slotLeaseSeconds", "slotWaitSeconds",
                                        "slotNamespace", "force", "deleteEmptydirData")]  # fmt: skip
    quiet += ["ProxmoxSpec.sshAgent", "ProxmoxSpec.authMode", "KubernetesSpec.joinMethod"]
    for key in quiet:
        klass = field_class(key)
        assert klass is not None and not klass.drains, key
    for key in ("GpuOperatorSpec.driverVersion", "GpuOperatorSpec.driverBranch", "GpuAssignment.mig", "Worker.mig"):
        klass = field_class(key)
        assert klass is not None and klass.drains, key
    assert {k for k, c in CHANGE_CLASSES.items() if c.drains} == {
        k for k, c in CHANGE_CLASSES.items() if c.change == "rolled" or (c.change == "vm-restart" and c.supported)
    }
    # the VM hardware the vm-restart step applies in the node's slot (vm_restart.sh, core.guest_spec.hardware_key)
    for key in ("Worker.cores", "Worker.memoryMiB", "Worker.gpus", "GpuAssignment.ref", "Network.bridge"):
        klass = field_class(key)
        assert klass is not None and klass.change == "vm-restart" and klass.supported and klass.drains, key


def test_the_issues_no_path_changes_are_refused_with_a_procedure() -> None:
    version, datastore, disk = (field_class(k) for k in ("KubernetesSpec.version", "Worker.datastore",
                                                          "Worker.diskGiB"))  # fmt: skip
    assert version is not None and version.change == "rolled" and "kubeadm upgrade node" in version.what
    assert "more than one" in version.refused_when and "one minor at a time" in version.procedure
    assert datastore is not None and datastore.change == "refused" and "--replace" in datastore.procedure
    assert disk is not None and "smaller" in disk.refused_when and "--replace" in disk.procedure


def test_removing_a_worker_is_its_own_class() -> None:
    added, removed = field_class("ClusterSpec.workers"), field_class("ClusterSpec.workers", removed=True)
    assert added is not None and added.change == "in-place"
    assert removed is not None and removed.change == "replace" and "drained" in removed.what
    assert field_class("Worker.cores", removed=True) == field_class("Worker.cores")
    assert field_class("Worker.noSuchField") is None
