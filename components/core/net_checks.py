"""Checks of network addresses, host names and URLs the spec holds. Pure (no Pulumi); each raises ValueError with
what it expected, quoting the input bounded (quoting.shown)."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from proxmox_gpu_cluster.core.quoting import LINE_BREAKERS, shown

MIN_STATIC_PREFIX = 8
MAX_STATIC_PREFIX = 30
"""Static worker addresses need a subnet with a network and a broadcast address besides them (/8 to /30)."""


def check_ip_or_cidr(value: str) -> str:
    """``dhcp`` or an IPv4 address with a prefix length (``10.0.0.5/24``): not a netmask, not the subnet's network
    or broadcast address."""
    if value == "dhcp":
        return value
    address, slash, prefix = value.partition("/")
    if not slash:
        example = value if len(value) <= len("255.255.255.255") else "10.0.0.5"  # an IPv4 address, or junk
        raise ValueError(f"static address needs a prefix length (e.g. {example}/24)")
    if not re.fullmatch(r"[0-9]{1,2}", prefix):
        raise ValueError(f"expected a prefix length after '/', like 10.0.0.5/24; got {shown(value)} (no netmasks)")
    try:
        iface = ipaddress.IPv4Interface(f"{address}/{int(prefix)}")
    except ValueError:
        raise ValueError(
            f"expected 'dhcp' or an IPv4 address with prefix like 10.0.0.5/24, got {shown(value)}"
        ) from None
    if not MIN_STATIC_PREFIX <= iface.network.prefixlen <= MAX_STATIC_PREFIX:
        raise ValueError(f"prefix /{prefix}: use /{MIN_STATIC_PREFIX} to /{MAX_STATIC_PREFIX} for a static address")
    if iface.ip in (iface.network.network_address, iface.network.broadcast_address):
        which = "network" if iface.ip == iface.network.network_address else "broadcast"
        raise ValueError(f"{iface.ip} is the {which} address of {iface.network}")
    return f"{iface.ip}/{iface.network.prefixlen}"


def check_unicast(value: str) -> str:
    """An address (``10.0.0.5`` or ``10.0.0.5/24``) a machine on the network can be reached at: not loopback,
    multicast, link-local, unspecified (``0.0.0.0``) or reserved (``240.0.0.0/4``, the broadcast address)."""
    no_zone(value)
    ip = ipaddress.ip_interface(value).ip
    kinds = [
        ("loopback", ip.is_loopback),
        ("multicast", ip.is_multicast),
        ("link-local", ip.is_link_local),
        ("unspecified", ip.is_unspecified),
        ("reserved", ip.is_reserved),
    ]
    kind = next((k for k, hit in kinds if hit), None)
    if kind is not None:
        raise ValueError(f"{ip} is a {kind} address; use a unicast address other machines reach this one at")
    return value


def no_zone(value: str) -> str:
    """Refuse an IPv6 zone id (``fe80::1%eth0``, RFC 4007 section 11), which Python's ``ipaddress`` (3.9+) accepts:
    it names an interface of the machine reading the config, not an address another machine reaches."""
    if "%" in value:
        address = shown(value.split("%", 1)[0])
        raise ValueError(f"{address} carries an IPv6 zone id (%...), which names an interface of one machine; give "
                         "the address without it")  # fmt: skip
    return value


def check_ip(value: str) -> str:
    no_zone(value)
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"not an IP address: {shown(value)}") from None


def check_ipv4(value: str) -> str:
    try:
        return str(ipaddress.IPv4Address(value))
    except ValueError:
        raise ValueError(f"not an IPv4 address: {shown(value)}") from None


_HOST_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?"
DNS_NAME = rf"^{_HOST_LABEL}(\.{_HOST_LABEL})*$"


def check_host(value: str) -> str:
    """A DNS name (RFC 1123) or an IP address (without an IPv6 zone id)."""
    no_zone(value)
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    if len(value) > 253 or not re.fullmatch(DNS_NAME, value):
        raise ValueError(f"expected a host name or IP address, got {value[:80]!r}")
    return value


def check_port(value: str, what: str) -> int:
    # [0-9], not isdigit(): str.isdigit() accepts superscripts and other scripts' digits that int() refuses.
    if not re.fullmatch(r"[0-9]{1,5}", value) or not 1 <= int(value) <= 65535:
        raise ValueError(f"{what}: port {value[:12]!r} is not between 1 and 65535")
    return int(value)


def check_api_endpoint(value: str) -> str:
    """``host:port`` (a DNS name or IPv4) or ``[IPv6]:port``, as kubeadm's ``apiServerEndpoint`` takes it."""
    no_zone(value)
    match = re.fullmatch(r"\[([^\]]+)\]:(\w+)|([^\[\]:]+):(\w+)", value)
    if match is None:
        raise ValueError(f"expected host:port or [IPv6]:port, got {value[:80]!r}")
    if match[1] is not None:
        try:
            address = ipaddress.IPv6Address(match[1])
        except ValueError:
            raise ValueError(f"{shown(match[1])} is not an IPv6 address") from None
        return f"[{address}]:{check_port(match[2], value)}"
    return f"{check_host(match[3])}:{check_port(match[4], value)}"


def endpoint_host(value: str) -> str:
    """The host of a validated ``api_endpoint`` value, without brackets."""
    return value.rsplit(":", 1)[0].strip("[]")


MAX_URL_LENGTH = 2048


def check_http_url(value: str) -> str:
    """An http(s) URL with a valid host and port and no whitespace or control characters."""
    if len(value) > MAX_URL_LENGTH or re.search(rf"[\s{LINE_BREAKERS}]", value):
        raise ValueError("expected an http(s) URL without spaces or control characters")
    try:
        parts = urlsplit(value)
        port_number = parts.port
    except ValueError:
        raise ValueError(f"not a valid URL: {value[:80]!r}") from None
    if parts.username is not None or parts.password is not None:
        # Never echo the URL: what it carries is the secret.
        raise ValueError(
            "credentials in a URL (user:password@host) would be stored in plain text in the Pulumi state; "
            "use a URL without them"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL with a host, got {value[:80]!r}")
    check_host(parts.hostname)
    if port_number == 0:
        raise ValueError(f"port 0 in {value[:80]!r}")
    return value


def check_proxmox_endpoint(value: str) -> str:
    """The Proxmox API URL: http(s), a host, an optional port, no path beyond ``/``."""
    check_http_url(value)
    parts = urlsplit(value)
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"expected https://<host>[:port]/ without a path, query or credentials, got {value[:80]!r}")
    return value
