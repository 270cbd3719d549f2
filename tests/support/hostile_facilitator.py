"""A remote facilitator that misbehaves at the HTTP level, on a free loopback port (stdlib server,
one thread per connection): routes set hostile in `modes` ("/supported", "/verify", "/settle")
answer as no facilitator should; the others are forwarded to `upstream` (a real facilitator's URL)
or answered 404.

Modes:
- "flood": 200 with a 300 MiB answer, streamed 64 KiB at a time (one chunk object reused: the
  server holds 64 KiB, whatever the client does). The answer is valid JSON for its route padded
  with one long string, so only its size can be what refuses it.
- "trickle": a valid head at once, then one byte of the body every `interval` seconds, forever.
- "trickle_head": the status line and headers themselves, one byte every `interval` seconds.
- "redirect_flood": a 307 to `/elsewhere` (answered 404) whose own body is 300 MiB.

A hostile answer ends when the client leaves or when `stop()` is called (the pacing waits on the
`stopped` event, so stopping needs no more than one interval)."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import httpx

from tests.support.loopback_http import JSONHandler, LoopbackServer

FLOOD_BYTES = 300 * 2**20
CHUNK = 64 * 1024

# The route's answer, valid but for a padding field no schema reads (x402's models ignore extras).
_VALID = {
    "/supported": b'{"kinds": [], "extensions": [], "signers": {}, "padding": "',
    "/verify": b'{"isValid": true, "payer": "0x' + b"12" * 20 + b'", "padding": "',
    "/settle": b'{"success": true, "transaction": "0x' + b"ab" * 32
               + b'", "network": "eip155:84532", "padding": "',
}


class HostileFacilitator:
    def __init__(self, upstream: str | None = None, *, interval: float = 0.5) -> None:
        self.upstream, self.interval = upstream, interval
        self.modes: dict[str, str] = {}
        self.asked: list[str] = []  # every request's path, in order, hostile or forwarded
        self.sent = 0  # bytes of hostile answers written (before the clients left)
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._server = LoopbackServer(type("Handler", (_Handler,), {"hostile": self}))

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> HostileFacilitator:
        self._server.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self._server.stop()

    def _count(self, path: str = "", sent: int = 0) -> None:
        with self._lock:
            if path:
                self.asked.append(path)
            self.sent += sent


class _Handler(JSONHandler):
    hostile: HostileFacilitator

    def do_GET(self) -> None:
        self._handle(b"")

    def do_POST(self) -> None:
        self._handle(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

    def _handle(self, body: bytes) -> None:
        hostile = self.hostile
        hostile._count(self.path)
        mode = hostile.modes.get(self.path)
        try:
            if mode == "flood":
                self._flood(self._head(FLOOD_BYTES))
            elif mode == "redirect_flood":
                self._flood(self._head(FLOOD_BYTES, "307 Temporary Redirect",
                                       "Location: /elsewhere\r\n"))
            elif mode == "trickle":
                self._trickle(self._head(FLOOD_BYTES) + _VALID.get(self.path, b"{"), after=True)
            elif mode == "trickle_head":
                self._trickle(self._head(FLOOD_BYTES), after=False)
            elif hostile.upstream is not None:
                answer = httpx.request(self.command, hostile.upstream + self.path, content=body,
                                       headers={"Content-Type": "application/json"}, timeout=30)
                self.answer(answer.status_code, answer.content,
                            answer.headers.get("content-type", "application/json"))
            else:
                self.answer(404, {"error": "no such route"})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left, as it should: the answer ends here

    def _head(self, length: int, status: str = "200 OK", more: str = "") -> bytes:
        return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{more}"
                f"Content-Length: {length}\r\nConnection: close\r\n\r\n").encode()

    def _flood(self, head: bytes) -> None:
        valid = _VALID.get(self.path, b'{"padding": "')
        ending = b'"}'
        self.wfile.write(head + valid)
        chunk, left = b"x" * CHUNK, FLOOD_BYTES - len(valid) - len(ending)
        self.hostile._count(sent=len(valid))
        while left > 0 and not self.hostile.stopped.is_set():
            part = chunk if left >= CHUNK else chunk[:left]
            self.wfile.write(part)
            left -= len(part)
            self.hostile._count(sent=len(part))
        self.wfile.write(ending)

    def _trickle(self, first: bytes, *, after: bool) -> None:
        """`first` (the head, or with `after` the head and the answer's start) then one byte of
        padding per interval; without `after`, `first` itself goes a byte at a time."""
        if after:
            self.wfile.write(first)
            paced: Any = itertools.repeat(b"x")
        else:
            paced = itertools.chain((first[i:i + 1] for i in range(len(first))),
                                    itertools.repeat(b"x"))
        for byte in paced:
            # The pacing is the fault under test (a byte per interval), not a wait for something;
            # `stopped` ends it at once.
            if self.hostile.stopped.wait(self.hostile.interval):
                return
            self.wfile.write(byte)
            self.hostile._count(sent=1)
