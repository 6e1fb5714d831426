"""Vendor data: a cloud-config that blacklists nouveau and starts the guest agent without a reboot."""

from __future__ import annotations

import yaml

from proxmox_gpu_cluster.render.cloud_init import NOUVEAU_BLACKLIST, vendor_data


def test_is_cloud_config() -> None:
    text = vendor_data()
    assert text.startswith("#cloud-config\n")
    doc = yaml.safe_load(text)
    assert set(doc) == {"write_files", "package_update", "packages", "runcmd"}  # no users/keys: Proxmox's stay


def test_blacklists_nouveau_and_installs_the_agent() -> None:
    doc = yaml.safe_load(vendor_data())
    (blacklist,) = doc["write_files"]
    assert blacklist["path"] == NOUVEAU_BLACKLIST and "blacklist nouveau" in blacklist["content"]
    assert doc["packages"] == ["qemu-guest-agent"]
    commands = [" ".join(c) for c in doc["runcmd"]]
    assert any("modprobe -r nouveau" in c for c in commands)
    assert "update-initramfs -u" in commands
    assert "systemctl enable --now qemu-guest-agent" in commands
    assert not any("reboot" in c for c in commands)
