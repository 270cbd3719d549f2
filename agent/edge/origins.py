"""Which web origins may drive this gateway from a browser (the `Origin` header).

A page on another site, or one that rebinds its own DNS name to this gateway's address (DNS
rebinding: the browser then counts the gateway as that page's own site), could otherwise call a
gateway it can reach, a local one included, and read the answers. The MCP transport requires a 403
for such an Origin. Allowed: the gateway's own origin (PAYWIRE_PUBLIC_URL, else http://HOST:PORT and,
when it listens on a loopback or every address, the loopback names with that port) and the origins
PAYWIRE_ALLOWED_ORIGINS lists. A request without Origin (curl, SDKs, agents: every non-browser
client) is not concerned. Standard library only: the settings check their values with `origin_of`.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def origin_of(text: str) -> str:
    """`scheme://host[:port]` as browsers send it: lower case, the scheme's default port left out.
    ValueError (saying what an origin is) for anything else: a path, a query, user info, no host."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        parts, port = None, None
    if (parts is None or parts.scheme not in _DEFAULT_PORTS or not parts.hostname
            or parts.username is not None or parts.path not in ("", "/") or parts.query
            or parts.fragment):
        raise ValueError(f"{text[:100]!r} is not an origin (scheme://host[:port], e.g. "
                         "https://app.example.com)")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    shown_port = "" if port in (None, _DEFAULT_PORTS[parts.scheme]) else f":{port}"
    return f"{parts.scheme}://{host}{shown_port}"


def own_origins(base_url: str, host: str, port: int, *, public: bool) -> frozenset[str]:
    """The gateway's own origins: its public URL's, or when it has none, http://HOST:PORT and, for a
    loopback or wildcard HOST, the loopback names a local browser uses with that port."""
    found = {origin_of(base_url)}
    if not public and _loopback_or_any(host):
        found |= {origin_of(f"http://{name}:{port}") for name in _LOOPBACK_NAMES}
    return frozenset(found)


def _loopback_or_any(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified
