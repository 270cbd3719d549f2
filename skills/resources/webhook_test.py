"""webhook-test-payload: send a test payload to a caller's webhook URL and report what happened.

Input (unknown fields are refused):
- ``url`` (required): http(s) URL, at most 2,048 characters, no credentials in it.
- ``method``: POST (default), PUT or PATCH.
- ``headers``: extra request headers (at most 32, names and values of visible ASCII, 8 KiB in
  all); hop-by-hop headers, Host, Content-Length and Expect cannot be set.
- ``payload``: the JSON object or array to send (at most 64 KiB as JSON), or
- ``event``: which realistic default to send instead (fresh ids and timestamps each call):
  ``paywire.test`` (default), ``stripe.payment_intent.succeeded``,
  ``stripe.checkout.session.completed``, ``github.push``, ``github.ping`` (each a template in
  ``webhook_events/<event>.json``).
- ``timeout_seconds``: lower the 10 s limit (at least 0.1).

Rules (skills/net_guard.py): only public unicast addresses. An IP literal is checked before the
quote; a name is resolved once at run time with the event loop's getaddrinfo, every address it
resolves to is checked, and the connection goes to those checked addresses only
(net_guard.PinnedConnector), while the Host header, TLS SNI and certificate verification keep
the name. Redirects are reported, never followed: webhook senders (Stripe, GitHub...) do not
follow them either, so a redirect is a problem to fix. The response body is read up to 64 KiB and
the rest is left unread.

What is charged: a report is the product, so every outcome of a trip to a permitted address is
delivered and charged: 2xx, 3xx, 4xx/5xx, timeout, TLS failure, refused connection, malformed
answer, a name that does not exist. Refused and not charged: invalid input (400, before the
quote), a URL or a name that points at a forbidden address (400, before the quote for literals
and metadata names, at run time for resolved names: the claim is released), DNS that cannot
answer right now (502/504), a misconfigured gateway (503).

Settings (operator environment, read through the ResourceContext):
- ``PAYWIRE_WEBHOOK_ALLOW_NETWORKS``: comma-separated CIDRs exempt from the rules (tests use
  127.0.0.1/32); cloud metadata addresses stay refused.
- ``PAYWIRE_WEBHOOK_CA_FILE``: a PEM file of extra trust anchors, added to the system ones.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import secrets
import socket
import ssl
import string
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.resources import files
from ipaddress import ip_address
from typing import Any

import aiohttp
from yarl import URL

from skills.described import described
from skills.errors import SkillInputError, SkillUnavailableError, UpstreamError, UpstreamTimeout
from skills.net_guard import (
    ForbiddenAddress,
    IPAddress,
    IPNetwork,
    PinnedConnector,
    check_address,
    forbidden_name_reason,
    parse_networks,
)
from skills.resource_context import ResourceContext

log = logging.getLogger(__name__)

ALLOW_ENV = "PAYWIRE_WEBHOOK_ALLOW_NETWORKS"
CA_FILE_ENV = "PAYWIRE_WEBHOOK_CA_FILE"

MAX_URL_CHARS = 2048
METHODS = ("POST", "PUT", "PATCH")
MAX_HEADERS = 32
MAX_HEADER_NAME_CHARS = 128
MAX_HEADER_BYTES = 8 * 1024
MAX_PAYLOAD_BYTES = 64 * 1024
TIMEOUT_SECONDS = 10.0  # GitHub gives a webhook 10 s; the caller may only lower it
MIN_TIMEOUT_SECONDS = 0.1
CONNECT_TIMEOUT_SECONDS = 5.0
SLOW_MS = 2000.0  # slower than this risks a sender's timeout and retries
BODY_READ_CAP = 64 * 1024
EXCERPT_CHARS = 4096
RESPONSE_HEADERS_KEPT = 64
RESPONSE_HEADER_VALUE_CHARS = 1024
CERT_EXPIRY_WARNING_DAYS = 14
USER_AGENT = "paywire-webhook-test/1.0"

EVENTS = ("paywire.test", "stripe.payment_intent.succeeded", "stripe.checkout.session.completed",
          "github.push", "github.ping")
_FIELDS = ("url", "method", "headers", "payload", "event", "timeout_seconds")
_REFUSED_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "proxy-connection",
    "proxy-authorization", "te", "trailer", "upgrade", "expect",
})
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_HEADER_VALUE = re.compile(r"^[\t\x20-\x7e]*$")
_HOST_NAME = re.compile(
    r"^(?=.{1,253}\.?$)[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*\.?$")
_NUMERIC_LABEL = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)$")
_SECRET_NAME = re.compile(r"auth|token|secret|signature|cookie|key|password", re.IGNORECASE)
_NO_SUCH_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


@dataclass(frozen=True)
class WebhookRequest:
    """A validated call: what to send where."""

    url: URL
    host: str  # as the connection uses it (IDNA, brackets off)
    ip: IPAddress | None  # the host when it is an IP literal
    method: str
    headers: dict[str, str]
    payload: Any  # None: generate `event`
    event: str
    timeout: float

    @property
    def connect_timeout(self) -> float:
        return min(CONNECT_TIMEOUT_SECONDS, self.timeout)


# --- validation (before the quote) ------------------------------------------------------------

def _fail(message: str, field_name: str | None) -> SkillInputError:
    return SkillInputError(message, field=field_name)


def _parse_url(value: Any) -> tuple[URL, IPAddress | None]:
    if not isinstance(value, str) or not value.strip():
        raise _fail("field 'url' is required: the http(s) URL of your webhook endpoint", "url")
    if len(value) > MAX_URL_CHARS:
        raise _fail(f"field 'url' is {len(value)} characters; at most {MAX_URL_CHARS}", "url")
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in value):
        raise _fail("field 'url' must not contain spaces or control characters", "url")
    try:
        url = URL(value)
    except ValueError as exc:
        raise _fail(f"field 'url' is not a valid URL: {exc}", "url") from None
    if url.scheme not in ("http", "https"):
        raise _fail(f"field 'url' must start with http:// or https://, got {url.scheme or 'no'} "
                    "scheme", "url")
    if url.user is not None or url.password is not None:
        raise _fail("field 'url' must not carry credentials (user:password@); send an "
                    "Authorization header in 'headers' instead", "url")
    if not url.raw_host:
        raise _fail("field 'url' has no host", "url")
    if not url.port:
        raise _fail("field 'url' has port 0; use a port from 1 to 65535", "url")
    return url.with_fragment(None), _host_ip(url.raw_host)


def _host_ip(host: str) -> IPAddress | None:
    """The IP literal a host is, None for a name; refuses ambiguous numeric forms (0x7f.1, 127.1,
    2130706433) that resolvers would read as IPv4 addresses behind the guard's back."""
    plain = host.rstrip(".")
    try:
        return ip_address(plain)
    except ValueError:
        pass
    if ":" in host or "%" in host or not _HOST_NAME.match(host):
        raise _fail(f"field 'url' has an invalid host {host!r}", "url")
    if all(_NUMERIC_LABEL.match(label) for label in plain.split(".")):
        raise _fail(f"field 'url' host {host!r} is a numeric form; write an IPv4 address as four "
                    "decimal numbers (a.b.c.d)", "url")
    reason = forbidden_name_reason(host)
    if reason is not None:
        raise _fail(f"field 'url' host {host!r} is {reason}; only public hosts can be tested",
                    "url")
    return None


def _parse_method(value: Any) -> str:
    if value is None:
        return "POST"
    if not isinstance(value, str) or value.upper() not in METHODS:
        raise _fail(f"field 'method' must be one of {', '.join(METHODS)}", "method")
    return value.upper()


def _parse_headers(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail("field 'headers' must be an object of header names to string values", "headers")
    if len(value) > MAX_HEADERS:
        raise _fail(f"field 'headers' has {len(value)} headers; at most {MAX_HEADERS}", "headers")
    seen: set[str] = set()
    total = 0
    for name, header_value in value.items():
        where = f"headers.{name}"
        lower = name.lower()
        if not _TOKEN.match(name) or len(name) > MAX_HEADER_NAME_CHARS:
            raise _fail(f"header name {name!r} is not a valid HTTP header name", where)
        if lower in _REFUSED_HEADERS or lower.startswith("proxy-"):
            raise _fail(f"header {name!r} cannot be set: the gateway manages the connection, the "
                        "host and the body length", where)
        if lower in seen:
            raise _fail(f"header {name!r} is given twice (names are case-insensitive)", where)
        if not isinstance(header_value, str) or not _HEADER_VALUE.match(header_value):
            raise _fail(f"header {name!r} must be a string of visible ASCII characters", where)
        seen.add(lower)
        total += len(name) + len(header_value) + 4
    if total > MAX_HEADER_BYTES:
        raise _fail(f"field 'headers' holds {total} bytes; at most {MAX_HEADER_BYTES}", "headers")
    return dict(value)


def _parse_body(payload: dict[str, Any]) -> tuple[Any, str]:
    body, event = payload.get("payload"), payload.get("event")
    if body is not None and event is not None:
        raise _fail("send either 'payload' (your JSON) or 'event' (a realistic default), not both",
                    "event")
    if event is not None and event not in EVENTS:
        raise _fail(f"field 'event' must be one of {', '.join(EVENTS)}", "event")
    if body is not None:
        if not isinstance(body, dict | list):
            raise _fail("field 'payload' must be a JSON object or array", "payload")
        size = len(_encode(body))
        if size > MAX_PAYLOAD_BYTES:
            raise _fail(f"field 'payload' is {size:,} bytes as JSON; at most {MAX_PAYLOAD_BYTES:,}",
                        "payload")
    return body, event or EVENTS[0]


def _parse_timeout(value: Any) -> float:
    if value is None:
        return TIMEOUT_SECONDS
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            MIN_TIMEOUT_SECONDS <= value <= TIMEOUT_SECONDS):
        raise _fail(f"field 'timeout_seconds' must be a number from {MIN_TIMEOUT_SECONDS} to "
                    f"{TIMEOUT_SECONDS} (it can lower the limit, not raise it)", "timeout_seconds")
    return float(value)


def parse(payload: Any) -> WebhookRequest:
    """The validated request; SkillInputError naming the field when it cannot run."""
    if not isinstance(payload, dict):
        raise _fail("the input must be a JSON object with at least 'url'", None)
    for key in payload:
        if key not in _FIELDS:
            raise _fail(f"field '{key}' is not accepted; accepted: {', '.join(_FIELDS)}", str(key))
    url, ip = _parse_url(payload.get("url"))
    body, event = _parse_body(payload)
    return WebhookRequest(
        url=url, host=str(url.raw_host), ip=ip, method=_parse_method(payload.get("method")),
        headers=_parse_headers(payload.get("headers")), payload=body, event=event,
        timeout=_parse_timeout(payload.get("timeout_seconds")),
    )


# The URL's shape: http(s), a host (a name or an IP literal), a port, no spaces or control characters
# (that the host is well formed and public is checked on the name itself: `_host_ip`)
_URL_SHAPE = r"^[Hh][Tt][Tt][Pp][Ss]?://(?:[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?(?:[/?#][^\x00-\x20\x7f]*)?$"


@described({"properties": {  # what the resource file's schema does not say
    **{name: {} for name in _FIELDS},
    "url": {"pattern": _URL_SHAPE, "not": {"pattern": "[\\x00-\\x20\\x7f]"}},  # ($ passes a final \n)
    "headers": {"propertyNames": {"pattern": _TOKEN.pattern, "maxLength": MAX_HEADER_NAME_CHARS},
                "additionalProperties": {"pattern": _HEADER_VALUE.pattern}}},
    "additionalProperties": False, "not": {"required": ["payload", "event"]}})
def validate(payload: dict[str, Any], context: ResourceContext) -> None:
    """Refuse, before the quote, what cannot run, forbidden IP literals included (a name is
    checked when it is resolved, at run time)."""
    request = parse(payload)
    if request.ip is not None:
        _refuse_forbidden(request.ip, _allow_list(context), request.host)


def ready(context: ResourceContext) -> None:
    """Before every quote: the operator's settings parse."""
    _allow_list(context)
    _ssl_context(context.env(CA_FILE_ENV))


def _refuse_forbidden(ip: IPAddress, allow: tuple[IPNetwork, ...], host: str) -> None:
    try:
        check_address(ip, allow)
    except ForbiddenAddress as exc:
        where = str(ip) if host == str(ip) else f"{host} resolves to {ip}, which"
        raise _fail(f"field 'url': {where} is {exc.reason}; only public addresses can be tested "
                    "(nothing was charged)", "url") from None


# --- settings -----------------------------------------------------------------------------------

def _unavailable(problem: str) -> SkillUnavailableError:
    return SkillUnavailableError(f"webhook-test-payload is misconfigured on this gateway: {problem}; "
                                 "nothing was charged")


def _allow_list(context: ResourceContext) -> tuple[IPNetwork, ...]:
    try:
        return parse_networks(context.env(ALLOW_ENV))
    except ValueError as exc:
        raise _unavailable(f"{ALLOW_ENV}: {exc}") from None


@functools.lru_cache(maxsize=4)
def _cached_ssl_context(ca_file: str) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if ca_file:
        context.load_verify_locations(cafile=ca_file)
    return context


def _ssl_context(ca_file: str) -> ssl.SSLContext:
    try:
        return _cached_ssl_context(ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise _unavailable(f"{CA_FILE_ENV} cannot be loaded ({exc})") from None


# --- the exchange -------------------------------------------------------------------------------

@dataclass
class Exchange:
    """What happened, filled in as the call progresses (so a timeout knows how far it got)."""

    started: float = field(default_factory=time.perf_counter)
    marks: dict[str, float] = field(default_factory=dict)  # resolved, connected, headers, done
    resolved: list[str] = field(default_factory=list)
    address: str | None = None
    status: int | None = None
    reason: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    truncated: bool = False
    tls: dict[str, Any] | None = None
    error: str | None = None  # a diagnosis code: timeout, tls_error, connection_error...
    detail: str | None = None
    location: str | None = None

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, time.perf_counter())

    def phase(self) -> str:
        """How far the exchange got: where a timeout struck."""
        for name, phase in (("headers", "body"), ("connected", "response"), ("resolved", "connect")):
            if name in self.marks:
                return phase
        return "dns"

    def elapsed_ms(self) -> float:
        end = self.marks.get("done", time.perf_counter())
        return round((end - self.started) * 1000, 1)

    def connected(self, transport: asyncio.BaseTransport | None) -> None:
        """The connection is made: record the peer and the TLS session."""
        self.mark("connected")
        if transport is not None:
            peer = transport.get_extra_info("peername")
            self.address = str(peer[0]) if peer else None
            ssl_object = transport.get_extra_info("ssl_object")
            if ssl_object is not None:
                self.tls = tls_details(ssl_object)


async def _resolve(request: WebhookRequest, allow: tuple[IPNetwork, ...],
                   exchange: Exchange) -> list[IPAddress] | None:
    """The checked addresses of the host; None when the name does not exist (a diagnosis)."""
    if request.ip is not None:
        exchange.mark("resolved")
        exchange.resolved = [str(request.ip)]
        return [request.ip]
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(request.host, request.url.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno in _NO_SUCH_NAME:
            return None
        raise UpstreamError(f"could not resolve {request.host} right now ({exc.strerror}); "
                            "nothing was charged") from None
    addresses = list(dict.fromkeys(ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos))
    exchange.mark("resolved")
    exchange.resolved = [str(ip) for ip in addresses]
    for ip in addresses:  # every one: a name with one private address is refused outright
        try:
            _refuse_forbidden(ip, allow, request.host)
        except SkillInputError:
            log.warning("webhook test refused: %s resolves to %s", request.host, ip)
            raise
    return addresses


async def _read_capped(stream: aiohttp.StreamReader, cap: int) -> tuple[bytes, bool]:
    """At most `cap` bytes, and whether more was there (the rest is never read)."""
    data = bytearray()
    while len(data) <= cap:
        chunk = await stream.read(cap + 1 - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data[:cap]), len(data) > cap


async def _send(request: WebhookRequest, addresses: list[IPAddress], body: bytes,
                headers: dict[str, str], tls: ssl.SSLContext, exchange: Exchange) -> None:
    connector = PinnedConnector(request.host, addresses, exchange.connected)
    async with aiohttp.ClientSession(
        connector=connector, trust_env=False,  # an environment proxy would bypass the guard
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=request.connect_timeout),
        auto_decompress=False,  # no decompression bomb: the excerpt is of the bytes as sent
        cookie_jar=aiohttp.DummyCookieJar(),
    ) as session, session.request(request.method, request.url, data=body, headers=headers,
                                  allow_redirects=False, ssl=tls) as response:
        exchange.mark("headers")
        exchange.status, exchange.reason = response.status, response.reason
        exchange.headers = [(k.decode("latin-1"), v.decode("latin-1"))
                            for k, v in response.raw_headers]
        if 300 <= response.status < 400 and "Location" in response.headers:
            exchange.location = _absolute(request.url, response.headers["Location"])
        exchange.body, exchange.truncated = await _read_capped(response.content, BODY_READ_CAP)
        exchange.mark("done")


def _absolute(base: URL, location: str) -> str:
    try:
        return str(base.join(URL(location)))
    except ValueError:
        return location


def _record_failure(exchange: Exchange, exc: BaseException, request: WebhookRequest) -> None:
    """An exchange that ended in an error the report diagnoses."""
    if isinstance(exc, TimeoutError):
        limit = request.connect_timeout if exchange.phase() == "connect" else request.timeout
        exchange.error, exchange.detail = "timeout", (
            f"no {_PHASE_WORDS[exchange.phase()]} within {limit:g} s")
    elif isinstance(exc, aiohttp.ClientConnectorCertificateError):
        cert_error = exc.certificate_error
        why = getattr(cert_error, "verify_message", None) or str(cert_error)
        exchange.error, exchange.detail = "tls_error", f"certificate verification failed: {why}"
    elif isinstance(exc, aiohttp.ClientSSLError):
        exchange.error, exchange.detail = "tls_error", f"TLS handshake failed: {exc.os_error}"
    elif isinstance(exc, aiohttp.ClientConnectorError):
        errno = exc.os_error.errno
        why = os.strerror(errno) if errno else str(exc.os_error)
        exchange.error, exchange.detail = "connection_error", f"could not connect: {why}"
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        exchange.error, exchange.detail = "connection_error", "the server closed the connection " \
            "without a complete answer"
    elif isinstance(exc, aiohttp.ClientResponseError | aiohttp.ClientPayloadError):
        exchange.error, exchange.detail = "bad_response", f"malformed HTTP answer: {exc}"
    else:
        exchange.error, exchange.detail = "connection_error", f"{type(exc).__name__}: {exc}"


_PHASE_WORDS = {"dns": "DNS answer", "connect": "connection", "response": "response headers",
                "body": "complete response body"}


def tls_details(ssl_object: ssl.SSLObject | ssl.SSLSocket) -> dict[str, Any]:
    """Protocol, cipher and the verified peer certificate's names and validity."""
    cipher = ssl_object.cipher()
    cert = ssl_object.getpeercert() or {}
    not_after = cert.get("notAfter")
    days_left = None
    if isinstance(not_after, str):
        days_left = int((ssl.cert_time_to_seconds(not_after) - time.time()) // 86400)
    return {
        "version": ssl_object.version(),
        "cipher": cipher[0] if cipher else None,
        "bits": cipher[2] if cipher else None,
        "certificate": {
            "subject": _distinguished_name(cert.get("subject", ())),
            "issuer": _distinguished_name(cert.get("issuer", ())),
            "not_before": cert.get("notBefore"),
            "not_after": not_after,
            "days_left": days_left,
            "subject_alt_names": [f"{kind}:{value}" for kind, value in cert.get("subjectAltName", ())],
        },
    }


_DN_SHORT = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
             "countryName": "C", "stateOrProvinceName": "ST", "localityName": "L"}


def _distinguished_name(rdns: Any) -> str:
    return ", ".join(f"{_DN_SHORT.get(k, k)}={v}" for rdn in rdns for k, v in rdn)


# --- the outgoing request -----------------------------------------------------------------------

def _encode(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def _outgoing_headers(request: WebhookRequest, event_headers: dict[str, str]) -> dict[str, str]:
    """Defaults, then the event's headers, then the caller's (which win, case-insensitively)."""
    merged: dict[str, tuple[str, str]] = {}
    defaults = {"User-Agent": USER_AGENT, "Content-Type": "application/json", "Accept": "*/*",
                "Accept-Encoding": "identity"}
    for source in (defaults, event_headers, request.headers):
        for name, value in source.items():
            merged[name.lower()] = (name, value)
    return dict(merged.values())


def _redacted(headers: dict[str, str]) -> dict[str, str]:
    """The sent headers as the report shows them: secrets are not echoed (reports are stored)."""
    return {k: ("[redacted]" if _SECRET_NAME.search(k) else v) for k, v in headers.items()}


# Sample events: skills/resources/webhook_events/<event>.json, {"headers": {...}, "body": ...}.
# Their strings may hold placeholders, filled in afresh for every call (below). A `#label`
# ({hex:6#after}) gives the same value wherever that label appears in one event. A placeholder that
# is a whole string gives its value as it is (an integer stays one); inside text, its text.
_PLACEHOLDERS: dict[str, Callable[[int, str], Any]] = {
    "hex": lambda n, url: secrets.token_hex(n),  # {hex:N}: random hex of N bytes
    "digits": lambda n, url: "".join(secrets.choice(string.digits) for _ in range(n)),  # as text
    "below": lambda n, url: secrets.randbelow(n),  # {below:N}: a random integer under N
    "uuid": lambda n, url: str(uuid.uuid4()),
    "now": lambda n, url: int(time.time()),  # Unix time
    "now_iso": lambda n, url: datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
    "url": lambda n, url: url,  # the webhook URL
}
_PLACEHOLDER = re.compile(r"\{(" + "|".join(_PLACEHOLDERS) + r")(?::(\d+))?(?:#(\w+))?\}")


def _event_template(event: str) -> dict[str, Any]:
    return json.loads(files(__package__).joinpath("webhook_events", f"{event}.json").read_text("utf-8"))


_EVENT_TEMPLATES = {event: _event_template(event) for event in EVENTS}


def _fill(template: Any, url: str, labelled: dict[str, Any]) -> Any:
    """The template with its placeholders filled in (see above)."""
    if isinstance(template, dict):
        return {k: _fill(v, url, labelled) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill(v, url, labelled) for v in template]
    if not isinstance(template, str):
        return template

    def value(match: re.Match[str]) -> Any:
        kind, arg, label = match.groups()
        if label is None:
            return _PLACEHOLDERS[kind](int(arg or 0), url)
        if label not in labelled:
            labelled[label] = _PLACEHOLDERS[kind](int(arg or 0), url)
        return labelled[label]

    whole = _PLACEHOLDER.fullmatch(template)
    if whole is not None:
        return value(whole)
    return _PLACEHOLDER.sub(lambda m: str(value(m)), template)


def default_payload(event: str, url: str) -> tuple[Any, dict[str, str]]:
    """A realistic event body with fresh ids and timestamps, and the headers its sender adds."""
    template = _EVENT_TEMPLATES[event]
    labelled: dict[str, Any] = {}
    body = _fill(template["body"], url, labelled)
    return body, {name: str(value) for name, value in _fill(template["headers"], url, labelled).items()}


# --- diagnosis and report -----------------------------------------------------------------------

_STATUS_HINTS = {
    400: "the receiver rejected the body: check the JSON shape it expects",
    401: "the receiver wants authentication: check the signature secret or Authorization header",
    403: "the receiver refused: check the signature secret, IP allow-lists or a WAF",
    404: "no handler at this path: check the URL's path",
    405: "the endpoint does not accept this method: webhooks are usually POST",
    408: "the receiver timed out reading the request",
    413: "the payload is too large for the receiver",
    415: "the receiver does not accept this Content-Type: webhooks send application/json",
    422: "the receiver could not process the payload: check the fields it requires",
    429: "the receiver is rate limiting: senders will retry later",
}


def _item(code: str, severity: str, message: str) -> dict[str, str]:
    return {"code": code, "severity": severity, "message": message}


def _status_item(status: int, location: str | None, url: URL) -> dict[str, str]:
    if 300 <= status < 400:
        where = f" to {location}" if location else " (no Location header)"
        upgrade = location is not None and location.startswith("https:") and url.scheme == "http"
        hint = "; the site upgrades to https, use the https URL" if upgrade else ""
        return _item("redirect", "error", f"answered {status}, redirecting{where}; webhook senders "
                     f"do not follow redirects, so configure the final URL{hint}")
    if status >= 500:
        return _item("non_2xx", "error", f"answered {status}: the receiver failed (a server error); "
                     "senders will retry, check the receiver's logs")
    if status >= 400:
        hint = _STATUS_HINTS.get(status, "the receiver refused the request")
        return _item("non_2xx", "error", f"answered {status}: {hint}")
    return _item("non_2xx", "error", f"answered {status}, not a 2xx success")


def diagnose(exchange: Exchange, url: URL, slow_ms: float = SLOW_MS) -> list[dict[str, str]]:
    """The problems found, most important first; a single `ok` item when there are none."""
    items: list[dict[str, str]] = []
    if exchange.error is not None:
        items.append(_item(exchange.error, "error", exchange.detail or exchange.error))
    elif exchange.status is not None and not 200 <= exchange.status < 300:
        items.append(_status_item(exchange.status, exchange.location, url))
    latency = exchange.elapsed_ms()
    if exchange.status is not None and latency > slow_ms:
        items.append(_item("slow", "warning", f"took {latency:.0f} ms (over {slow_ms:.0f} ms): "
                           "answer 2xx at once and do the work later, or senders time out and retry"))
    days_left = ((exchange.tls or {}).get("certificate") or {}).get("days_left")
    if days_left is not None and days_left < CERT_EXPIRY_WARNING_DAYS:
        items.append(_item("certificate_expiring", "warning",
                           f"the certificate expires in {days_left} days"))
    if url.scheme == "http":
        items.append(_item("plain_http", "warning", "the URL is plain http: payloads and secrets "
                           "travel unencrypted; use https"))
    if not any(i["severity"] == "error" for i in items):
        items.insert(0, _item("ok", "info", f"answered {exchange.status} in {latency:.0f} ms"))
    return items


def _response_headers(pairs: list[tuple[str, str]]) -> dict[str, str]:
    joined: dict[str, str] = {}
    for name, value in pairs:
        if name not in joined and len(joined) >= RESPONSE_HEADERS_KEPT:
            continue
        value = value[:RESPONSE_HEADER_VALUE_CHARS]
        joined[name] = f"{joined[name]}, {value}" if name in joined else value
    return joined


def _excerpt(body: bytes, headers: dict[str, str]) -> str | None:
    """The start of the body as text; None for binary or compressed bodies."""
    encoding = next((v for k, v in headers.items() if k.lower() == "content-encoding"), "identity")
    if b"\x00" in body or encoding.strip().lower() not in ("identity", ""):
        return None
    return body.decode("utf-8", errors="replace")[:EXCERPT_CHARS]


def _timings(exchange: Exchange) -> dict[str, float | None]:
    marks, start = exchange.marks, exchange.started

    def span(a: str | None, b: str) -> float | None:
        begin = start if a is None else marks.get(a)
        return round((marks[b] - begin) * 1000, 1) if begin is not None and b in marks else None

    return {"dns_ms": span(None, "resolved"), "connect_ms": span("resolved", "connected"),
            "response_ms": span("connected", "headers"), "body_ms": span("headers", "done"),
            "total_ms": exchange.elapsed_ms()}


def report(request: WebhookRequest, exchange: Exchange, sent: dict[str, str], body: bytes,
           generated: Any) -> dict[str, Any]:
    """The caller's answer: what was sent, what came back, and what it means."""
    diagnosis = diagnose(exchange, request.url)
    headers = _response_headers(exchange.headers)
    answered = exchange.status is not None
    return {
        "ok": diagnosis[0]["code"] == "ok",
        "url": str(request.url),
        "method": request.method,
        "status": exchange.status,
        "reason": exchange.reason,
        "latency_ms": exchange.elapsed_ms(),
        "timings": _timings(exchange),
        "address": exchange.address,
        "resolved": exchange.resolved,
        "request": {
            "headers": _redacted(sent), "body_bytes": len(body),
            "payload_source": "caller" if generated is None else "event",
            "event": None if generated is None else request.event, "payload": generated,
        },
        "response": {
            "headers": headers, "header_count": len(exchange.headers),
            "content_type": next((v for k, v in headers.items() if k.lower() == "content-type"), None),
            "body_bytes_read": len(exchange.body), "body_truncated": exchange.truncated,
            "body_excerpt": _excerpt(exchange.body, headers),
        } if answered else None,
        "redirect": {"location": exchange.location} if exchange.location else None,
        "tls": exchange.tls,
        "error": {"code": exchange.error, "detail": exchange.detail, "phase": exchange.phase()}
        if exchange.error else None,
        "diagnosis": diagnosis,
    }


# --- run ----------------------------------------------------------------------------------------

async def run(payload: dict[str, Any], context: ResourceContext) -> dict[str, Any]:
    """Send the test payload and report. Refusals raise (uncharged); remote failures are reported."""
    request = parse(payload)
    allow = _allow_list(context)
    tls = _ssl_context(context.env(CA_FILE_ENV))
    if request.ip is not None:
        _refuse_forbidden(request.ip, allow, request.host)
    generated, event_headers = (None, {}) if request.payload is not None else default_payload(
        request.event, str(request.url))
    body = _encode(request.payload if generated is None else generated)
    headers = _outgoing_headers(request, event_headers)
    exchange = Exchange()
    try:
        async with asyncio.timeout(request.timeout):
            addresses = await _resolve(request, allow, exchange)
            if addresses is None:
                exchange.error, exchange.detail = "dns_error", f"the name {request.host} does not exist"
            else:
                await _send(request, addresses, body, headers, tls, exchange)
    except TimeoutError as exc:
        if exchange.phase() == "dns":  # our resolver's trouble, not the caller's endpoint
            raise UpstreamTimeout(f"could not resolve {request.host} within {request.timeout:g} s; "
                                "nothing was charged") from None
        _record_failure(exchange, exc, request)
    except aiohttp.ClientError as exc:
        _record_failure(exchange, exc, request)
    exchange.mark("done")
    return report(request, exchange, headers, body, generated)
