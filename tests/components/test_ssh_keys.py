"""Strict SSH public-key parsing, and the property that makes it safe: every key it accepts reads back unchanged
from the cloud-init user data Proxmox writes (one unquoted ``  - <key>`` line per key, see components/ssh_keys.py),
and adds nothing to that document."""

from __future__ import annotations

import base64
import struct

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from proxmox_gpu_cluster.core.ssh_keys import KEY_TYPES, public_key_problem


def blob(key_type: str, body: bytes = b"\x00" * 32) -> str:
    name = key_type.encode()
    return base64.b64encode(struct.pack(">I", len(name)) + name + body).decode()


def proxmox_user_data(keys: list[str]) -> str:
    """The shape of the user data qemu-server generates: keys appended unquoted, one list item each."""
    lines = ["#cloud-config", "hostname: gpu-a10-a", "ssh_authorized_keys:", *(f"  - {k}" for k in keys)]
    return "\n".join([*lines, "chpasswd:", "  expire: False", ""])


def test_real_keys_are_accepted() -> None:
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBxYhxkAFq8yGtzKQpNLT3ZN0r6Jw1c0Kf3z8lL0Q1u1 ops@lab"
    assert public_key_problem(key) is None
    for key_type in KEY_TYPES:
        assert public_key_problem(f"{key_type} {blob(key_type)}") is None, key_type


def test_refusals_say_why() -> None:
    ed = blob("ssh-ed25519")
    assert public_key_problem("ssh-ed25519") == "expected '<type> <base64 key> [comment]'"
    assert public_key_problem(f"ssh-dss {blob('ssh-dss')}").startswith("unknown key type 'ssh-dss'")
    assert public_key_problem(f"ssh-rsa {ed}") == "the key data names 'ssh-ed25519', not ssh-rsa"
    assert public_key_problem("ssh-ed25519 AAAA") == "the key data is not an SSH public key"
    assert public_key_problem("ssh-ed25519 ===") == "the key is not valid base64"
    assert public_key_problem(f"ssh-ed25519 {ed} a: b").startswith("the comment contains ': '")
    assert public_key_problem(f"ssh-ed25519 {ed} a #b").startswith("the comment starts with or contains ' #'")
    assert public_key_problem(f"ssh-ed25519 {ed} #b").startswith("the comment starts with or contains ' #'")
    assert public_key_problem(f"ssh-ed25519 {ed} a\u2028b") == (
        "the comment contains a control or line-separator character"
    )
    assert public_key_problem(f"ssh-ed25519 {'A' * 20000}").startswith("longer than")


@settings(max_examples=2000, deadline=None)
@given(
    key_type=st.sampled_from(KEY_TYPES),
    body=st.binary(max_size=48),
    comment=st.one_of(st.none(), st.text(max_size=40)),
)
def test_every_accepted_key_survives_proxmox_user_data(key_type: str, body: bytes, comment: str | None) -> None:
    key = f"{key_type} {blob(key_type, body)}" + (f" {comment}" if comment is not None else "")
    if public_key_problem(key) is not None:
        return
    document = yaml.safe_load(proxmox_user_data([key, key]))
    assert document["ssh_authorized_keys"] == [key, key]
    assert set(document) == {"hostname", "ssh_authorized_keys", "chpasswd"}
