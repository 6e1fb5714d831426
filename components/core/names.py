"""Names of what the stack creates on Proxmox, where two stacks (or two nodes) could otherwise collide. Pure.

Datacenter PCI mappings, cloud-init snippets, downloaded images and host prep's drop-in live outside Pulumi's own
namespace: a second stack (or a second cluster of one program) that chose the same name would overwrite the first
one's object, and destroying either would delete the other's. Every such name therefore carries a scope, a short
hash of the Pulumi project, the stack and the cluster, next to a readable form of the stack name; within it, node
and GPU names (DNS labels) complete it.

The names never depend on resource names or component nesting, so refactoring the program does not rename (and so
replace) anything on the hosts.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

_SLUG_LENGTH = 20
_STEM_LENGTH = 60


def short_hash(text: str, length: int = 10) -> str:
    """A short, stable hash of ``text`` (what every content-addressed or scoped name carries)."""
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def _hash(*parts: str) -> str:
    # NUL cannot occur in any part, so different part lists never hash the same text.
    return short_hash("\0".join(parts), 8)


def _slug(text: str, length: int) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:length].strip("-")


@dataclass(frozen=True)
class StackScope:
    """Which Pulumi project, stack and cluster the names belong to.

    ``cluster`` is the cluster's name within the program (a ``GpuCluster``'s resource name), so two clusters of one
    program never share a name; empty, the names are the stack's alone, as a program with a single cluster created
    them before clusters were scoped (``GpuCluster(stack_scoped_names=True)`` keeps those names)."""

    project: str
    stack: str
    cluster: str = ""

    @property
    def token(self) -> str:
        """``<readable stack>-<hash>`` or just the hash: lower-case letters, digits and dashes, at most 29."""
        slug = _slug(self.stack, _SLUG_LENGTH)
        digest = _hash(self.project, self.stack, *([self.cluster] if self.cluster else []))
        return f"{slug}-{digest}" if slug else digest

    def describe(self) -> str:
        """How an error names the scope: ``stack 'prod'`` or ``cluster 'a' of stack 'prod'``."""
        stack = f"stack {self.stack!r} of project {self.project!r}"
        return f"cluster {self.cluster!r} of {stack}" if self.cluster else stack

    def mapping_id(self, node: str, gpu: str) -> str:
        """The datacenter PCI mapping of GPU ``gpu`` on Proxmox node ``node``.

        Proxmox mapping ids are ``[a-z][a-z0-9_-]+`` (pve-common ``$CONFIGID_RE``). Node and GPU names are DNS
        labels, which have no ``_``, so ``_`` separates the parts unambiguously (``gpu-pve-a-0`` was both node
        ``pve`` + GPU ``a-0`` and node ``pve-a`` + GPU ``0``).
        """
        return f"pgc_{self.token}_{node}_{gpu}"

    def snippet_file_name(self, node: str) -> str:
        """The cloud-init vendor-data snippet of Proxmox node ``node``."""
        return f"pgc-{self.token}-{node}-vendor-data.yaml"

    def image_file_name(self, node: str, datastore: str, url: str) -> str:
        """The stored name of the cloud image at ``url`` on ``node``'s ``datastore``.

        The readable part is the URL's file name (``.../download?file=jammy.img`` has none: the last query value
        with an image extension is used, else ``cloud-image``); the hash covers the scope, node, datastore and
        the full URL, so two URLs with the same basename never share a file. ``.img`` because Proxmox VE before
        8.4 accepts only .img/.iso files as ``iso`` content; the format is detected from the content, not the
        name.
        """
        cluster = [self.cluster] if self.cluster else []
        return f"{image_stem(url)}-{_hash(self.project, self.stack, *cluster, node, datastore, url)}.img"


_IMAGE_EXT = re.compile(r"\.(img|qcow2|raw|iso)$", re.IGNORECASE)


def image_stem(url: str) -> str:
    """A readable, file-system-safe stem for the image at ``url``."""
    parts = urlsplit(url)
    candidates = [posixpath.basename(parts.path)]
    candidates += [value for _, _, value in (p.partition("=") for p in parts.query.split("&"))]
    for candidate in [c for c in candidates if _IMAGE_EXT.search(c)] + candidates[:1]:
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", _IMAGE_EXT.sub("", posixpath.basename(candidate))).strip("-._")
        if stem:
            return stem[:_STEM_LENGTH].rstrip("-._")
    return "cloud-image"
