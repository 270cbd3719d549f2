"""What a paying client (`paywire pay`, `paywire mcp`) accepts from a server it does not trust.

A server chooses how long the payment it asks for stays valid, how much it sends back and when to
be asked again. A hostile or broken one would choose without bound: an authorization valid for
decades (`maxTimeoutSeconds` 10^9), a 300 MiB 402 answer, `Retry-After: 0` forever. The client
bounds each: it signs an authorization valid at most `max_validity_seconds`; it reads an answer as
a stream and stops at a size (a 402's small, the paid answer's larger), asking for no compression
(a compressed answer is refused: its decoded size is the server's to choose); it sends one payment
again at most `sends - 1` times, waiting the server's Retry-After within [min_delay, max_delay].
The deadline of each phase (the quote, then the payment) is the caller's `timeout`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

MiB = 2**20

# Asked of every server: an answer the client can count as it reads (see `read_bounded`).
NO_COMPRESSION = {"Accept-Encoding": "identity"}


@dataclass(frozen=True)
class ClientLimits:
    max_validity_seconds: int = 600  # a signed authorization is valid at most this long
    quote_bytes: int = 1 * MiB  # a 402 answer (the quote); paywire's are a few KiB
    answer_bytes: int = 32 * MiB  # any other answer: the paid result (images as base64 included)
    sends: int = 10  # of one payment, the first included, while the server says "not yet"
    min_delay: float = 1.0  # seconds between two sends of one payment, whatever Retry-After says
    max_delay: float = 30.0


DEFAULT_LIMITS = ClientLimits()


class AnswerTooLarge(Exception):
    """An answer over its limit, or compressed: not read further."""


def mib(size: int) -> str:
    return f"{size / MiB:g} MiB"


def refuse_compressed(headers: httpx.Headers) -> None:
    """AnswerTooLarge for an answer compressed although the client asked for none (NO_COMPRESSION):
    its size is only known once decoded."""
    encoding = headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise AnswerTooLarge(f"the answer is compressed ({encoding[:40]}) although the client asked "
                             "for none; its size cannot be bounded before it is decoded")


async def read_bounded(response: httpx.Response, limit: int) -> bytes:
    """The body of a streamed `response`, at most `limit` bytes; AnswerTooLarge past that (the
    rest is never read), or when the server compressed it although asked not to."""
    refuse_compressed(response.headers)
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        raise AnswerTooLarge(f"the answer is {mib(int(declared))}, over the client's limit of "
                             f"{mib(limit)}")
    body = bytearray()
    async for chunk in response.aiter_raw():
        if len(body) + len(chunk) > limit:
            raise AnswerTooLarge(f"the answer is over the client's limit of {mib(limit)}")
        body += chunk
    return bytes(body)


def retry_delay(retry_after: str | None, resend: int, limits: ClientLimits = DEFAULT_LIMITS) -> float:
    """Seconds to wait before the `resend`-th send again (1, 2...) of one payment: the server's
    Retry-After (seconds, or an HTTP date) within [min_delay, max_delay]; without one, doubling
    from min_delay."""
    wanted = _retry_after_seconds(retry_after)
    if wanted is None:
        wanted = limits.min_delay * 2 ** (resend - 1)
    return min(max(wanted, limits.min_delay), limits.max_delay)


def _retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    value = value.strip()[:64]
    try:
        seconds = float(value)
        return None if math.isnan(seconds) else seconds
    except ValueError:
        pass
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - datetime.now(UTC)).total_seconds()
