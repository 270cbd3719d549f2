"""A stream settled at its end, for what it used: `upto` and channel vouchers charge a stream only
once its usage is known. Its chunks go out as they come; the claim's lease is renewed meanwhile."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

from x402.schemas import SettleResponse

from agent.pipeline.outcomes import Delivered, Outcome
from agent.pipeline.paid import PaidCall, PaidServices
from agent.pipeline.shielding import to_the_end
from agent.pipeline.streams import StreamHandover
from skills.skill import SkillResult, StreamUsage

log = logging.getLogger(__name__)


class SettlesAResult(Protocol):
    services: PaidServices

    async def settle(self, paid: PaidCall, row_id: str, result: SkillResult, *,
                     record: bool = True) -> Outcome: ...


def stream_settled_at_its_end(settlement: SettlesAResult, paid: PaidCall, row_id: str,
                              chunks: AsyncIterator[Any], first: Any, *,
                              receipt: SettleResponse | None = None) -> Delivered:
    """The stream handed out now and settled when it ends (its receipt is in the ledger: the
    caller's headers went out before its charge was known; `receipt`: what they say of what
    moved before, a deposit's)."""
    s = settlement.services
    s.in_flight.add(row_id)  # the claim's lease, renewed until the stream's end settles it
    ending = SettledAtItsEnd(settlement, paid, row_id, chunks)
    handover = StreamHandover(s.ledger, row_id, ending, first, s.policy, paid=paid.t)
    delivered = Delivered(paid.t, SkillResult(body=None, media_type="text/event-stream"), receipt,
                          paid.atomic, stream=handover.chunks(), on_handover=handover.report)
    ending.outcome = delivered  # its receipt and charge, once settled (a face that answers after
    return delivered            # the stream's end, as A2A's message/send does, sends them)


class SettledAtItsEnd:
    """A claimed stream's chunks, settled for what it used once it ends: at its usage item (read
    to its end) or when it is closed early (its reader left, its upstream broke). Settled once."""

    def __init__(self, settlement: SettlesAResult, paid: PaidCall, row_id: str,
                 upstream: AsyncIterator[Any]) -> None:
        self._settlement, self._paid, self._row_id = settlement, paid, row_id
        self._upstream = upstream
        self._settled: Outcome | None = None
        self.outcome: Delivered | None = None  # the stream's own outcome, completed when settled

    def __aiter__(self) -> SettledAtItsEnd:
        return self

    async def __anext__(self) -> Any:
        try:
            chunk = await self._upstream.__anext__()
        except StopAsyncIteration:
            await self._settle(None)
            raise
        if isinstance(chunk, StreamUsage):
            await self._settle(chunk)
        return chunk

    def used(self) -> StreamUsage:
        used = getattr(self._upstream, "used", None)
        return used() if used is not None else StreamUsage(None)

    async def aclose(self) -> None:
        try:
            await self._upstream.aclose()  # type: ignore[attr-defined]
        finally:
            await self._settle(None)

    async def _settle(self, usage: StreamUsage | None) -> None:
        if self._settled is not None:
            return
        used = usage or self.used()
        result = SkillResult(body=None, usage=used.usage, upstream_cost_usd=used.upstream_cost_usd,
                             charge_usd=used.charge_usd)
        services = self._settlement.services
        try:  # (runs to its end even if the reader is cancelled meanwhile)
            self._settled = await to_the_end(
                self._settlement.settle(self._paid, self._row_id, result, record=False))
        finally:
            services.in_flight.discard(self._row_id)
        if isinstance(self._settled, Delivered) and self.outcome is not None:
            self.outcome.receipt = self._settled.receipt
            self.outcome.price_atomic = self._settled.price_atomic
        if not isinstance(self._settled, Delivered):  # the caller has what it streamed
            log.warning("payment %s: a stream went out but its settlement did not complete "
                        "(%s): the operator's loss", self._row_id, type(self._settled).__name__)
