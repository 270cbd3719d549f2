"""Rate limits on what costs the gateway work for nothing: quotes nobody pays, and payments that
are refused (each refused payment may have cost a facilitator round trip).

Per replica, in memory: a dict lookup on the hot path, no database round trip. With N replicas a
client may get up to N times the limit (the operator's proxy balances clients over replicas).

Each limit is a GCRA (generic cell rate algorithm, the token bucket as one timestamp per key):
`per_minute` sustained, `burst` at once. Keys are client addresses (an IPv6 client by its /64, the
block one subscriber gets) and payers. The keys tracked are bounded (`max_keys`, least recently
used dropped first), so a client rotating addresses cannot grow memory: a dropped key only forgets
its debt, as a new address would have none.

What counts:
- quotes: every 402 quote for a call that carried no payment, per client address; a payment that
  then verifies gives its client one quote back, so a payer that quotes before each paid call is
  never limited by its own successful calls.
- refused payments: a payment refused before anything is claimed (undecodable, not matching the
  quote, malformed, denied, refused locally or by the facilitator), per client address, and per
  payer when the payload proves the payer signed it (a forged `from` must not spend a real
  payer's budget). A successful paid call counts nothing. A client is let through while it has
  budget left and charged once its payment is refused, so concurrent refused attempts may pass
  at most once each before the budget shows them (bounded by the client's concurrency).
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_KEY_LENGTH = 100  # a key longer than this is cut (keys come from the network)


@dataclass(frozen=True)
class LimitSpec:
    """One limit as configured: `per_minute` sustained (0: off), `burst` at once, and the settings
    that control it (named in every refusal)."""

    per_minute: int
    burst: int
    setting: str
    burst_setting: str

    @property
    def on(self) -> bool:
        return self.per_minute > 0


@dataclass(frozen=True)
class Throttled:
    """A refusal: how long to wait (whole seconds, at least 1) and a message naming the limit."""

    retry_after: int
    message: str


class RateLimit:
    """One GCRA limit over many keys, in memory, with at most `max_keys` keys tracked."""

    def __init__(self, per_minute: int, burst: int, *, max_keys: int = 50_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute <= 0 or burst <= 0 or max_keys <= 0:
            raise ValueError("per_minute, burst and max_keys must be above 0")
        self.interval = 60.0 / per_minute  # seconds one event costs
        self.tolerance = self.interval * burst  # how far ahead of now the budget may be spent
        self.max_keys = max_keys
        self._clock = clock
        self._due: OrderedDict[str, float] = OrderedDict()  # key -> theoretical arrival time

    def __len__(self) -> int:
        return len(self._due)

    def wait(self, key: str) -> float:
        """Seconds until `key` may have one more event (0.0: now). Counts nothing."""
        due = self._due.get(key)
        if due is None:
            return 0.0
        now = self._clock()
        if due <= now:  # fully recovered: nothing to remember
            del self._due[key]
            return 0.0
        return max(0.0, due + self.interval - now - self.tolerance)

    def hit(self, key: str) -> None:
        """Count one event for `key` (whatever its budget; the debt is capped at one burst)."""
        now = self._clock()
        due = max(self._due.get(key, now), now) + self.interval
        self._due[key] = min(due, now + self.tolerance)
        self._due.move_to_end(key)
        while len(self._due) > self.max_keys:
            self._due.popitem(last=False)

    def take(self, key: str) -> float:
        """Count one event if `key` may have it now (returns 0.0), else the seconds to wait."""
        waiting = self.wait(key)
        if waiting == 0.0:
            self.hit(key)
        return waiting

    def give_back(self, key: str) -> None:
        """Undo one event of `key` (never below a full budget)."""
        due = self._due.get(key)
        if due is None:
            return
        due -= self.interval
        if due <= self._clock():
            del self._due[key]
        else:
            self._due[key] = due


class RateLimits:
    """The gateway's limits: quotes per client address; refused payments per client address and
    per (proven) payer. A limit whose `per_minute` is 0 is off; a call without a client address
    (in process) is not limited by address."""

    def __init__(self, quotes: LimitSpec, payments: LimitSpec, *, max_keys: int = 50_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.quotes_spec, self.payments_spec = quotes, payments
        self._quotes = RateLimit(quotes.per_minute, quotes.burst, max_keys=max_keys,
                                 clock=clock) if quotes.on else None
        self._refused_clients = RateLimit(payments.per_minute, payments.burst, max_keys=max_keys,
                                          clock=clock) if payments.on else None
        self._refused_payers = RateLimit(payments.per_minute, payments.burst, max_keys=max_keys,
                                         clock=clock) if payments.on else None

    # -- quotes
    def quote_blocked(self, client: str | None) -> Throttled | None:
        """Before any work: is this client out of quotes? (counts nothing)"""
        if self._quotes is None or client is None:
            return None
        return self._throttled(self._quotes.wait(client_key(client)), "quotes", "client address",
                               self.quotes_spec)

    def quote(self, client: str | None) -> Throttled | None:
        """A quote is about to be answered: count it, or refuse it."""
        if self._quotes is None or client is None:
            return None
        return self._throttled(self._quotes.take(client_key(client)), "quotes", "client address",
                               self.quotes_spec)

    # -- payments
    def payment_blocked(self, client: str | None, payer: str | None = None) -> Throttled | None:
        """Before a payment is looked at (`payer` None) or verified: has this client address, or
        this payer, used up its refused-payment budget? (counts nothing)"""
        if self._refused_clients is None or self._refused_payers is None:
            return None
        if client is not None:
            found = self._throttled(self._refused_clients.wait(client_key(client)),
                                    "refused payments", "client address", self.payments_spec)
            if found is not None:
                return found
        if payer is not None:
            return self._throttled(self._refused_payers.wait(_bounded(payer)), "refused payments",
                                   "payer", self.payments_spec)
        return None

    def payment_refused(self, client: str | None, proven_payer: str | None = None) -> None:
        """A payment was refused: charge its client address, and its payer when proven."""
        if self._refused_clients is None or self._refused_payers is None:
            return
        if client is not None:
            self._refused_clients.hit(client_key(client))
        if proven_payer is not None:
            self._refused_payers.hit(_bounded(proven_payer))

    def payment_verified(self, client: str | None) -> None:
        """A payment verified: the quote its client asked for it is given back."""
        if self._quotes is not None and client is not None:
            self._quotes.give_back(client_key(client))

    @property
    def tracks_payers(self) -> bool:
        """Whether refused payments are counted per payer (the proof costs a signature check)."""
        return self._refused_payers is not None

    @staticmethod
    def _throttled(wait: float, what: str, per: str, spec: LimitSpec) -> Throttled | None:
        if wait <= 0:
            return None
        seconds = max(1, math.ceil(wait))
        return Throttled(seconds, (
            f"too many {what} from this {per}: at most {spec.per_minute} a minute ({spec.burst} at "
            f"once) on this server; retry in {seconds} s (the operator sets {spec.setting} and "
            f"{spec.burst_setting})"))


def client_key(host: str) -> str:
    """The key a client address is limited under: an IPv4 address as it is, an IPv6 address by
    its /64 (one subscriber's block: rotating inside it changes nothing), anything else (a test
    client's name, a Unix socket) as it is, bounded."""
    if ":" in host:
        try:
            address = ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return _bounded(host)
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return _bounded(host)


def _bounded(key: str) -> str:
    return key[:MAX_KEY_LENGTH]
