"""Running the app under uvicorn, set up for the proxy hot path (see bench/README.md)."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("paywire.serving")

STARTUP_FAILURE = 3  # uvicorn's exit code when the app did not start

# Access lines are logged at INFO: below that level uvicorn would still format each one.
_ACCESS_LOG_LEVELS = {"trace", "debug", "info"}


HEADER_TIMEOUT_SECONDS = 10.0
BODY_TIMEOUT_SECONDS = 60.0
_TIMEOUT_ANSWER = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                   b"connection: close\r\ncontent-length: %d\r\n\r\n%s")


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with read deadlines, which uvicorn lacks: a client must send a
    request's headers within `header_timeout` of starting it (or of connecting), and its body
    within `body_timeout` of the headers. Otherwise the connection is closed (with a 408 when no
    answer has started), so slow or idle clients cannot hold file descriptors forever
    (slowloris). Between requests uvicorn's own keep-alive timeout applies."""

    header_timeout = HEADER_TIMEOUT_SECONDS
    body_timeout = BODY_TIMEOUT_SECONDS

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout, "headers")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.header_timeout, "headers")

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.body_timeout, "body")

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, what, seconds)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, what: str, seconds: float) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        client = "{}:{}".format(*self.client) if self.client else "a client"
        log.warning("closed %s: request %s not received within %.0f s", client, what, seconds)
        answering = self.cycle is not None and self.cycle.response_started
        if not answering:
            body = (b'{"error":{"message":"request %s not received within %.0f s","type":'
                    b'"invalid_request_error","param":null,"code":"request_timeout"}}'
                    % (what.encode(), seconds))
            self.transport.write(_TIMEOUT_ANSWER % (len(body), body))
        if self.cycle is not None:
            self.cycle.disconnected = True  # the app's receive() now says http.disconnect
            self.cycle.message_event.set()
        self.transport.close()


def deadline_protocol(header_timeout: float, body_timeout: float) -> type[DeadlineProtocol]:
    """The protocol class with these deadlines (uvicorn instantiates it per connection)."""
    return type("Deadlines", (DeadlineProtocol,), {"header_timeout": header_timeout,
                                                   "body_timeout": body_timeout})


def uvicorn_config(app: Any, *, host: str, port: int, log_level: str = "info",
                   header_timeout: float = HEADER_TIMEOUT_SECONDS,
                   body_timeout: float = BODY_TIMEOUT_SECONDS, json_logs: bool = False,
                   trusted_proxies: Sequence[str] = ()) -> uvicorn.Config:
    """`json_logs`: uvicorn installs no handlers of its own, so its lines (the access line too,
    with the request id) go to the root's JSON handler (hygiene.configure_logging).
    `trusted_proxies` (PAYWIRE_TRUSTED_PROXIES): only from these are X-Forwarded-For and
    X-Forwarded-Proto believed (uvicorn then puts the real client in the scope, which the
    per-client limits key on); none: the headers are ignored (uvicorn's own default trusts them
    from 127.0.0.1, so anything on the host could pose as any client)."""
    extra: dict[str, Any] = {"log_config": None} if json_logs else {}
    return uvicorn.Config(app, host=host, port=port, loop="uvloop",
                          http=deadline_protocol(header_timeout, body_timeout),
                          log_level=log_level, proxy_headers=bool(trusted_proxies),
                          forwarded_allow_ips=list(trusted_proxies) or None,
                          access_log=str(log_level).lower() in _ACCESS_LOG_LEVELS, **extra)


# Young objects collected once 10,000 more are alive, not 700: a request's objects mostly die by
# reference counting before then, so collections nearly stop (~10 µs of CPU per call saved).
YOUNG_THRESHOLD = 10_000


def tune_garbage_collector() -> None:
    """Freeze what startup built (modules, the devnet, the app) and collect young objects less often.

    A full collection walks ~190k startup objects: ~110 ms here, all of it a stalled event loop
    (at 64 concurrent calls: p99 ~150 ms, and a third of the gateway's CPU). Frozen, they are
    never walked again; they are permanent anyway, and still freed by reference counting if
    dropped."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])


class Server(uvicorn.Server):
    """uvicorn's server, with the collector tuned once the app's startup (lifespan) has run."""

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        tune_garbage_collector()


class CannotListen(Exception):
    """The address cannot be listened on; the message says why in one line."""


def listen(host: str, port: int, *, port_setting: str) -> socket.socket:
    """A listening socket, bound before anything is announced: a port in use is the first (and
    only) thing said, not a line after the banner. Port 0: the system picks a free one.
    `port_setting` names what chooses another port (e.g. "--port or PAYWIRE_PORT")."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        hint = (f"; another process listens there: stop it, or choose another port with {port_setting}"
                if exc.errno == errno.EADDRINUSE else "")
        reason = os.strerror(exc.errno) if exc.errno else str(exc)  # create_server adds the address
        raise CannotListen(f"cannot listen on {host}:{port}: {reason}{hint}") from None


def serve(app: Any, *, host: str, port: int, log_level: str = "info",
          header_timeout: float = HEADER_TIMEOUT_SECONDS,
          body_timeout: float = BODY_TIMEOUT_SECONDS, json_logs: bool = False,
          trusted_proxies: Sequence[str] = (), sock: socket.socket | None = None) -> None:
    """`uvicorn.run(app, ...)` for one process, with the settings above; on `sock` when given
    (`listen`), else uvicorn binds host:port itself."""
    server = Server(uvicorn_config(app, host=host, port=port, log_level=log_level,
                                   header_timeout=header_timeout, body_timeout=body_timeout,
                                   json_logs=json_logs, trusted_proxies=trusted_proxies))
    try:
        server.run(sockets=[sock] if sock is not None else None)
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)
