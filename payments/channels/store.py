"""The channels' side of the ledger: paywire_channels, and the writes that charge a call through a
channel exactly once (docs/notes/issue-23-channels.md §3; docs/architecture.md, "Channels").

A call paid by a voucher is a paywire_payments row like any other (scheme batch-settlement, nonce
"<channelId>/<base>", `base` being the channel's running total it is charged on top of), so
retries, kept results, the payment identifier and the reports work unchanged. Three writes:

- reserve: the row is claimed and the channel reserved for it in ONE transaction, by a conditional
  UPDATE of the channel (`Ledger.claim(within=...)`): open, no withdrawal pending, the voucher
  signed on top of the running total, within the balance, and nobody else's live reservation.
  On PostgreSQL the row lock makes it a compare-and-set (a waiting UPDATE re-checks the updated
  row), on SQLite the write lock does: among replicas taking vouchers of one channel, one wins.
- commit(actual): the row settles with what the call used and the channel's running total grows
  by it, in ONE transaction, only while the row is still this replica's and the channel still
  reserved for it at the same base; otherwise nothing is written and the result is withheld. This
  write is what makes a voucher accepted: nothing reaches the chain per call.
- release: nothing is charged, the row is released and the reservation cleared, in one
  transaction; the same voucher may be sent again.

The reservation's lease is renewed with its row's (`Ledger.renew_leases`); a deposit whose outcome
is not known holds the channel without a lease until the chain decides (`begin_deposit`). The
rules each write checks are written once, as named SQL conditions; when a write changes nothing,
the same conditions, read back, say which one failed (`_Guarded`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import and_, bindparam, case, func, insert, null, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql import ColumnElement
from x402.mechanisms.evm.batch_settlement import errors as bs
from x402.mechanisms.evm.batch_settlement.constants import (
    PAYLOAD_TYPE_DEPOSIT,
    PAYLOAD_TYPE_VOUCHER,
    SCHEME_BATCH_SETTLEMENT,
)
from x402.schemas import PaymentRequirements, SettleResponse

from ..ledger import (
    ClaimRequest,
    Declined,
    Existing,
    Ledger,
    PaymentKey,
    PaymentRow,
    StoredResult,
    Within,
    keep_result,
)
from ..ledger_schema import ChannelState, PaymentState, channels_table, payments_table
from .wire import ChannelConfig, ChannelPayload, Onchain, Refusal, Voucher, charge_extra, voucher_receipt

log = logging.getLogger("paywire.payments")

# paywire's own reasons (the SDK has none for these states of a channel)
CHANNEL_CLOSING = "channel_closing"
CHANNEL_QUARANTINED = "channel_quarantined"
CHANNEL_CLOSED = "channel_closed"
TAKEN_OVER = "taken_over"  # the call's row or reservation is no longer this replica's
CHANNEL_STALE = "channel_stale"  # the mirror is older than the caller's sync window (read again)

_C = channels_table.c
_P = payments_table.c
_RESERVE_ATTEMPTS = 3  # a reserve refused by a state that changed before it was explained
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# How long a refund holds its channel (`begin_refund`) before the payer's retry may take it
# over: above the refund's send timeout (agent/pipeline/channel_refunds.py, 60 s), so a refund
# still being sent never looks abandoned.
REFUND_LEASE_SECONDS = 120.0


def _now() -> datetime:
    return datetime.now(UTC)


def _aware(moment: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes (stored as UTC)."""
    return moment if moment is None or moment.tzinfo else moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Channel:
    """A paywire_channels row."""

    channel_id: str
    network: str
    state: ChannelState
    config: ChannelConfig
    charged: int  # the running total: what delivered calls were charged
    signed_max: int | None  # the latest accepted voucher's ceiling
    signature: str | None = field(repr=False)  # ... and its signature (never logged)
    onchain: Onchain
    onchain_synced_at: datetime | None
    pending_row: str | None  # the reservation: the call using the channel
    owner: str | None  # the reservation's replica; with no pending_row, a refund's (begin_refund)
    lease_until: datetime | None  # None while pending_row is set: held until the chain decides
    claim_due_at: datetime | None
    last_request_at: datetime | None

    @staticmethod
    def of(m: Any) -> Channel:
        return Channel(
            channel_id=m["channel_id"], network=m["network"], state=ChannelState(m["state"]),
            config=ChannelConfig(
                payer=m["payer"], payer_authorizer=m["payer_authorizer"], receiver=m["receiver"],
                receiver_authorizer=m["receiver_authorizer"], token=m["token"],
                withdraw_delay=m["withdraw_delay"], salt=m["salt"]),
            charged=m["charged_atomic"], signed_max=m["signed_max_atomic"], signature=m["signature"],
            onchain=Onchain(m["balance_atomic"], m["total_claimed_atomic"],
                            m["withdraw_requested_at"], m["refund_nonce"]),
            onchain_synced_at=_aware(m["onchain_synced_at"]), pending_row=m["pending_row"],
            owner=m["owner"], lease_until=_aware(m["lease_until"]),
            claim_due_at=_aware(m["claim_due_at"]), last_request_at=_aware(m["last_request_at"]))


@dataclass(frozen=True)
class ChannelCall:
    """One call paid through a channel: a deposit (with its voucher) or a voucher, for `price`
    (the quote: the most the call may be charged), signed on top of the running total."""

    network: str
    kind: str  # PAYLOAD_TYPE_DEPOSIT or PAYLOAD_TYPE_VOUCHER
    config: ChannelConfig
    voucher: Voucher
    price: int
    asset: str
    pay_to: str
    skill_id: str
    request_digest: str
    payment_id: str | None = None

    def __post_init__(self) -> None:
        if self.price < 1:  # a free call pays no channel; and its key would be its base's
            raise ValueError(f"a channel call's price must be at least 1 atomic unit, got {self.price}")

    @staticmethod
    def of(payload: ChannelPayload, requirement: PaymentRequirements, *, skill_id: str,
           request_digest: str, payment_id: str | None = None) -> ChannelCall:
        if payload.kind not in (PAYLOAD_TYPE_DEPOSIT, PAYLOAD_TYPE_VOUCHER):
            raise ValueError(f"a {payload.kind} payload pays for no call")
        return ChannelCall(requirement.network, payload.kind, payload.config, payload.voucher,
                           int(requirement.amount), requirement.asset, requirement.pay_to,
                           skill_id, request_digest, payment_id)

    @property
    def channel_id(self) -> str:
        return self.voucher.channel_id

    @property
    def base(self) -> int:
        """The running total this call is charged on top of: the ceiling less the price."""
        return self.voucher.ceiling - self.price

    @property
    def key(self) -> PaymentKey:
        """The call's payment: a retry of the same request with the same voucher has the same
        key (its base follows from the voucher and the quote), two calls of a channel never."""
        return PaymentKey(self.network, self.config.payer, f"{self.channel_id}/{self.base}")

    def claim_request(self) -> ClaimRequest:
        return ClaimRequest(self.key, self.price, self.asset, self.pay_to, self.skill_id,
                            self.request_digest, self.payment_id, scheme=SCHEME_BATCH_SETTLEMENT,
                            channel_id=self.channel_id)


@dataclass(frozen=True)
class Reserved:
    """The call holds the channel: run it, then commit or release `row_id`."""

    row_id: str


@dataclass(frozen=True)
class Refused:
    """The channel cannot take this call now; `channel` as it was read (the corrective 402's
    data when the voucher's base is not the running total), None when it does not exist."""

    refusal: Refusal
    channel: Channel | None


@dataclass(frozen=True)
class Committed:
    """The call is charged `actual` on top of `charged_before`; `channel` as the commit left it."""

    channel: Channel
    charged_before: int
    actual: int

    def receipt_extra(self) -> dict[str, Any]:
        """The receipt's `extra` the SDK's client reads (a deposit's receipt too)."""
        return charge_extra(self.channel.channel_id, self.channel.onchain,
                            charged_before=self.charged_before, actual=self.actual)

    def voucher_receipt(self) -> SettleResponse:
        c = self.channel
        return voucher_receipt(network=c.network, payer=c.config.payer, channel_id=c.channel_id,
                               onchain=c.onchain, charged_before=self.charged_before,
                               actual=self.actual)


@dataclass(frozen=True)
class Withheld:
    """Nothing was written: the result must not go out (nothing is charged)."""

    refusal: Refusal


class _Withhold(Exception):
    """Raised inside the commit's transaction to roll it back."""


Rules = list[tuple[str, ColumnElement[bool]]]


class ChannelStore:
    """Channel rows and their writes, on the ledger's database (SQLite or PostgreSQL), through
    the ledger's own transactions.

    `claim_threshold_atomic`: a channel whose unclaimed charges reach it is due for a claim at
    once; otherwise `claim_interval_seconds` after its first unclaimed charge."""

    def __init__(self, ledger: Ledger, *, claim_threshold_atomic: int = 1_000_000,
                 claim_interval_seconds: float = 300.0) -> None:
        self._ledger = ledger
        self._threshold = claim_threshold_atomic
        self._interval = timedelta(seconds=claim_interval_seconds)

    @property
    def ledger(self) -> Ledger:
        return self._ledger

    @property
    def claim_threshold_atomic(self) -> int:
        return self._threshold

    @property
    def claim_interval_seconds(self) -> float:
        return self._interval.total_seconds()

    # -- reading -------------------------------------------------------------------------------

    async def get(self, channel_id: str) -> Channel | None:
        async with self._ledger.reading() as conn:
            row = (await conn.execute(select(channels_table).where(
                _C.channel_id == channel_id.lower()))).mappings().first()
        return Channel.of(row) if row is not None else None

    async def charges(self, channel_id: str) -> list[tuple[int, int]]:
        """The channel's charged calls as (base, charge), by base: they tile the running total
        from the first base with no gap and no overlap (no voucher counted twice)."""
        async with self._ledger.reading() as conn:
            rows = (await conn.execute(select(_P.nonce, _P.charged_atomic).where(and_(
                _P.channel_id == channel_id.lower(), _P.state == PaymentState.SETTLED)))).all()
        return sorted((int(nonce.rsplit("/", 1)[1]), int(charged)) for nonce, charged in rows)

    async def dead_calls(self, limit: int = 100) -> list[PaymentRow]:
        """Channel calls whose replica died before anything was broadcast (claimed, lease run
        out), oldest first: the reconciler's to release (`release_dead`)."""
        now = _now()
        async with self._ledger.reading() as conn:
            rows = (await conn.execute(select(payments_table).where(and_(
                _P.state == PaymentState.CLAIMED, _P.lease_until < now,
                _P.scheme == SCHEME_BATCH_SETTLEMENT)).order_by(_P.created_at).limit(limit))
            ).mappings().all()
        return [PaymentRow.of(r) for r in rows]

    # -- a channel's first sight and the chain's mirror ----------------------------------------

    async def adopt(self, config: ChannelConfig, *, channel_id: str, network: str,
                    onchain: Onchain) -> Channel:
        """The channel's row, created on first sight from paywire's own read of the chain (never
        a facilitator's report, x402 #2559): its running total starts at the chain's
        totalClaimed (the spec's rule for a channel the server does not know; 0 for a new one)."""
        now = _now()
        values = {
            "channel_id": channel_id.lower(), "network": network, "state": _state_of(onchain),
            **config.columns(), "charged_atomic": onchain.total_claimed,
            **_mirror_columns(onchain, now), "created_at": now, "updated_at": now}
        try:
            async with self._ledger.writing() as conn:
                await conn.execute(insert(channels_table).values(**values))
            log.info("channel %s adopted on %s (%s)", channel_id, network, values["state"])
        except IntegrityError:  # known already (another call, another replica)
            pass
        channel = await self.get(channel_id)
        assert channel is not None
        return channel

    async def mirror(self, channel_id: str, onchain: Onchain, *,
                     synced_at: datetime | None = None) -> Channel | None:
        """What paywire's own read of the chain says: the mirror columns, and what follows from
        them (never a call's reservation). A withdrawal seen closes the channel to vouchers and
        makes it due for a claim at once (x402 #3464); a totalClaimed above the running total
        (claimed elsewhere) raises it, so no later voucher signs below what the chain already
        paid; a refund that landed (its refundNonce moved) ends the refund's hold. A read older
        than a refund already mirrored (a lower refundNonce) is not written: its balance is from
        before that refund."""
        now, channel_id = _now(), channel_id.lower()
        withdrawing = onchain.withdraw_requested_at > 0
        closing = case((_C.state == ChannelState.OPEN, ChannelState.CLOSING), else_=_C.state)
        # the refund holding the channel landed: the chain's refundNonce is past the one mirrored
        # when it began (its own read, just before `begin_refund`), the nonce it signed
        refunded = and_(_C.state == ChannelState.CLOSING, _C.pending_row.is_(None),
                        _C.refund_nonce < onchain.refund_nonce)
        # nothing left to charge or claim, and no withdrawal pending (one finalized, or a channel
        # spent to its deposit): closed, until a deposit opens it again
        emptied = and_(_C.state.in_((ChannelState.OPEN, ChannelState.CLOSING)),
                       _C.charged_atomic <= onchain.total_claimed,
                       onchain.balance <= onchain.total_claimed, _C.pending_row.is_(None))
        follows: dict[str, Any] = {"state": closing, "claim_due_at": now}
        if not withdrawing:  # (a pending withdrawal keeps it closing, the hold too, until it ends)
            ends_hold = or_(refunded, emptied)  # (no pending_row: owner and lease are a refund's)
            follows = {"state": case((refunded, _state_of(onchain)), (emptied, ChannelState.CLOSED),
                                     else_=_C.state),
                       "owner": case((ends_hold, null()), else_=_C.owner),
                       "lease_until": case((ends_hold, null()), else_=_C.lease_until)}
        # (SQL reads every right-hand side, and the WHERE, on the row as it was before the UPDATE)
        async with self._ledger.writing() as conn:
            before = (await conn.execute(select(_C.charged_atomic).where(
                _C.channel_id == channel_id))).scalar()
            row = (await conn.execute(
                update(channels_table).where(and_(_C.channel_id == channel_id,
                                                  _C.refund_nonce <= onchain.refund_nonce))
                .values(**_mirror_columns(onchain, synced_at or now), updated_at=now,
                        charged_atomic=case((_C.charged_atomic < onchain.total_claimed,
                                             onchain.total_claimed), else_=_C.charged_atomic),
                        **follows)
                .returning(*channels_table.c))).mappings().first()
        if row is None:  # unknown, or a read from before a refund already mirrored
            return await self.get(channel_id) if before is not None else None
        if before is not None and onchain.total_claimed > before:
            log.warning("channel %s: the chain's totalClaimed %d is above its running total %d "
                        "(claimed elsewhere): raised to it", channel_id, onchain.total_claimed, before)
        return Channel.of(row)

    # -- reserve -------------------------------------------------------------------------------

    async def reserve(self, call: ChannelCall, *, owner: str, lease_seconds: float,
                      synced_within: float | None = None) -> Reserved | Refused | Existing:
        """Claim the call's row and reserve its channel, in one transaction. Existing: the row of
        this very call (a retry: same request, same voucher) or of its payment identifier, for
        the caller to answer as any retry. Another call on the same base finds the row of the
        call that holds (or was charged on) that base: refused by the channel's rules.
        `synced_within`: refused `CHANNEL_STALE` when the chain's mirror is older (seconds)."""
        guard = _RESERVE[call.kind]
        for _ in range(_RESERVE_ATTEMPTS):
            now = _now()
            fresh = now - timedelta(seconds=synced_within) if synced_within is not None else _EPOCH
            params = {"b_cid": call.channel_id, "b_now": now, "b_base": call.base, "b_fresh": fresh,
                      "b_ceiling": call.voucher.ceiling, "b_owner": owner,
                      "b_lease": now + timedelta(seconds=lease_seconds)}

            async def take_channel(conn: Any, row_id: str, params: dict[str, Any] = params) -> bool:
                return (await conn.execute(guard.write, {**params, "b_row": row_id})).rowcount == 1

            claimed = await self._ledger.claim(call.claim_request(), owner=owner,
                                               lease_seconds=lease_seconds, within=take_channel)
            if isinstance(claimed, Existing) and _same_call(claimed.row, call):
                return claimed
            if not isinstance(claimed, Declined | Existing):
                return Reserved(claimed.row_id)
            failed, row = await guard.first_failed(self._ledger, params)
            if row is None:
                return Refused(Refusal(bs.ERR_CHANNEL_NOT_FOUND, (
                    "payload.voucher.channelId names a channel paywire does not know: a channel's "
                    "first payment is a deposit payload")), None)
            if failed is not None:  # (else it changed since: try again)
                channel = Channel.of(row)
                return Refused(_reserve_refusal(failed, call, channel), channel)
        channel = await self.get(call.channel_id)
        return Refused(_busy(channel), channel)

    # -- commit --------------------------------------------------------------------------------

    async def commit(self, row_id: str, call: ChannelCall, *, owner: str, actual: int,
                     result: StoredResult | None = None, keep_result_seconds: float = 0,
                     usage: dict[str, Any] | None = None, upstream_cost_usd: Decimal | None = None,
                     latency_ms: int | None = None, delivered: bool = True,
                     deposit: Onchain | None = None, tx_hash: str | None = None) -> Committed | Withheld:
        """Charge the call `actual` (1 to its price) and settle its row, in one transaction,
        with the result a retry gets. A voucher call commits from `claimed`; a deposit call from
        `settling`/`pending` once its deposit moved, with `deposit`: paywire's own read of the
        chain after the receipt (the balance the charge must fit). Withheld: the row or the
        reservation is no longer this call's, or the charge does not fit: nothing written."""
        if actual < 1:  # a charge of 0 would leave the next call on the same base (same key)
            raise ValueError(f"a channel call's charge must be at least 1 atomic unit, got {actual}")
        if actual > call.price:
            return Withheld(Refusal(bs.ERR_CHARGE_EXCEEDS_SIGNED_CUMULATIVE, (
                f"the charge {actual} is above the price the voucher signed for ({call.price})")))
        if (call.kind == PAYLOAD_TYPE_DEPOSIT) != (deposit is not None):
            raise ValueError("a deposit call (and only one) commits with paywire's own read of "
                             "the channel after its deposit moved")
        now = _now()
        params = {
            "b_row": row_id, "b_owner": owner, "b_cid": call.channel_id, "b_base": call.base,
            "b_actual": actual, "b_now": now, "b_tx": tx_hash,
            "b_delivered": now if delivered else None, "b_usage": usage, "b_latency": latency_ms,
            "b_cost": upstream_cost_usd, "b_ceiling": call.voucher.ceiling,
            "b_signature": call.voucher.signature, "b_threshold": self._threshold,
            "b_due": now + self._interval}
        if deposit is not None:
            params |= _mirror_params(deposit, now) | {"b_state": _state_after_deposit(deposit)}
        row_guard, channel_guard = _COMMIT[call.kind]
        try:
            async with self._ledger.writing() as conn:
                if (await conn.execute(row_guard.write, params)).rowcount != 1:
                    raise _Withhold
                row = (await conn.execute(channel_guard.write, params)).mappings().first()
                if row is None:
                    raise _Withhold
                if result is not None:
                    await keep_result(conn, row_id, result, now=now, seconds=keep_result_seconds)
        except _Withhold:
            return await self._explain_commit(call, params)
        log.info("payment %s -> settled (channel %s charged %d on %d)", row_id, call.channel_id,
                 actual, call.base)
        return Committed(Channel.of(row), call.base, actual)

    async def _explain_commit(self, call: ChannelCall, params: dict[str, Any]) -> Withheld:
        row_guard, channel_guard = _COMMIT[call.kind]
        failed, _ = await row_guard.first_failed(self._ledger, params)
        if failed is None:
            failed, _ = await channel_guard.first_failed(self._ledger, params)
        if failed == "balance":
            refusal = Refusal(bs.ERR_CUMULATIVE_EXCEEDS_BALANCE, (
                "the channel's balance on chain no longer covers this charge (a withdrawal or a "
                "refund): nothing was charged; top the channel up with a deposit payload"))
        else:
            refusal = Refusal(TAKEN_OVER, (
                "the call's payment was taken over (its lease ran out) before it was charged: "
                "nothing was charged; send the same request again"))
        log.info("payment %s: channel %s not charged (%s)", params["b_row"], call.channel_id,
                 failed or "changed")
        return Withheld(refusal)

    # -- release, and a deposit's intent -------------------------------------------------------

    async def release(self, row_id: str, channel_id: str | None, *, owner: str, reason: str,
                      states: Sequence[PaymentState] = (PaymentState.CLAIMED,),
                      usage: dict[str, Any] | None = None,
                      upstream_cost_usd: Decimal | None = None, tx_hash: str | None = None) -> bool:
        """Nothing is charged: the row (still this owner's) is released and the channel's
        reservation for it cleared, in one transaction. From `settling`/`pending` only when the
        deposit provably moved nothing. `channel_id` None: whichever channel the row reserved."""

        async def clear(conn: Any, row: str) -> bool:
            if channel_id is None:
                await conn.execute(_CLEAR_ROW, {"b_row": row, "b_now": _now()})
            else:
                await conn.execute(_CLEAR, {"b_cid": channel_id, "b_row": row, "b_now": _now()})
            return True

        return await self._ledger.release(row_id, reason, owner=owner, states=states, usage=usage,
                                          upstream_cost_usd=upstream_cost_usd, tx_hash=tx_hash,
                                          within=clear)

    async def begin_deposit(self, row_id: str, call: ChannelCall, *, owner: str,
                            chain_ref: dict[str, Any], lease_seconds: float, actual: int,
                            result: StoredResult | None = None,
                            keep_result_seconds: float = 0) -> bool:
        """A deposit call's intent, before its deposit is broadcast (`Ledger.begin_settlement`:
        claimed -> settling, with `chain_ref`, the charge and the kept result), and its channel
        held without a lease until the chain decides, in one transaction. False: the row or the
        reservation is no longer this call's (nothing may be broadcast)."""

        async def hold(conn: Any, row: str) -> bool:
            params = {"b_cid": call.channel_id, "b_row": row, "b_owner": owner, "b_now": _now()}
            return (await conn.execute(_HOLD, params)).rowcount == 1

        return await self._ledger.begin_settlement(
            row_id, owner=owner, chain_ref=chain_ref, lease_seconds=lease_seconds, result=result,
            keep_result_seconds=keep_result_seconds, charged_atomic=actual, within=hold)

    # -- a cooperative refund ------------------------------------------------------------------

    async def begin_refund(self, channel_id: str, charged: int, *, owner: str,
                           lease_seconds: float = REFUND_LEASE_SECONDS) -> Channel | None:
        """Hold the channel for a refund the payer asked for, signed on the running total
        `charged`: closed to vouchers (a voucher accepted meanwhile could become unclaimable),
        held by `owner` for `lease_seconds` (`pending_row` stays NULL: no call reserves it). Only
        while no call holds it and nothing was charged since; or, closing, when the hold of a
        refund nobody finished lapsed (its replica died before sending, or its outcome was never
        read) and no withdrawal is pending: the payer's retry takes it over. The retry signs the
        refundNonce the chain holds, the very one the first attempt signed unless that one
        landed (then the mirror before this reopened the channel): of two refund transactions on
        one nonce, at most one can land. The hold as written (`end_refund` takes it), or None
        (then `get` says why: busy, a moved total, a refund running, a state that takes no
        refund)."""
        now = _now()
        free = and_(_C.state.in_((ChannelState.OPEN, ChannelState.CLOSED)),
                    or_(_C.pending_row.is_(None), _C.lease_until < now))
        abandoned = and_(_C.state == ChannelState.CLOSING, _C.pending_row.is_(None),
                         _C.withdraw_requested_at == 0,
                         or_(_C.lease_until.is_(None), _C.lease_until < now))
        async with self._ledger.writing() as conn:
            row = (await conn.execute(
                update(channels_table).where(and_(
                    _C.channel_id == channel_id.lower(), _C.charged_atomic == charged,
                    or_(free, abandoned)))
                .values(state=ChannelState.CLOSING, pending_row=None, owner=owner,
                        lease_until=now + timedelta(seconds=lease_seconds), claim_due_at=now,
                        updated_at=now)
                .returning(*channels_table.c))).mappings().first()
        return Channel.of(row) if row is not None else None

    async def end_refund(self, held: Channel, onchain: Onchain) -> Channel | None:
        """The end of the refund `held` (begin_refund's hold): paywire's own read of the chain
        after its transaction (or before it, when nothing was sent), the state it gives (closing
        while a withdrawal is pending, closed when nothing is left, else open), the hold cleared.
        Only while the hold is still this one: None when it lapsed and a retry took it over, or
        the mirror ended it (the refund landed), and nothing is written."""
        now = _now()
        async with self._ledger.writing() as conn:
            row = (await conn.execute(
                update(channels_table).where(and_(
                    _C.channel_id == held.channel_id, _C.state == ChannelState.CLOSING,
                    _C.pending_row.is_(None), _C.owner == held.owner,
                    _C.lease_until == held.lease_until))
                .values(**_mirror_columns(onchain, now), state=_state_of(onchain), owner=None,
                        lease_until=None, updated_at=now,
                        charged_atomic=case((_C.charged_atomic < onchain.total_claimed,
                                             onchain.total_claimed), else_=_C.charged_atomic))
                .returning(*channels_table.c))).mappings().first()
        return Channel.of(row) if row is not None else None

    # -- the reconciler's verdicts on channel calls ---------------------------------------------

    def resolution(self, row: PaymentRow, to: PaymentState,
                   onchain: Onchain | None = None) -> Within:
        """What a channel call's row carries with the reconciler's verdict, in its transaction:
        released, the channel's reservation cleared; settled (a deposit the chain shows moved,
        `onchain` paywire's read after it), the call charged what its intent recorded on top of
        its base, with the voucher the intent kept, as the call's own commit would have. A
        channel no longer held for the row declines (nothing is written; asked again later)."""
        if to == PaymentState.RELEASED:
            async def clear(conn: Any, row_id: str) -> bool:
                await conn.execute(_CLEAR_ROW, {"b_row": row_id, "b_now": _now()})
                return True
            return clear
        if to != PaymentState.SETTLED or onchain is None or row.channel_id is None:
            raise ValueError("a channel call settles by the reconciler only as a deposit that moved, "
                             "with paywire's read of the channel")
        voucher = (row.chain_ref or {}).get("voucher") or {}
        now = _now()
        params = {"b_row": row.id, "b_cid": row.channel_id, "b_base": int(row.nonce.rsplit("/", 1)[1]),
                  "b_actual": row.charged, "b_now": now, "b_ceiling": int(voucher["ceiling"]),
                  "b_signature": voucher["signature"], "b_threshold": self._threshold,
                  "b_due": now + self._interval, **_mirror_params(onchain, now),
                  "b_state": _state_after_deposit(onchain)}
        charge = _COMMIT[PAYLOAD_TYPE_DEPOSIT][1].write

        async def commit(conn: Any, row_id: str) -> bool:
            return (await conn.execute(charge, params)).first() is not None
        return commit

    async def release_dead(self, row: PaymentRow, *, actor: str, lease_seconds: float = 30.0) -> bool:
        """A channel call whose replica died before anything was broadcast (`dead_calls`): taken
        by a compare-and-set on its lease (one taker among replicas), then released with its
        reservation. The call was not charged; the channel is free again."""
        assert row.channel_id is not None, "not a channel call"
        taken = await self._ledger.take(row.id, owner=actor, lease_seconds=lease_seconds,
                                        states=(PaymentState.CLAIMED,))
        if taken is None:
            return False
        return await self.release(row.id, row.channel_id, owner=actor,
                                  reason="its replica stopped before the call ended (lease ran out)")


# -- the rules, once each, and the statements that apply them (built once: building a statement
# costs more CPU than SQLite takes to run it) ------------------------------------------------------

def _bind(name: str, like: Any) -> Any:
    return bindparam(name, type_=like.type)


_NOW = _bind("b_now", _C.updated_at)
_ROW = _bind("b_row", _P.id)
_OWNER = _bind("b_owner", _P.owner)
_BASE = _bind("b_base", _C.charged_atomic)
_CEILING = _bind("b_ceiling", _C.charged_atomic)
_ACTUAL = _bind("b_actual", _C.charged_atomic)
_CHANNEL = _C.channel_id == _bind("b_cid", _C.channel_id)
_MIRROR = ("balance_atomic", "total_claimed_atomic", "withdraw_requested_at", "refund_nonce",
           "onchain_synced_at")


@dataclass(frozen=True)
class _Guarded:
    """A conditional UPDATE built once: its rules (named conditions, all of which the row must
    meet), and the read that says which rule a row fails, with the very same conditions."""

    names: tuple[str, ...]
    write: Any
    explain: Any

    @staticmethod
    def build(table: Any, key: ColumnElement[bool], rules: Rules, values: dict[str, Any], *,
              returning: bool = False) -> _Guarded:
        write = update(table).where(and_(key, *(rule for _, rule in rules))).values(**values)
        flags = [case((rule, 1), else_=0).label(f"rule_{i}") for i, (_, rule) in enumerate(rules)]
        return _Guarded(tuple(name for name, _ in rules),
                        write.returning(*table.c) if returning else write,
                        select(table, *flags).where(key))

    async def first_failed(self, ledger: Ledger, params: dict[str, Any]) -> tuple[str | None, Any]:
        """The row, and the first rule it fails now (None: it meets them all); (None, None):
        no such row."""
        async with ledger.reading() as conn:
            row = (await conn.execute(self.explain, params)).mappings().first()
        if row is None:
            return None, None
        return next((n for i, n in enumerate(self.names) if not row[f"rule_{i}"]), None), row


def _reserve_guard(kind: str) -> _Guarded:
    """What a channel must satisfy for a call of `kind` to reserve it. A dead replica's
    reservation (its lease, renewed with its row's, ran out) is free: its row is taken over by a
    retry, or released by the reconciler. In the order a refusal names them: what holds now says
    little while another call is in flight, so that comes first."""
    open_to = (ChannelState.OPEN,) if kind == PAYLOAD_TYPE_VOUCHER else (
        ChannelState.OPEN, ChannelState.CLOSED)  # a deposit opens a closed channel
    rules: Rules = [
        # the chain's mirror is recent enough to check a voucher against (else: read it again)
        ("stale", _C.onchain_synced_at >= _bind("b_fresh", _C.onchain_synced_at)),
        ("busy", or_(_C.pending_row.is_(None), _C.lease_until < _NOW)),
        ("state", _C.state.in_(open_to)),
        ("withdrawal", _C.withdraw_requested_at == 0),
        ("base", _C.charged_atomic == _BASE),
    ]
    if kind == PAYLOAD_TYPE_VOUCHER:  # (a deposit's ceiling is checked against the chain)
        # (and above totalClaimed, as the spec asks: it follows from the base, as the running
        # total is never below totalClaimed (`mirror`) and a price is at least 1)
        rules.append(("balance", _C.balance_atomic >= _CEILING))
    return _Guarded.build(channels_table, _CHANNEL, rules, {
        "pending_row": _ROW, "owner": _OWNER, "lease_until": _bind("b_lease", _C.lease_until),
        "updated_at": _NOW})


def _commit_guards(kind: str) -> tuple[_Guarded, _Guarded]:
    """What the row and the channel must still be for a call of `kind` to be charged, and the
    charge: the row settled with it, the channel's running total raised by it (a deposit's: with
    the balance paywire read after the deposit moved, which the total must fit)."""
    deposit = kind == PAYLOAD_TYPE_DEPOSIT
    states = (PaymentState.SETTLING, PaymentState.PENDING) if deposit else (PaymentState.CLAIMED,)
    row = _Guarded.build(
        payments_table, _P.id == _ROW,
        [("owner", _P.owner == _OWNER), ("state", _P.state.in_(states))],
        {"state": PaymentState.SETTLED, "charged_atomic": _ACTUAL, "lease_until": None,
         "error": None, "tx_hash": func.coalesce(_bind("b_tx", _P.tx_hash), _P.tx_hash),
         "updated_at": _NOW, "delivered_at": _bind("b_delivered", _P.delivered_at),
         "usage": _bind("b_usage", _P.usage), "latency_ms": _bind("b_latency", _P.latency_ms),
         "upstream_cost_usd": _bind("b_cost", _P.upstream_cost_usd)})
    mirror = {name: _bind(f"b_{name}", _C[name]) for name in _MIRROR}
    balance = mirror["balance_atomic"] if deposit else _C.balance_atomic
    total_claimed = mirror["total_claimed_atomic"] if deposit else _C.total_claimed_atomic
    values: dict[str, Any] = {
        "charged_atomic": _C.charged_atomic + _ACTUAL, "signed_max_atomic": _CEILING,
        "signature": _bind("b_signature", _C.signature), "pending_row": None, "owner": None,
        "lease_until": None, "last_request_at": _NOW, "updated_at": _NOW,
        # due at once past the threshold, else an interval after the first unclaimed charge
        "claim_due_at": case(
            (_C.charged_atomic + _ACTUAL - total_claimed >= _bind("b_threshold", _C.charged_atomic),
             _NOW), else_=func.coalesce(_C.claim_due_at, _bind("b_due", _C.claim_due_at)))}
    if deposit:  # the deposit moved: the chain's view as paywire read it, the channel open
        values |= mirror | {"state": case((_C.state == ChannelState.QUARANTINED, _C.state),
                                          else_=_bind("b_state", _C.state))}
    channel = _Guarded.build(channels_table, _CHANNEL, [
        ("reservation", _C.pending_row == _ROW),
        ("base", _C.charged_atomic == _BASE),
        ("balance", _C.charged_atomic + _ACTUAL <= balance),  # never charged beyond the deposit
    ], values, returning=True)
    return row, channel


_KINDS = (PAYLOAD_TYPE_VOUCHER, PAYLOAD_TYPE_DEPOSIT)
_RESERVE = {kind: _reserve_guard(kind) for kind in _KINDS}
_COMMIT = {kind: _commit_guards(kind) for kind in _KINDS}
_CLEAR = (update(channels_table).where(and_(_CHANNEL, _C.pending_row == _ROW))
          .values(pending_row=None, owner=None, lease_until=None, updated_at=_NOW))
_CLEAR_ROW = (update(channels_table).where(_C.pending_row == _ROW)
              .values(pending_row=None, owner=None, lease_until=None, updated_at=_NOW))
_HOLD = (update(channels_table).where(and_(_CHANNEL, _C.pending_row == _ROW, _C.owner == _OWNER))
         .values(lease_until=None, updated_at=_NOW))


def _same_call(row: PaymentRow, call: ChannelCall) -> bool:
    """Whether an existing row is this call's own (a retry: the same request on the same voucher,
    or its payment identifier's row), not another call on the same base: that one is explained
    by the channel's rules (busy while it runs, the base moved once it is charged)."""
    return row.key.normalized() != call.key.normalized() or row.request_digest == call.request_digest


def _reserve_refusal(failed: str, call: ChannelCall, channel: Channel) -> Refusal:
    ceiling, expected = call.voucher.ceiling, channel.charged + call.price
    if failed == "stale":
        return Refusal(CHANNEL_STALE, "paywire's read of the channel on chain is too old to check "
                                      "this voucher against: read it again")
    if failed == "busy":
        return _busy(channel)
    if failed == "base":
        return Refusal(bs.ERR_CUMULATIVE_AMOUNT_MISMATCH, (
            f"payload.voucher.maxClaimableAmount must be the channel's running total "
            f"({channel.charged}) plus this call's price ({call.price}): {expected}, not "
            f"{ceiling}; resync from the requirement's extra.channelState and sign again"))
    if failed == "balance":
        return Refusal(bs.ERR_CUMULATIVE_EXCEEDS_BALANCE, (
            f"payload.voucher.maxClaimableAmount ({ceiling}) is above the channel's balance "
            f"({channel.onchain.balance}): top it up with a deposit payload"))
    return _state_refusal(channel, withdrawing=failed == "withdrawal")


def _state_refusal(channel: Channel, *, withdrawing: bool) -> Refusal:
    if withdrawing or (channel.state == ChannelState.CLOSING
                       and channel.onchain.withdraw_requested_at):
        return Refusal(CHANNEL_CLOSING, (
            "the channel's payer asked to withdraw (a withdrawal is pending on chain): it takes "
            "no new voucher; pay from another channel (another salt) or with the exact scheme"))
    if channel.state == ChannelState.CLOSING:  # (held by a cooperative refund, until it ends)
        return Refusal(CHANNEL_CLOSING, (
            "a cooperative refund of this channel is under way: it takes no new voucher until the "
            "refund ends (then it holds what the refund left); try again in a few seconds, or pay "
            "from another channel (another salt) or with the exact scheme"))
    if channel.state == ChannelState.QUARANTINED:
        return Refusal(CHANNEL_QUARANTINED, (
            "the channel is held for the operator (the chain disagreed with its record): pay from "
            "another channel (another salt) or with the exact scheme"))
    return Refusal(CHANNEL_CLOSED, "the channel holds no deposit paywire can charge: send a deposit payload")


# When a payer told channel_busy should try again: the holding call's lease is renewed while it
# runs, so its end says nothing of when the call ends; most calls end within a second.
BUSY_RETRY_SECONDS = 1.0


def _busy(channel: Channel | None) -> Refusal:
    lease = channel.lease_until if channel is not None else None
    wait = BUSY_RETRY_SECONDS if lease is not None else None  # (None: until the chain decides)
    return Refusal(bs.ERR_CHANNEL_BUSY, (
        "another call of this channel is in progress (a channel serves one call at a time): "
        "send this one again when it has ended"), retry_after=wait)


def _state_of(onchain: Onchain) -> ChannelState:
    if onchain.withdraw_requested_at:
        return ChannelState.CLOSING
    return ChannelState.OPEN if onchain.balance > onchain.total_claimed else ChannelState.CLOSED


def _state_after_deposit(onchain: Onchain) -> ChannelState:
    return ChannelState.CLOSING if onchain.withdraw_requested_at else ChannelState.OPEN


def _mirror_columns(onchain: Onchain, synced_at: datetime) -> dict[str, Any]:
    """The mirror columns (`_MIRROR`) as a read of the chain sets them."""
    values = (onchain.balance, onchain.total_claimed, onchain.withdraw_requested_at,
              onchain.refund_nonce, synced_at)
    return dict(zip(_MIRROR, values, strict=True))


def _mirror_params(onchain: Onchain, synced_at: datetime) -> dict[str, Any]:
    return {f"b_{name}": value for name, value in _mirror_columns(onchain, synced_at).items()}
