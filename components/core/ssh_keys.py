"""Strict parsing of OpenSSH public keys (``authorized_keys`` lines without options). Pure.

A key is ``<type> <base64 blob> [comment]``. The blob is the wire-format public key, which starts with the key
type again as an SSH string (RFC 4253 section 6.6: a uint32 length, then the name); a key whose blob names another
type, or does not decode, is refused.

The comment travels further than OpenSSH takes it: Proxmox VE writes each key unquoted into the VM's generated
cloud-init user data (qemu-server, ``PVE::QemuServer::Cloudinit::cloudinit_userdata``, one ``  - <key>`` line per
key). In that position a YAML plain scalar ends at ``: `` or `` #``, so a comment like ``ops@lab: evil`` would turn
the list item into a mapping. Comments that YAML would not read back as the same string are refused here, with the
reason; ``tests/components/test_ssh_keys.py`` checks that every accepted key survives that rendering unchanged.
"""

from __future__ import annotations

import base64
import binascii
import re
import struct

from proxmox_gpu_cluster.core.quoting import LINE_BREAKERS

KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)
"""Key types OpenSSH accepts today (``ssh-dss`` is gone since OpenSSH 9.8; certificates need ``cert-authority``)."""

_BASE64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")
_FORBIDDEN = re.compile(f"[{LINE_BREAKERS}]")
MAX_KEY_LENGTH = 16384
"""Longer than any real key (a 16384-bit RSA key is about 2.8 KB of base64)."""


def _blob_type(blob: bytes) -> str | None:
    """The key type a wire-format public key names, or None when it is not one."""
    if len(blob) < 4:
        return None
    (length,) = struct.unpack(">I", blob[:4])
    if length == 0 or length > 64 or len(blob) < 4 + length:
        return None
    try:
        return blob[4 : 4 + length].decode("ascii")
    except UnicodeDecodeError:
        return None


def _comment_problem(comment: str) -> str | None:
    # Judged with the space that separates it from the key: that space and a leading '#' start a YAML comment.
    comment = f" {comment}"
    if _FORBIDDEN.search(comment):
        return "the comment contains a control or line-separator character"
    if ": " in comment or comment.endswith(":"):
        return (
            "the comment contains ': ' (or ends with ':'), which Proxmox writes unquoted into the VM's cloud-init "
            "user data"
        )
    if " #" in comment:
        return "the comment starts with or contains ' #', which starts a YAML comment in the VM's cloud-init user data"
    return None


def public_key_problem(text: str) -> str | None:
    """Why ``text`` is not an acceptable public key, or None when it is."""
    if len(text) > MAX_KEY_LENGTH:
        return f"longer than {MAX_KEY_LENGTH} characters; not a public key"
    if text != text.strip(" "):
        return "leading or trailing spaces (YAML would drop them)"
    parts = text.split(" ", 2)
    if len(parts) < 2:
        return "expected '<type> <base64 key> [comment]'"
    return _key_problem(parts[0], parts[1]) or (_comment_problem(parts[2]) if len(parts) == 3 else None)


def _key_problem(key_type: str, blob_text: str) -> str | None:
    if key_type not in KEY_TYPES:
        return f"unknown key type {key_type[:40]!r} (known: {', '.join(KEY_TYPES)})"
    try:
        if not _BASE64.fullmatch(blob_text):
            raise ValueError(blob_text)
        blob = base64.b64decode(blob_text, validate=True)
    except (binascii.Error, ValueError):
        return "the key is not valid base64"
    named = _blob_type(blob)
    if named != key_type:
        return f"the key data names {named!r}, not {key_type}" if named else "the key data is not an SSH public key"
    return None


def check_public_key(text: str) -> str:
    """Pydantic validator: ``text`` unchanged, or ValueError saying what is wrong."""
    problem = public_key_problem(text)
    if problem is not None:
        raise ValueError(f"not an SSH public key: {problem}")
    return text
