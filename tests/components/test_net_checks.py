"""core/net_checks.py on its own: what each check accepts, normalises and refuses (the spec's fields use them)."""

from __future__ import annotations

import pytest

from proxmox_gpu_cluster.core.net_checks import (
    check_api_endpoint,
    check_ip,
    check_ip_or_cidr,
    check_proxmox_endpoint,
    check_unicast,
    no_zone,
)


def test_static_addresses_are_normalised_and_need_a_usable_host_address() -> None:
    assert check_ip_or_cidr("dhcp") == "dhcp"
    assert check_ip_or_cidr("10.0.0.5/24") == "10.0.0.5/24"
    for bad, words in [
        ("10.0.0.5", "needs a prefix length"),
        ("10.0.0.5/255.255.255.0", "no netmasks"),
        ("10.0.0.0/24", "network address"),
        ("10.0.0.255/24", "broadcast address"),
        ("10.0.0.5/31", "/8 to /30"),
    ]:
        with pytest.raises(ValueError, match=words):
            check_ip_or_cidr(bad)


@pytest.mark.parametrize("value", ["fe80::1%eth0", "fe80::1%25eth0"])
def test_zone_ids_are_refused_where_an_address_is_expected(value: str) -> None:
    with pytest.raises(ValueError):
        no_zone(value)
    with pytest.raises(ValueError):
        check_ip(value)


def test_unicast_refuses_addresses_no_other_machine_reaches() -> None:
    assert check_unicast("10.20.0.11") == "10.20.0.11"
    for bad in ("127.0.0.1", "224.0.0.1", "169.254.1.1", "0.0.0.0", "255.255.255.255"):
        with pytest.raises(ValueError):
            check_unicast(bad)


def test_endpoints_refuse_junk_and_quote_it_bounded() -> None:
    assert check_proxmox_endpoint("https://pve1.example.com:8006/")
    assert check_api_endpoint("10.0.0.10:6443")
    huge = "x" * 200_000
    for check in (check_proxmox_endpoint, check_api_endpoint):
        with pytest.raises(ValueError) as err:
            check(huge)
        assert len(str(err.value)) < 500
