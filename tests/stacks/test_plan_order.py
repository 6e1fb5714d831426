"""The text plan's lists do not follow the order in which the mock engine happened to register resources (the SDK
registers from several threads, so that order differs between runs of one stack)."""

from __future__ import annotations

from proxmox_gpu_cluster.recording import RecordedResource, Recording
from proxmox_gpu_cluster.stacks.plan import reboot_points


def _step(name: str) -> RecordedResource:
    return RecordedResource(
        type="command:remote:Command", name=name, urn=f"urn:{name}", parent="", custom=True, provider="",
        dependencies=[], property_dependencies={}, inputs={}, protect=False, ignore_changes=[],
        replace_on_changes=[], additional_secret_outputs=[], delete_before_replace=False, retain_on_delete=False,
    )  # fmt: skip


def test_reboot_points_are_listed_by_name_whatever_the_registration_order() -> None:
    names = ["c-w1-large-bar", "c-pve0-host-prep-prep", "c-w0-bootstrap-driver", "c-w0-bootstrap-verify"]
    orders = [names, names[::-1], names[1:] + names[:1]]
    listed = [list(reboot_points(Recording(resources=[_step(n) for n in order]))) for order in orders]
    assert listed[0] == ["c-pve0-host-prep-prep", "c-w0-bootstrap-driver", "c-w1-large-bar"]
    assert listed[1] == listed[0] and listed[2] == listed[0]
