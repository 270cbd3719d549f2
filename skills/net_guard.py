"""Which addresses the gateway may connect to on a caller's behalf (the SSRF guard).

A resource that sends requests to caller-given URLs must not become a way into the gateway's own
networks. The rule is: only public unicast addresses. Refused are loopback, private (RFC 1918,
unique local), carrier-grade NAT, link-local (where the cloud metadata services live), multicast,
unspecified, documentation, benchmarking and reserved ranges, and IPv6 forms that embed a refused
IPv4 address (IPv4-mapped, NAT64, 6to4). Python's `is_global` is the backstop for any other
special-purpose range.

An operator allow-list (CIDRs) lifts the rule for chosen networks (tests use 127.0.0.1/32), except
for the cloud metadata addresses, which are refused whatever the list says: nobody needs to test a
webhook against them, and reaching them is the classic way SSRF leaks credentials.

Host names are checked for the few that name metadata services or private-use zones; every other
name must be resolved and each of its addresses checked with `check_address` before connecting, and
the connection made with a `PinnedConnector`: it goes to those checked addresses only (no second
lookup, no DNS rebinding), while the Host header, TLS SNI and certificate verification keep the name.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

_PRIVATE = "a private network address"
_DOCUMENTATION = "a documentation address"

_V4_RULES: tuple[tuple[IPv4Network, str], ...] = tuple((IPv4Network(net), why) for net, why in (
    ("0.0.0.0/8", "an unspecified ('this network') address"),
    ("10.0.0.0/8", _PRIVATE),
    ("100.64.0.0/10", "a carrier-grade NAT (shared) address"),
    ("127.0.0.0/8", "a loopback address"),
    ("169.254.0.0/16", "a link-local address"),
    ("172.16.0.0/12", _PRIVATE),
    ("192.0.0.0/24", "an IETF protocol assignment address"),
    ("192.0.2.0/24", _DOCUMENTATION),
    ("192.88.99.0/24", "a 6to4 relay address"),
    ("192.168.0.0/16", _PRIVATE),
    ("198.18.0.0/15", "a benchmarking address"),
    ("198.51.100.0/24", _DOCUMENTATION),
    ("203.0.113.0/24", _DOCUMENTATION),
    ("224.0.0.0/4", "a multicast address"),
    ("240.0.0.0/4", "a reserved address"),  # includes the broadcast 255.255.255.255
))

_V6_RULES: tuple[tuple[IPv6Network, str], ...] = tuple((IPv6Network(net), why) for net, why in (
    ("::/128", "an unspecified address"),
    ("::1/128", "a loopback address"),
    # IPv4-compatible (deprecated): some stacks still route these to the embedded IPv4 address.
    ("::/96", "an IPv4-compatible (deprecated) address"),
    ("64:ff9b:1::/48", "a local-use NAT64 address"),
    ("100::/64", "a discard-only address"),
    ("2001::/23", "an IETF protocol assignment address (Teredo, ORCHID...)"),
    ("2001:db8::/32", _DOCUMENTATION),
    ("3fff::/20", _DOCUMENTATION),
    ("fc00::/7", "a unique local (private) address"),
    ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a site-local (deprecated) address"),
    ("ff00::/8", "a multicast address"),
))

_NAT64 = IPv6Network("64:ff9b::/96")

# AWS/GCP/Azure/Oracle (169.254.169.254), AWS ECS task metadata, Alibaba, AWS over IPv6.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254",
))

METADATA_NAMES = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "instance-data",
    "instance-data.ec2.internal",
})
# Private-use zones (RFC 8375 home.arpa, RFC 6762 .local, ICANN's .internal): never public.
PRIVATE_SUFFIXES = (".internal", ".local", ".home.arpa")


class ForbiddenAddress(ValueError):
    """The gateway will not connect there; `reason` says what kind of address it is."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"{address} is {reason}")
        self.address = address
        self.reason = reason


def embedded_ipv4(ip: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, NAT64 or 6to4), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def forbidden_reason(ip: IPAddress) -> str | None:
    """Why the address is not a public unicast address, or None when it is one."""
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if isinstance(ip, IPv6Address):
        inner = embedded_ipv4(ip)
        if inner is not None:
            why = forbidden_reason(inner)
            return f"{why} (embedded in IPv6 {ip})" if why else None
    rules = _V4_RULES if isinstance(ip, IPv4Address) else _V6_RULES
    for network, why in rules:
        if ip in network:
            return why
    if not ip.is_global:
        return "a special-purpose (non-public) address"
    return None


def check_address(ip: IPAddress, allow: tuple[IPNetwork, ...] = ()) -> None:
    """Raise ForbiddenAddress unless the gateway may connect to `ip`. The allow-list lifts every
    rule but the metadata one; an IPv4-mapped address matches the list as its IPv4 form."""
    plain = ip.ipv4_mapped if isinstance(ip, IPv6Address) and ip.ipv4_mapped else ip
    if plain in METADATA_ADDRESSES or ip in METADATA_ADDRESSES:
        raise ForbiddenAddress(str(ip), "a cloud metadata address")
    if any(plain in net or ip in net for net in allow):
        return
    reason = forbidden_reason(ip)
    if reason is not None:
        raise ForbiddenAddress(str(ip), reason)


def forbidden_name_reason(host: str) -> str | None:
    """Why a host name must not be resolved at all (metadata service, private-use zone)."""
    name = host.lower().rstrip(".")
    if name in METADATA_NAMES:
        return "a cloud metadata service name"
    if any(name == suffix[1:] or name.endswith(suffix) for suffix in PRIVATE_SUFFIXES):
        return "a private-use name (.internal, .local, .home.arpa)"
    return None


@functools.lru_cache(maxsize=16)
def parse_networks(text: str) -> tuple[IPNetwork, ...]:
    """A comma-separated list of CIDRs or addresses ("127.0.0.1/32, ::1"); ValueError naming the
    item that is not one. Host bits are ignored (10.1.2.3/8 is 10.0.0.0/8)."""
    networks: list[IPNetwork] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            networks.append(ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP network such as 127.0.0.1/32") from None
    return tuple(networks)


class PinnedResolver(AbstractResolver):
    """Answers for the checked host with the checked addresses only: the connection cannot go
    anywhere the guard did not see (no second lookup, no DNS rebinding)."""

    def __init__(self, host: str, addresses: list[IPAddress]) -> None:
        self._host = host
        self._addresses = addresses

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        if host != self._host:
            raise OSError(f"refusing to resolve {host!r}: only {self._host!r} was checked")
        results = []
        for ip in self._addresses:
            ip_family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            if family in (socket.AF_UNSPEC, ip_family):
                results.append(ResolveResult(hostname=host, host=str(ip), port=port,
                                             family=ip_family, proto=0,
                                             flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV))
        return results

    async def close(self) -> None:
        return None


class PinnedConnector(aiohttp.TCPConnector):
    """One connection, to `host` at the checked `addresses` only (a PinnedResolver). `on_connect`
    sees the transport as soon as the connection is made (peer address, TLS session): an empty
    answer releases the connection before the caller could look."""

    def __init__(self, host: str, addresses: list[IPAddress],
                 on_connect: Callable[[asyncio.BaseTransport | None], None] | None = None) -> None:
        super().__init__(resolver=PinnedResolver(host, addresses), use_dns_cache=False,
                         force_close=True, limit=1)
        self._on_connect = on_connect

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        connection = await super().connect(req, traces, timeout)
        if self._on_connect is not None:
            self._on_connect(connection.transport)
        return connection
