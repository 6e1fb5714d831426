"""Names on Proxmox (pure): scoped to project and stack, injective in node and GPU names, usable as ids."""

from __future__ import annotations

import hashlib
import re

from hypothesis import given
from hypothesis import strategies as st

from proxmox_gpu_cluster.core.names import StackScope, image_stem

LABEL = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?\Z")
CONFIGID = re.compile(r"^[a-z][a-z0-9_-]+$", re.IGNORECASE)  # pve-common $CONFIGID_RE (mapping ids)


def test_mapping_ids_are_valid_and_scoped() -> None:
    prod, dev = StackScope("proxmox-gpu-cluster", "prod"), StackScope("proxmox-gpu-cluster", "dev")
    assert CONFIGID.match(prod.mapping_id("pve1", "a10-0"))
    assert prod.mapping_id("pve1", "a10-0") != dev.mapping_id("pve1", "a10-0")
    assert StackScope("other-project", "prod").mapping_id("pve1", "a10-0") != prod.mapping_id("pve1", "a10-0")
    assert prod.mapping_id("pve", "a-0") != prod.mapping_id("pve-a", "0")


def test_clusters_of_one_stack_get_their_own_names_and_the_stack_scope_keeps_its_old_ones() -> None:
    stack = StackScope("proxmox-gpu-cluster", "prod")
    a, b = StackScope("proxmox-gpu-cluster", "prod", "team-a"), StackScope("proxmox-gpu-cluster", "prod", "team-b")
    assert len({stack.token, a.token, b.token}) == 3
    assert len({s.mapping_id("pve1", "a10-0") for s in (stack, a, b)}) == 3
    assert len({s.snippet_file_name("pve1") for s in (stack, a, b)}) == 3
    url = "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"
    assert len({s.image_file_name("pve1", "local", url) for s in (stack, a, b)}) == 3
    # The stack-only scope is what every stack used before clusters were scoped: its names must never change.
    assert stack.token == "prod-" + hashlib.sha256(b"proxmox-gpu-cluster\0prod").hexdigest()[:8]
    assert a.describe() == "cluster 'team-a' of stack 'prod' of project 'proxmox-gpu-cluster'"


@given(a=st.tuples(LABEL, LABEL), b=st.tuples(LABEL, LABEL))
def test_mapping_ids_are_injective(a: tuple[str, str], b: tuple[str, str]) -> None:
    scope = StackScope("p", "s")
    assert (scope.mapping_id(*a) == scope.mapping_id(*b)) == (a == b)


@given(stack=st.text(max_size=30))
def test_any_stack_name_gives_a_safe_token(stack: str) -> None:
    scope = StackScope("proxmox-gpu-cluster", stack)
    assert re.fullmatch(r"[a-z0-9-]+", scope.token)
    assert CONFIGID.match(scope.mapping_id("pve1", "g0"))
    assert re.fullmatch(r"[a-z0-9.-]+", scope.snippet_file_name("pve1"))


def test_snippet_and_image_names() -> None:
    scope = StackScope("proxmox-gpu-cluster", "Prod.EU_1")
    assert re.fullmatch(r"pgc-prod-eu-1-[0-9a-f]{8}-pve1-vendor-data\.yaml", scope.snippet_file_name("pve1"))
    url = "https://cloud-images.ubuntu.com/jammy/current/jammy-server-cloudimg-amd64.img"
    name = scope.image_file_name("pve1", "local", url)
    assert re.fullmatch(r"jammy-server-cloudimg-amd64-[0-9a-f]{8}\.img", name)
    # two URLs with one basename, two nodes, two datastores: all different files
    others = {scope.image_file_name("pve1", "local", "https://mirror.test/jammy/current/jammy-server-cloudimg-amd64.img"),
              scope.image_file_name("pve2", "local", url), scope.image_file_name("pve1", "nfs", url)}  # fmt: skip
    assert name not in others and len(others) == 3


def test_image_stems_from_awkward_urls() -> None:
    assert image_stem("https://x.test/download?file=jammy.img") == "jammy"
    assert image_stem("https://x.test/images/noble.qcow2") == "noble"
    assert image_stem("https://x.test/") == "cloud-image"
    assert image_stem("https://x.test/dl?id=3") == "dl"
    assert image_stem("https://x.test/%20weird%20name!.raw") == "20weird-20name"
