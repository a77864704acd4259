"""Which scrape targets the service may fetch (pure: the caller resolves host names).

A URL is http(s) without credentials. Its host must be on the allow-list (a host name, an address, or a CIDR
that holds every address it resolves to), or, when public targets are allowed, resolve only to globally routable
addresses. Private, loopback, link-local and other special addresses need an allow-list entry; cloud metadata
endpoints need an entry that names them exactly (a broad CIDR is not enough).
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

METADATA_ADDRESSES = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"),
                                ipaddress.ip_address("100.100.100.200")})
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "instance-data"})

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class TargetRefused(ValueError):
    """The URL may not be fetched; the message says why."""


@dataclass(frozen=True)
class TargetPolicy:
    allowed: tuple[str, ...] = ()  # host names, addresses or CIDRs
    allow_public: bool = True

    @classmethod
    def from_setting(cls, allowed: str | Sequence[str], allow_public: bool = True) -> TargetPolicy:
        items = allowed.split(",") if isinstance(allowed, str) else allowed
        return cls(tuple(i.strip().lower() for i in items if i and i.strip()), allow_public)

    def networks(self) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
        out = []
        for item in self.allowed:
            try:
                out.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                continue  # a host name
        return out


def check_url(url: str) -> tuple[str, int, str]:
    """(scheme, port, host) of a fetchable URL shape, else ``TargetRefused``."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetRefused(f"not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise TargetRefused("must be an http:// or https:// URL")
    if not parts.hostname:
        raise TargetRefused("has no host")
    if parts.username or parts.password:
        raise TargetRefused("must not carry credentials")
    return parts.scheme, port or (443 if parts.scheme == "https" else 80), parts.hostname.lower()


def literal_address(host: str) -> Address | None:
    """The address when ``host`` is an IP literal (no resolution needed)."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def check_addresses(host: str, addresses: Iterable[Address], policy: TargetPolicy) -> None:
    """Raise ``TargetRefused`` unless every address ``host`` resolves to may be fetched under ``policy``."""
    addresses = list(addresses)
    if not addresses:
        raise TargetRefused(f"host '{host}' does not resolve")
    listed_by_name = host in policy.allowed
    networks = policy.networks()
    for address in addresses:
        exact = listed_by_name or str(address) in policy.allowed
        if host in METADATA_HOSTS or address in METADATA_ADDRESSES:
            if not exact:
                raise TargetRefused(f"{address} is a cloud metadata address; only an allow-list entry naming it "
                                    "exactly permits it")
            continue
        if exact or any(address.version == n.version and address in n for n in networks):
            continue
        if not address.is_global:
            raise TargetRefused(f"{host} resolves to the private or special address {address}, which is not on the "
                                "allow-list (SPECADVISOR_MONITOR_ALLOW)")
        if not policy.allow_public:
            raise TargetRefused(f"{host} ({address}) is not on the allow-list (SPECADVISOR_MONITOR_ALLOW)")
