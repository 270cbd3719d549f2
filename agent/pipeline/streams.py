"""Streams on their way to a caller: a settled stream's handover (`StreamHandover`: its chunks
passed on, its end recorded once, kept for a retry when its caller left), a free re-run's hold on
its row (`RerunLease`), a kept stream replayed, a free call's stream, and a stream that broke part
way (`StreamFailed`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from agent.pipeline.outcomes import refusal
from agent.pipeline.shielding import detach, quietly
from agent.pipeline.timing import Timings
from payments.leases import InFlight, SettlementPolicy
from payments.ledger import Ledger, StoredResult
from skills.errors import SkillError
from skills.skill import StreamUsage
from wire import wire_json

log = logging.getLogger(__name__)

# A stream's kept result (payments/ledger.py `paywire_results`): its chunks as one JSON array.
KEPT_STREAM = "application/vnd.paywire.stream-chunks+json"

END = object()  # what `next_chunk` gives once a stream has no more


class StreamFailed(Exception):
    """A delivered stream broke part way (the skill's upstream failed after the first chunk):
    what the face tells its caller in the stream's last event, decided here like any refusal."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


async def next_chunk(chunks: AsyncIterator[Any]) -> Any:
    """The next chunk, or END."""
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return END


async def next_or_failure(chunks: AsyncIterator[Any]) -> Any:
    """The next chunk; a skill's error raised as StreamFailed (faces know no skill errors)."""
    try:
        return await next_chunk(chunks)
    except SkillError as exc:
        refused = refusal(Timings(), exc, before_quote=True)
        raise StreamFailed(refused.status, refused.code, refused.message) from exc


async def without_usage(chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A free call's stream: nothing to record, so the StreamUsage item is dropped."""
    while (chunk := await next_or_failure(chunks)) is not END:
        if not isinstance(chunk, StreamUsage):
            yield chunk


async def replay(chunks: list[Any]) -> AsyncIterator[Any]:
    """A kept stream, chunk by chunk."""
    for chunk in chunks:
        yield chunk


class RerunLease:
    """A free re-run's hold on its settled row: the lease `take_redelivery` took is renewed
    (InFlight) until the re-run's end is recorded, once, in one ledger write (`end`). A stream's
    handover records it (`taken_over`)."""

    def __init__(self, ledger: Ledger, in_flight: InFlight, policy: SettlementPolicy, row_id: str,
                 *, last: bool) -> None:
        self._ledger, self._in_flight, self._policy, self._row_id = ledger, in_flight, policy, row_id
        self.last = last  # the last free re-run: read to its end, its result kept
        self.taken_over = self._ended = False
        in_flight.add(row_id)

    async def end(self, *, delivered: bool = False, result: StoredResult | None = None,
                  failed: bool = False) -> None:
        """`delivered`: handed to a caller still there; `result`: kept for a retry; `failed`:
        it failed before any result (not counted as a re-run)."""
        if self._ended:
            return
        self._ended = True
        self._in_flight.discard(self._row_id)
        await quietly(self._ledger.record_handover(
            self._row_id, delivered=delivered, result=result, rerun_failed=failed,
            keep_result_seconds=self._policy.keep_result_seconds))


class StreamHandover:
    """A settled stream on its way to the caller: passes the chunks on (the skill's usage item is
    kept back) and records once how it went out. A reader that stops part way, or never starts,
    ends it at once: the upstream is closed, usage "partial" (or "none"), not delivered. A stream
    read to its end waits for the face's word (`report`): "complete" and delivered, or
    "undelivered" (its caller was gone before the last byte), its chunks then kept for a retry
    of the payment when they fit the keep limit (else the retry runs it again, free). A last free
    re-run is read to its end whatever its reader does (`_read_rest`), and kept."""

    def __init__(self, ledger: Ledger, row_id: str, upstream: AsyncIterator[Any], first: Any,
                 policy: SettlementPolicy, *, paid: Timings | None = None,
                 rerun: RerunLease | None = None,
                 charge: Callable[[StreamUsage], int | None] | None = None) -> None:
        """`paid`: the paid call's timings, its usage recorded; `rerun`: a free re-run's lease
        (the paid run's usage stays), which this handover ends; `charge`: what the call is
        charged for what it used, recorded with its usage (a scheme that charges less than it
        settled: exact on Solana, the rest refunded)."""
        self._ledger, self._row_id, self._upstream, self._first = ledger, row_id, upstream, first
        self._policy, self._paid, self._rerun, self._charge = policy, paid, rerun, charge
        self._to_the_end = rerun is not None and rerun.last
        if rerun is not None:
            rerun.taken_over = True
        self._keep_max = policy.keep_limit(last_rerun=self._to_the_end)
        self._usage = StreamUsage(None)
        self._kept: list[bytes] | None = []  # each chunk's JSON while they fit the keep limit
        self._kept_bytes = 2  # the array's brackets
        self._reading: asyncio.Future[Any] | None = None  # a last re-run's read in progress
        self.started = self.complete = self._recorded = self._broken = self._draining = False
        self.sent = 0

    async def chunks(self) -> AsyncIterator[Any]:
        self.started = True
        chunk = self._first
        try:
            while chunk is not END:
                if isinstance(chunk, StreamUsage):
                    self._usage = chunk
                else:
                    self._keep(chunk)
                    yield chunk
                    self.sent += 1  # (a chunk counts once the reader asks for the next one)
                chunk = await self._read()
            self.complete = True
        except Exception:
            self._broken = True  # the upstream failed part way: there is nothing more to read
            raise
        finally:
            if not self.complete:
                await self._stopped()

    async def _read(self) -> Any:
        if not self._to_the_end:
            return await next_or_failure(self._upstream)
        # A reader that leaves does not cut this read: `_read_rest` goes on with it.
        self._reading = asyncio.ensure_future(next_or_failure(self._upstream))
        chunk = await asyncio.shield(self._reading)
        self._reading = None
        return chunk

    async def report(self, reached: bool) -> None:
        """The face's word once it stopped reading (the pipeline's, for a caller that left)."""
        if not self.complete:  # never read to its end
            await self._stopped()
        if not self._draining:
            self._record(reached)

    async def _stopped(self) -> None:
        """Its reader stopped before the end (or never read): a last re-run is read on by nobody;
        any other stream is recorded (not delivered) and its upstream closed."""
        if self._to_the_end and not self._broken:
            if not self._draining:
                self._draining = True
                detach(self._read_rest())
            return
        self._record(reached=False)
        await self._upstream.aclose()  # type: ignore[attr-defined]

    async def _read_rest(self) -> None:
        """A last re-run whose reader left: the upstream read to its end, its chunks kept for the
        next retry of the payment (reading stops once they no longer fit)."""
        try:
            if not self.started:
                chunk = self._first
            elif self._reading is not None:
                chunk = await self._reading
            else:
                chunk = await next_or_failure(self._upstream)
            while chunk is not END and self._kept is not None:
                if isinstance(chunk, StreamUsage):
                    self._usage = chunk
                else:
                    self._keep(chunk)
                chunk = await next_or_failure(self._upstream)
            self.complete = chunk is END
        except Exception as exc:  # noqa: BLE001 - the upstream broke: nothing complete to keep
            log.warning("a last free re-run's stream broke while read for its payer: %s",
                        type(exc).__name__)
        finally:
            self._record(reached=False)
            await self._upstream.aclose()  # type: ignore[attr-defined]

    def used(self) -> StreamUsage:
        """What the stream used: its usage item, or, for one that ended before it (its reader
        left, its upstream broke), what a metered stream says it produced so far."""
        if self._usage.usage is None and self._usage.charge_usd is None:
            so_far = getattr(self._upstream, "used", None)
            if so_far is not None:
                return so_far()
        return self._usage

    def _keep(self, chunk: Any) -> None:
        if self._kept is None:
            return
        raw = wire_json.dumps(chunk)
        self._kept_bytes += len(raw) + 1
        if self._kept_bytes > self._keep_max:
            self._kept = None  # too large to keep: a retry runs the call again instead
        else:
            self._kept.append(raw)

    def _record(self, reached: bool) -> None:
        """The one ledger write of the stream's end. A reader that left cancels the generator,
        and further awaits there would be cancelled too: the write runs as its own task."""
        if self._recorded:
            return
        self._recorded = True
        delivered = reached and self.complete
        kept, self._kept = self._kept, None
        result = (StoredResult(200, KEPT_STREAM, b"[" + b",".join(kept) + b"]")
                  if self.complete and not delivered and kept is not None else None)
        if self._rerun is not None:
            detach(self._rerun.end(delivered=delivered, result=result))
            return
        usage: dict[str, Any] = {}
        if self._paid is not None:
            delivery = ("complete" if delivered else "undelivered" if self.complete
                        else "partial" if self.started else "none")
            used = self.used()  # (a stream cut part way: what it produced, which it is charged for)
            usage = {"latency_ms": round(self._paid.total_ms()),
                     "usage": {**(used.usage or {}), "chunks": self.sent, "delivery": delivery},
                     "upstream_cost_usd": used.upstream_cost_usd}
            if self._charge is not None:
                usage["charged_atomic"] = self._charge(used)
        detach(quietly(self._ledger.record_handover(
            self._row_id, delivered=delivered, result=result,
            keep_result_seconds=self._policy.keep_result_seconds, **usage)))
