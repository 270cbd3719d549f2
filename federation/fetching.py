"""Every HTTP request federation makes (a catalogue page, an unpaid probe, a paid call) goes to
an address the SSRF guard allows (skills/net_guard.py), and only there.

Per request: http(s) only, no credentials in the URL; the host name refused outright when it
names a metadata service or a private-use zone, else resolved once and every address checked
(`check_address`: public unicast only, unless the operator's allow list lifts it; the cloud
metadata addresses never); the connection pinned to those addresses (`PinnedConnector`: no second
lookup, no DNS rebinding). Nothing the environment or the answer says changes where it goes: no
proxy from the environment, no redirect followed (a 3xx is returned as it is), no cookies kept.
The body is read as sent (no decompression, `Accept-Encoding: identity`) up to a size, and the
whole request, from the lookup to the last byte, lasts at most its timeout.

Errors name the URL (without its query, which may carry a caller's input) and what went wrong;
never a header's value."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import ip_address

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from payments.codec import MAX_JSON_HEADER_BYTES
from skills.net_guard import (
    ForbiddenAddress,
    IPAddress,
    IPNetwork,
    PinnedConnector,
    check_address,
    forbidden_name_reason,
)

_CHUNK = 64 * 1024
# one header line: a PAYMENT-REQUIRED quote as large as the 402 reader takes (aiohttp's default
# of 8 KiB would refuse a seller's larger bazaar description before it is read)
_MAX_FIELD_BYTES = MAX_JSON_HEADER_BYTES + 1024
_USER_AGENT = "paywire-federation"


@dataclass(frozen=True)
class FetchLimits:
    timeout_seconds: float = 30.0         # whole request, connect to last byte
    max_answer_bytes: int = 10 * 2**20    # a paid answer
    max_catalogue_bytes: int = 8 * 2**20  # one catalogue page / manifest / 402 body (the default)


@dataclass(frozen=True)
class Fetched:
    status: int
    headers: Mapping[str, str]  # case-insensitive
    body: bytes

    @property
    def media_type(self) -> str:
        return self.headers.get("Content-Type") or "application/octet-stream"


class FetchError(Exception):
    """A request that could not be made or read; `message` names the URL and what went wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class FetchTimeout(FetchError):
    """The request took longer than its timeout (from the lookup to the last byte)."""


def shown(url: str) -> str:
    """A URL as errors show it: without credentials, query or fragment (a caller's input, a
    secret), bounded."""
    base = url.split("#", 1)[0].split("?", 1)[0]
    scheme, sep, rest = base.partition("://")
    if sep:
        authority, slash, path = rest.partition("/")
        base = f"{scheme}://{authority.rsplit('@', 1)[-1]}{slash}{path}"
    return base[:200]


class GuardedFetch:
    """The federation's HTTP client: one guarded connection per request (module docstring)."""

    def __init__(self, allow_networks: tuple[IPNetwork, ...] = (),
                 limits: FetchLimits = FetchLimits()) -> None:
        self.allow_networks = allow_networks
        self.limits = limits
        self._closed = False

    async def request(self, method: str, url: str, *, body: bytes | None = None,
                      headers: Mapping[str, str] | None = None, max_bytes: int | None = None,
                      timeout_seconds: float | None = None) -> Fetched:
        """The answer to one request, its body whole (at most `max_bytes`, by default the
        catalogue limit). FetchError when it cannot be made or read, FetchTimeout past
        `timeout_seconds` (by default the limits')."""
        where = f"{method} {shown(url)}"
        if self._closed:
            raise FetchError(f"{where}: the federation client is closed")
        target = _target(url, where)
        limit = self.limits.max_catalogue_bytes if max_bytes is None else max_bytes
        seconds = self.limits.timeout_seconds if timeout_seconds is None else timeout_seconds
        try:
            async with asyncio.timeout(seconds):
                addresses = await self._addresses(target, where)
                return await _exchange(method, target, addresses, body, headers, limit, where)
        except TimeoutError:
            raise FetchTimeout(f"{where}: no complete answer within {seconds:g} s") from None

    async def aclose(self) -> None:
        """Nothing is pooled (a connection per request); later requests are refused."""
        self._closed = True

    async def _addresses(self, target: URL, where: str) -> list[IPAddress]:
        """The host's addresses, every one allowed (a name with one forbidden address is refused
        outright: which one a connection would take is not ours to pick)."""
        host = str(target.raw_host)
        try:
            literal: IPAddress | None = ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [literal]
        else:
            reason = forbidden_name_reason(host)
            if reason is not None:
                raise FetchError(f"{where}: {host} is {reason}; not fetched")
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, target.port, type=socket.SOCK_STREAM)
            except socket.gaierror as exc:
                raise FetchError(f"{where}: cannot resolve {host} ({exc.strerror})") from None
            addresses = list(dict.fromkeys(ip_address(str(info[4][0]).split("%", 1)[0])
                                           for info in infos))
            if not addresses:
                raise FetchError(f"{where}: {host} has no address")
        for ip in addresses:
            try:
                check_address(ip, self.allow_networks)
            except ForbiddenAddress as exc:
                named = host if literal is not None else f"{host} resolves to {ip}, which"
                raise FetchError(f"{where}: {named} is {exc.reason}; not fetched (only public "
                                 "addresses, or the operator's allowed networks)") from None
        return addresses


def _target(url: str, where: str) -> URL:
    try:
        target = URL(url)
    except (ValueError, TypeError):
        raise FetchError(f"{where}: not a URL") from None
    if target.scheme not in ("http", "https") or not target.raw_host:
        raise FetchError(f"{where}: only http:// and https:// URLs with a host are fetched")
    if target.user is not None or target.password is not None:
        raise FetchError(f"{where}: a URL with credentials is not fetched")
    return target.with_fragment(None)


async def _exchange(method: str, target: URL, addresses: list[IPAddress], body: bytes | None,
                    headers: Mapping[str, str] | None, limit: int, where: str) -> Fetched:
    sent = CIMultiDict(headers or {})
    sent["Accept-Encoding"] = "identity"  # the body is read as sent: no decompression bomb
    sent.setdefault("User-Agent", _USER_AGENT)
    try:
        async with aiohttp.ClientSession(
            connector=PinnedConnector(str(target.raw_host), addresses),
            trust_env=False,  # an environment proxy would bypass the guard
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            max_field_size=_MAX_FIELD_BYTES,
            timeout=aiohttp.ClientTimeout(total=None),  # the caller's asyncio.timeout bounds it all
        ) as session, session.request(method, target, data=body, headers=sent,
                                      allow_redirects=False) as response:
            declared = response.content_length
            if declared is not None and declared > limit:
                raise FetchError(f"{where}: the answer is {declared} bytes, over the "
                                 f"{limit}-byte limit")
            data = await _read_bounded(response.content, limit, where)
            return Fetched(response.status, CIMultiDictProxy(CIMultiDict(response.headers)), data)
    except FetchError:
        raise
    except aiohttp.ClientConnectorCertificateError:
        raise FetchError(f"{where}: TLS certificate verification failed") from None
    except aiohttp.ClientSSLError:
        raise FetchError(f"{where}: TLS handshake failed") from None
    except aiohttp.ClientConnectorError as exc:
        why = exc.os_error.strerror or type(exc.os_error).__name__
        raise FetchError(f"{where}: could not connect ({why})") from None
    except aiohttp.ServerDisconnectedError:
        raise FetchError(f"{where}: the server closed the connection without a complete "
                         "answer") from None
    except (aiohttp.ClientResponseError, aiohttp.ClientPayloadError) as exc:
        # (their text may quote the header bytes that were malformed: the class name only)
        raise FetchError(f"{where}: malformed HTTP answer ({type(exc).__name__})") from None
    except aiohttp.ClientError as exc:
        raise FetchError(f"{where}: the request failed ({type(exc).__name__})") from None


async def _read_bounded(stream: aiohttp.StreamReader, limit: int, where: str) -> bytes:
    data = bytearray()
    while True:
        chunk = await stream.read(_CHUNK)
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > limit:
            raise FetchError(f"{where}: the answer is over the {limit}-byte limit")
