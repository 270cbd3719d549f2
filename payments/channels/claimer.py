"""The channel claimer: what delivered calls were charged through channels becomes the receiver's
money (issue 23 §2; docs/notes/issue-23-channels.md §4).

One replica at a time runs it (the ledger turn `channel-claimer`), a pass every poll interval and
at once when the pipeline says a commit made a channel due (`wake`). A pass:

1. resolves the claims and sweeps a dead replica left open (settling past its lease) or whose
   outcome was unknown (pending), from the chain: every row's totalClaimed at or above its
   claim_to means it landed; otherwise it is released and its channels are claimed again;
2. mirrors the chain for the channels with unclaimed charges, recent use or a withdrawal (one
   Multicall3 read per hundred channels, written by `ChannelStore.mirror`: a withdrawal seen
   makes the channel `closing` and due at once, x402 #3464);
3. selects the due channels (claim_due_at passed; closing ones first);
4. checks each against that read (its config hashes to its id, the running total fits the
   balance, the stored voucher covers it and recovers to payerAuthorizer): one that fails is
   `quarantined` and leaves the batch, so it cannot sink it;
5. dry-runs each batch of at most `max_claims` (eth_estimateGas: no gas): one the contract
   refuses is dry-run in halves down to the rows it refuses (an ERC-1271 payer's voucher is
   checked here only), which are quarantined, and the rest goes on; one above the gas a single
   transaction may use (`max_claim_gas`) goes in parts;
6. writes the intent (a paywire_claims row and its paywire_claim_rows: each channel's running
   total at that moment and the voucher it is claimed with) in one transaction that locks the
   channels and refuses any already in an open claim: two claimers never claim a channel at once;
   then broadcasts `{type:"claim"}` (the SDK's builders, signed by paywire's receiver-authorizer
   key) through `send`;
7. records the outcome: moved -> settled, each channel's totalClaimed raised, the transaction's
   gas registered (payments/chain_fees.py), in one transaction; nothing moved (the facilitator's
   own dry run refused it: the chain changed since ours) -> released, the channels due again;
   unknown -> pending, resolved by step 1 of a later pass;
8. sweeps (`{type:"settle"}`) what the receiver has claimed but not received, after a pass that
   claimed and at least every settle interval.

A crash anywhere loses nothing and claims nothing twice: claims are cumulative on chain (a row at
or below the channel's totalClaimed is skipped), so a claim sent again after a crash moves
nothing more, and the ledger settles a claim once (a compare-and-set on its open state).
Vouchers are bearer allowances and keys are secrets: neither is ever logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, case, exists, insert, or_, select, update
from x402.mechanisms.evm.batch_settlement.authorizer_signer import sign_claim_batch
from x402.mechanisms.evm.batch_settlement.errors import (
    ERR_CLAIM_SIMULATION_FAILED,
    ERR_NOTHING_TO_SETTLE,
    ERR_SETTLE_SIMULATION_FAILED,
)
from x402.mechanisms.evm.batch_settlement.server.channel_manager_common import (
    build_claim_payment_payload,
    build_payment_requirements,
    build_settle_payment_payload,
)
from x402.mechanisms.evm.batch_settlement.types import AuthorizerSigner, VoucherClaim
from x402.mechanisms.evm.batch_settlement.types import ChannelConfig as SdkChannelConfig
from x402.mechanisms.evm.utils import get_evm_chain_id
from x402.schemas import SettleResponse

from .. import failpoints
from ..broadcast_trace import BroadcastTrace, Sent, current_trace
from ..chain_fees import FeeKind, expect
from ..chain_probe import JsonRpc, ProbeError
from ..ledger_schema import (
    OPEN_CLAIMS,
    ChannelState,
    ClaimKind,
    ClaimState,
    channels_table,
    claim_rows_table,
    claims_table,
)
from ..settlement_outcome import Moved, NotMoved, Unknown, Verdict, classify
from .chain import (
    estimate_claim,
    find_claim_transaction,
    read_channels,
    read_receiver,
)
from .store import Channel, ChannelStore
from .wire import Onchain, channel_id_of, recover_signer, voucher_digest

log = logging.getLogger("paywire.channels.claimer")

TURN = "channel-claimer"  # the ledger turn (paywire_turns) one replica's claimer holds at a time
Send = Callable[[str, dict[str, Any]], Awaitable[SettleResponse]]
Clock = Callable[[], datetime]

_C = channels_table.c
_K = claims_table.c
_R = claim_rows_table.c
_TX = re.compile(r"0x[0-9a-fA-F]{64}")
# Refusals the SDK's facilitator gives before it broadcasts anything (its own dry run, or a read).
_REFUSED_BEFORE_SENDING = frozenset({ERR_CLAIM_SIMULATION_FAILED, ERR_SETTLE_SIMULATION_FAILED,
                                     ERR_NOTHING_TO_SETTLE})


@dataclass(frozen=True)
class ClaimPolicy:
    """The operator's claim settings (agent/settings.py). `claim_threshold_atomic` and
    `claim_interval_seconds` are the store's due rules (ChannelStore's), used again when a claim
    lands while new charges came in."""

    poll_seconds: float = 30.0
    sync_seconds: float = 120.0  # channels used this recently are mirrored every pass
    max_claims: int = 100  # channels per claim transaction
    settle_interval_seconds: float = 300.0  # the longest claimed funds wait for a sweep
    claim_threshold_atomic: int = 1_000_000
    claim_interval_seconds: float = 300.0
    # The gas one claim transaction may take: the SDK's FacilitatorWeb3Signer (and paywire's
    # signers built on it) send every transaction with a fixed 500,000 gas limit, and a claim
    # takes ~25,000 gas per channel; a batch estimated above this goes in parts.
    max_claim_gas: int = 450_000
    send_timeout_seconds: float = 60.0  # a send not answered by then is pending
    lease_seconds: float = 120.0  # an intent's: past it, another claimer resolves it

    def __post_init__(self) -> None:
        if self.max_claims < 1:
            raise ValueError("max_claims: at least 1 channel per claim")
        if self.lease_seconds <= self.send_timeout_seconds:
            raise ValueError("lease_seconds must exceed send_timeout_seconds: a claim being sent "
                             "must not look abandoned to another claimer")


@dataclass
class ClaimTally:
    """What one pass did."""

    turn: bool = False  # this pass held the turn
    mirrored: int = 0  # channels read from the chain
    quarantined: int = 0
    claims: int = 0  # claim transactions that moved
    channels_claimed: int = 0
    claimed_atomic: int = 0
    sweeps: int = 0
    swept_atomic: int = 0
    pending: int = 0  # sent, outcome unknown
    released: int = 0  # intents that moved nothing
    resolved: int = 0  # open claims a pass decided from the chain
    skipped: int = 0  # channels left: in another claim, another key's, or unread
    networks: set[str] = field(default_factory=set)  # where a claim moved this pass


@dataclass(frozen=True)
class _Row:
    """One channel in a claim: its running total when the intent was written, and the voucher
    (the latest accepted) it is claimed with."""

    channel: Channel
    claim_to: int
    voucher_max: int
    signature: str = field(repr=False)

    @property
    def channel_id(self) -> str:
        return self.channel.channel_id

    def voucher_claim(self) -> VoucherClaim:
        c = self.channel.config
        config = SdkChannelConfig(c.payer, c.payer_authorizer, c.receiver, c.receiver_authorizer,
                                  c.token, c.withdraw_delay, c.salt)
        return VoucherClaim(config, str(self.voucher_max), self.signature, str(self.claim_to))


@dataclass(frozen=True)
class _Intent:
    claim_id: str
    network: str
    rows: list[_Row]
    amount: int
    created_at: datetime


@dataclass(frozen=True)
class _Open:
    """An open claim or sweep a pass resolves."""

    claim_id: str
    network: str
    kind: ClaimKind
    tx_hash: str | None
    amount: int
    created_at: datetime
    rows: list[tuple[str, int]]  # (channel, claim_to)


def _aware(moment: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes (stored as UTC)."""
    return moment if moment is None or moment.tzinfo else moment.replace(tzinfo=UTC)


def _utc_now() -> datetime:
    return datetime.now(UTC)


class ChannelClaimer:
    """Claims what channels' calls were charged, and sweeps it to the receiver.

    `send(network, payload)`: the facilitator's settle of a batch-settlement payload (`claim` or
    `settle`; production: `PaymentProcessor.settle_channel`); `traced`: the facilitator runs in
    this process, so a BroadcastTrace sees its sends. `authorizer`: paywire's receiver-authorizer
    key (claims of channels naming another are left alone). `rpc_for(network)`: paywire's own
    reads of that chain (None: the network is skipped)."""

    def __init__(self, store: ChannelStore, *, send: Send, authorizer: AuthorizerSigner,
                 rpc_for: Callable[[str], JsonRpc | None], owner: str,
                 policy: ClaimPolicy | None = None, traced: bool = False,
                 clock: Clock = _utc_now) -> None:
        self._store, self._ledger = store, store.ledger
        self._send_fn, self._authorizer, self._rpc_for = send, authorizer, rpc_for
        self._owner = f"claimer@{owner}"[:64]
        self._policy = policy or ClaimPolicy()
        self._traced, self._clock = traced, clock
        self._wake = asyncio.Event()
        self._turn_until = 0.0  # (monotonic) while this replica holds the turn
        # A pass failed (the database went mid-pass): a claim or sweep of ours may be open with
        # no outcome written. Nothing else in this process works on it (one pass at a time), so
        # the next pass resolves it from the chain, with or without the turn, not after its lease.
        self._left_open = False

    # -- running -------------------------------------------------------------------------------

    def wake(self) -> None:
        """A commit made a channel due: a pass now (on the replica holding the turn; others
        find it at their next poll)."""
        self._wake.set()

    async def run_forever(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception as exc:  # noqa: BLE001 - the database or a node may be down
                log.warning("claim pass failed (%s: %s); next pass in %.0f s",
                            type(exc).__name__, exc, self._policy.poll_seconds)
            # (asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._policy.poll_seconds):
                    await self._wake.wait()
            self._wake.clear()

    async def run_once(self) -> ClaimTally:
        """A pass, if this replica holds the turn or takes it (a poll interval at a time)."""
        if time.monotonic() >= self._turn_until:
            if not await self._ledger.take_turn(TURN, owner=self._owner,
                                                seconds=self._policy.poll_seconds):
                tally = ClaimTally()
                if self._left_open:  # (another replica's turn: it would wait for the lease)
                    await self._resolve_open(tally)
                    self._left_open = False
                return tally
            # (a margin under the turn's end: past it, another replica may take the turn)
            self._turn_until = time.monotonic() + 0.9 * self._policy.poll_seconds
        try:
            return await self.run_pass()
        except BaseException:
            self._left_open = True
            raise

    async def run_pass(self) -> ClaimTally:
        """One pass without the turn (`run_once` takes it first). Safe beside another claimer's
        pass (a turn that ran out mid-pass): a channel is in one open claim at most."""
        tally = ClaimTally(turn=True)
        await self._resolve_open(tally)
        self._left_open = False
        reads = await self._mirror(tally)
        for network, due in (await self._due()).items():
            await self._claim_network(network, due, reads.get(network, {}), tally)
        await self._sweep(tally)
        if tally.claims or tally.sweeps or tally.quarantined or tally.pending or tally.resolved:
            log.info("claim pass: %d claims (%d channels, %d atomic), %d sweeps (%d atomic), "
                     "%d quarantined, %d pending, %d released, %d resolved", tally.claims,
                     tally.channels_claimed, tally.claimed_atomic, tally.sweeps,
                     tally.swept_atomic, tally.quarantined, tally.pending, tally.released,
                     tally.resolved)
        return tally

    # -- 2. the mirror -------------------------------------------------------------------------

    async def _mirror(self, tally: ClaimTally) -> dict[str, dict[str, Onchain]]:
        """Read and mirror the channels with unclaimed charges, recent use or a withdrawal."""
        recent = self._clock() - timedelta(seconds=self._policy.sync_seconds)
        async with self._ledger.reading() as conn:
            rows = (await conn.execute(select(_C.network, _C.channel_id).where(or_(
                _C.charged_atomic > _C.total_claimed_atomic, _C.last_request_at >= recent,
                _C.state == ChannelState.CLOSING)))).all()
        by_network: dict[str, list[str]] = {}
        for network, channel_id in rows:
            by_network.setdefault(network, []).append(channel_id)
        reads: dict[str, dict[str, Onchain]] = {}
        for network, ids in by_network.items():
            reads[network] = await self._read_and_mirror(network, ids, tally)
        return reads

    async def _read_and_mirror(self, network: str, ids: Sequence[str],
                               tally: ClaimTally) -> dict[str, Onchain]:
        rpc = self._rpc_for(network)
        if rpc is None or not ids:
            return {}
        synced_at = _utc_now()  # (before the read: the mirror is at least this fresh)
        try:
            read = await read_channels(rpc, ids)
        except (ProbeError, ValueError) as exc:
            log.warning("channels on %s could not be read (%s): no claim there this pass",
                        network, exc)
            return {}
        for channel_id, onchain in read.items():
            await self._store.mirror(channel_id, onchain, synced_at=synced_at)
        tally.mirrored += len(read)
        return read

    # -- 3. selection --------------------------------------------------------------------------

    async def _due(self) -> dict[str, list[str]]:
        """Channels due for a claim with something to claim and in no open claim, by network:
        closing ones (a withdrawal is running) first, then by due time."""
        in_open_claim = exists(select(_R.channel_id).join(claims_table, _K.id == _R.claim_id)
                               .where(and_(_R.channel_id == _C.channel_id,
                                           _K.state.in_(OPEN_CLAIMS))))
        statement = (
            select(_C.network, _C.channel_id)
            .where(and_(_C.state != ChannelState.QUARANTINED, _C.claim_due_at <= self._clock(),
                        _C.charged_atomic > _C.total_claimed_atomic, ~in_open_claim))
            .order_by(case((_C.state == ChannelState.CLOSING, 0), else_=1), _C.claim_due_at)
            .limit(self._policy.max_claims * 10))
        async with self._ledger.reading() as conn:
            rows = (await conn.execute(statement)).all()
        due: dict[str, list[str]] = {}
        for network, channel_id in rows:
            due.setdefault(network, []).append(channel_id)
        return due

    # -- 4-7. claims ---------------------------------------------------------------------------

    async def _claim_network(self, network: str, due: list[str], reads: dict[str, Onchain],
                             tally: ClaimTally) -> None:
        unread = [cid for cid in due if cid not in reads]
        if unread:  # (charged since the mirror's selection)
            reads = {**reads, **await self._read_and_mirror(network, unread, tally)}
        rpc = self._rpc_for(network)
        readable = [cid for cid in due if cid in reads]
        tally.skipped += len(due) - len(readable)
        if rpc is None or not readable:
            return
        rows = await self._candidates(network, readable, reads, tally)
        size = self._policy.max_claims
        for start in range(0, len(rows), size):
            await self._claim_rows(network, rpc, rows[start:start + size], reads, tally)

    async def _candidates(self, network: str, ids: list[str], reads: dict[str, Onchain],
                          tally: ClaimTally) -> list[_Row]:
        """The due channels that pass the pre-check against the chain's read, as they are now
        (the intent checks them again, locked); those that fail are quarantined."""
        async with self._ledger.reading() as conn:
            found = (await conn.execute(select(channels_table).where(_C.channel_id.in_(ids))
                                        .order_by(_C.channel_id))).mappings().all()
        rows, culprits = self._checked(network, found, reads)
        await self._quarantine(culprits, tally)
        return rows

    def _checked(self, network: str, channels: Iterable[Any],
                 reads: dict[str, Onchain]) -> tuple[list[_Row], list[tuple[str, str]]]:
        """Channel rows sorted by the pre-check: the claimable ones (as claim rows, up to their
        running total with their latest voucher), and those to quarantine, with why."""
        chain_id = get_evm_chain_id(network)
        rows: list[_Row] = []
        culprits: list[tuple[str, str]] = []
        for mapping in channels:
            channel = Channel.of(mapping)
            problem, claimable = self._check(channel, reads[channel.channel_id], chain_id)
            if problem is not None:
                culprits.append((channel.channel_id, problem))
            elif claimable:
                assert channel.signed_max is not None and channel.signature is not None
                rows.append(_Row(channel, channel.charged, channel.signed_max, channel.signature))
        return rows, culprits

    async def _claim_rows(self, network: str, rpc: JsonRpc, rows: list[_Row],
                          reads: dict[str, Onchain], tally: ClaimTally) -> None:
        """Dry-run the batch (eth_estimateGas: no gas), then write its intent and send it. A batch
        the contract refuses: the rows it refuses are found by dry-running halves down to single
        rows, quarantined, and the rest claimed. A batch above the gas one transaction may use:
        claimed in parts."""
        claims = [row.voucher_claim() for row in rows]
        try:
            estimate = await estimate_claim(rpc, claims, sign_claim_batch(self._authorizer, claims, network))
        except ProbeError as exc:
            log.warning("a claim could not be dry-run on %s (%s): claimed next pass", network, exc)
            tally.skipped += len(rows)
            return
        if isinstance(estimate, str):
            culprits = await self._culprits(rpc, network, rows)
            await self._quarantine(culprits, tally)
            left = {cid for cid, _ in culprits}
            rest = [row for row in rows if row.channel_id not in left]
            if culprits and rest:
                await self._claim_rows(network, rpc, rest, reads, tally)
            return  # (no culprit: the chain changed meanwhile; the next pass claims it)
        if estimate > self._policy.max_claim_gas and len(rows) > 1:
            # (a claim's gas grows about linearly with its rows, plus a fixed part: parts that
            # should fit with a tenth to spare, each dry-run again)
            fits = len(rows) * self._policy.max_claim_gas * 9 // (estimate * 10)
            size = max(1, min(len(rows) - 1, fits))
            for start in range(0, len(rows), size):
                await self._claim_rows(network, rpc, rows[start:start + size], reads, tally)
            return
        intent = await self._write_intent(network, [row.channel_id for row in rows], reads, tally)
        if intent is None:
            return
        failpoints.reached("claim_after_intent")
        claims = [row.voucher_claim() for row in intent.rows]  # (as the intent locked them)
        any_row = intent.rows[0].channel.config
        payload = build_claim_payment_payload(claims, build_payment_requirements(
            any_row.receiver, any_row.token, network),
            sign_claim_batch(self._authorizer, claims, network)).payload
        verdict, _ = await self._send(network, payload)
        failpoints.reached("claim_after_broadcast")
        if isinstance(verdict, Moved):
            await self._claimed(intent, verdict.transaction, tally)
        else:  # (refused by the facilitator's own dry run: the chain changed since ours)
            await self._not_claimed(intent, verdict, tally)

    async def _write_intent(self, network: str, ids: list[str], reads: dict[str, Onchain],
                            tally: ClaimTally) -> _Intent | None:
        """The intent, in one transaction: the channels locked (PostgreSQL's row locks; SQLite's
        write lock), those already in an open claim left out, each checked against the chain's
        read (a failure quarantined here), the claim and its rows written, and the claimed
        channels' due time cleared (a charge meanwhile sets it again)."""
        now = self._clock()
        claim_id = str(uuid.uuid4())
        async with self._ledger.writing() as conn:
            channels = (await conn.execute(
                select(channels_table).where(_C.channel_id.in_(ids))
                .order_by(_C.channel_id).with_for_update())).mappings().all()
            busy = set((await conn.execute(
                select(_R.channel_id).join(claims_table, _K.id == _R.claim_id)
                .where(and_(_R.channel_id.in_(ids), _K.state.in_(OPEN_CLAIMS))))).scalars())
            free = [m for m in channels if m["channel_id"] not in busy]
            tally.skipped += len(channels) - len(free)
            rows, culprits = self._checked(network, free, reads)
            if culprits:
                await _quarantine_in(conn, culprits, now)
            if rows:
                amount = sum(r.claim_to - reads[r.channel_id].total_claimed for r in rows)
                await conn.execute(insert(claims_table).values(
                    id=claim_id, network=network, kind=ClaimKind.CLAIM, state=ClaimState.SETTLING,
                    owner=self._owner, amount_atomic=amount, created_at=now, updated_at=now,
                    lease_until=now + timedelta(seconds=self._policy.lease_seconds)))
                await conn.execute(insert(claim_rows_table), [
                    {"claim_id": claim_id, "channel_id": r.channel_id, "claim_to_atomic": r.claim_to,
                     "voucher_max_atomic": r.voucher_max} for r in rows])
                await conn.execute(update(channels_table).where(
                    _C.channel_id.in_([r.channel_id for r in rows])).values(claim_due_at=None))
        _log_quarantined(culprits)
        tally.quarantined += len(culprits)
        if not rows:
            return None
        log.info("claim %s on %s: intent for %d channels (%d atomic)", claim_id, network,
                 len(rows), amount)
        return _Intent(claim_id, network, rows, amount, now)

    def _check(self, channel: Channel, onchain: Onchain, chain_id: int) -> tuple[str | None, bool]:
        """The pre-check against the chain's read: (why the channel must be quarantined, or
        None; whether it has anything this key can claim)."""
        if channel.state == ChannelState.QUARANTINED:
            return None, False
        if channel.charged <= max(onchain.total_claimed, channel.onchain.total_claimed):
            return None, False  # nothing left to claim (claimed meanwhile, or elsewhere)
        if channel.config.receiver_authorizer != self._authorizer.address.lower():
            log.warning("channel %s names another receiver-authorizer (%s): claim it with that "
                        "key", channel.channel_id, channel.config.receiver_authorizer)
            return None, False
        if channel_id_of(channel.config, chain_id) != channel.channel_id:
            return "its config does not hash to its id", False
        if channel.charged > onchain.balance:
            return (f"its running total {channel.charged} is above its balance on chain "
                    f"({onchain.balance})"), False
        if channel.signed_max is None or channel.signature is None or channel.signed_max < channel.charged:
            return "no accepted voucher covers its running total", False
        if channel.config.signs_by_ecdsa:  # (an ERC-1271 payer's: the claim's dry run checks it)
            digest = voucher_digest(chain_id, channel.channel_id, channel.signed_max)
            if recover_signer(digest, channel.signature) != channel.config.payer_authorizer:
                return "its voucher is not signed by its payerAuthorizer", False
        return None, True

    async def _send(self, network: str,
                    payload: dict[str, Any]) -> tuple[Verdict, SettleResponse | None]:
        """One transaction through the facilitator: what it did (`classify`, with the SDK's own
        refusals before broadcasting read as nothing moved), and the facilitator's answer."""
        trace = BroadcastTrace()
        token = current_trace.set(trace)
        receipt: SettleResponse | None = None
        error: BaseException | None = None
        try:
            async with asyncio.timeout(self._policy.send_timeout_seconds):
                receipt = await self._send_fn(network, payload)
        except TimeoutError:  # (the facilitator's worker thread may still send: the chain decides)
            return Unknown(f"no answer within {self._policy.send_timeout_seconds:.0f} s",
                           trace.transaction), None
        except Exception as exc:  # classified: a raise is not "nothing moved"
            error = exc
        finally:
            current_trace.reset(token)
        if (receipt is not None and not receipt.success and not receipt.transaction
                and receipt.error_reason in _REFUSED_BEFORE_SENDING and trace.sent is Sent.NO):
            why = f"{receipt.error_reason}: {(receipt.error_message or '')[:300]}"
            return NotMoved(why), receipt
        return classify(receipt, error, trace, traced=self._traced), receipt

    async def _culprits(self, rpc: JsonRpc, network: str,
                        rows: list[_Row]) -> list[tuple[str, str]]:
        """The rows the contract refuses: the batch dry-run in halves down to single rows
        (eth_estimateGas: no gas). Empty when it dry-runs whole (or the chain cannot be asked)."""

        async def refused(part: list[_Row]) -> list[tuple[str, str]]:
            claims = [row.voucher_claim() for row in part]
            why = await estimate_claim(rpc, claims, sign_claim_batch(self._authorizer, claims, network))
            if not isinstance(why, str):
                return []
            if len(part) == 1:
                return [(part[0].channel_id, f"the contract refuses its claim ({why})")]
            middle = len(part) // 2
            return await refused(part[:middle]) + await refused(part[middle:])

        try:
            return await refused(rows)
        except ProbeError as exc:
            log.warning("a refused claim could not be dry-run on %s (%s): claimed again next pass",
                        network, exc)
            return []

    async def _quarantine(self, culprits: list[tuple[str, str]], tally: ClaimTally) -> None:
        if not culprits:
            return
        async with self._ledger.writing() as conn:
            await _quarantine_in(conn, culprits, self._clock())
        _log_quarantined(culprits)
        tally.quarantined += len(culprits)

    async def _claimed(self, intent: _Intent, tx: str, tally: ClaimTally) -> None:
        if await self._settle_claim(intent.claim_id, intent.network, tx, intent.created_at,
                                    [(r.channel_id, r.claim_to) for r in intent.rows]):
            tally.claims += 1
            tally.channels_claimed += len(intent.rows)
            tally.claimed_atomic += intent.amount
            tally.networks.add(intent.network)
            log.info("claim %s on %s settled: %d channels, %d atomic, transaction %s",
                     intent.claim_id, intent.network, len(intent.rows), intent.amount, tx)

    async def _not_claimed(self, intent: _Intent, verdict: NotMoved | Unknown,
                           tally: ClaimTally) -> None:
        if isinstance(verdict, Unknown):
            tally.pending += 1
            log.warning("claim %s on %s: outcome unknown (%s); the chain decides next pass",
                        intent.claim_id, intent.network, verdict.reason[:300])
            await self._mark_pending(intent.claim_id, verdict)
            return
        tally.released += 1
        log.warning("claim %s on %s moved nothing (%s): its %d channels are claimed again",
                    intent.claim_id, intent.network, verdict.reason[:300], len(intent.rows))
        await self._release(intent.claim_id, intent.network, verdict.reason, verdict.transaction,
                            [r.channel_id for r in intent.rows])

    # -- the claim's row: its outcomes (each a compare-and-set on its open state) --------------

    def _open_row(self, claim_id: str) -> Any:
        """The claim, while it is open and this claimer's (its intent's writer, or the one that
        took it over from a dead replica)."""
        return and_(_K.id == claim_id, _K.state.in_(OPEN_CLAIMS), _K.owner == self._owner)

    async def _settle_claim(self, claim_id: str, network: str, tx: str | None,
                            created_at: datetime, rows: list[tuple[str, int]]) -> bool:
        """Settled, each channel's totalClaimed raised to its claim_to (what the chain now holds)
        and its next due time set by the store's rules for what was charged since the intent,
        the transaction's gas registered: one transaction. False: it was not open any more."""
        now = self._clock()
        later = created_at + timedelta(seconds=self._policy.claim_interval_seconds)
        async with self._ledger.writing() as conn:
            moved = await conn.execute(update(claims_table).where(self._open_row(claim_id))
                                       .values(state=ClaimState.SETTLED, tx_hash=tx, error=None,
                                               lease_until=None, updated_at=now))
            if moved.rowcount != 1:
                return False
            for channel_id, claim_to in rows:
                unclaimed = _C.charged_atomic - claim_to
                await conn.execute(update(channels_table).where(_C.channel_id == channel_id).values(
                    total_claimed_atomic=case((_C.total_claimed_atomic < claim_to, claim_to),
                                              else_=_C.total_claimed_atomic),
                    claim_due_at=case(
                        (_C.charged_atomic <= claim_to, None),
                        (or_(_C.state == ChannelState.CLOSING,
                             unclaimed >= self._policy.claim_threshold_atomic), now),
                        (or_(_C.claim_due_at.is_(None), _C.claim_due_at < later), later),
                        else_=_C.claim_due_at),
                    updated_at=now))
            if tx is not None and _TX.fullmatch(tx):
                await expect(self._ledger, tx, network, FeeKind.CLAIM, claim_id, conn=conn)
        return True

    async def _release(self, claim_id: str, network: str, reason: str, tx: str | None,
                       channel_ids: Iterable[str], *, kind: FeeKind = FeeKind.CLAIM) -> bool:
        """Nothing moved: released, its channels due again at once (for the next pass). A
        transaction that was sent and failed still paid its gas: registered."""
        now = self._clock()
        async with self._ledger.writing() as conn:
            moved = await conn.execute(update(claims_table).where(self._open_row(claim_id))
                                       .values(state=ClaimState.RELEASED, error=reason[:2000],
                                               tx_hash=tx, lease_until=None, updated_at=now))
            if moved.rowcount != 1:
                return False
            ids = list(channel_ids)
            if ids:
                await conn.execute(update(channels_table).where(and_(
                    _C.channel_id.in_(ids), _C.charged_atomic > _C.total_claimed_atomic))
                    .values(claim_due_at=now, updated_at=now))
            if tx is not None and _TX.fullmatch(tx):
                await expect(self._ledger, tx, network, kind, claim_id, conn=conn)
        return True

    async def _mark_pending(self, claim_id: str, verdict: Unknown) -> None:
        """Unknown: pending with what is known of its transaction, takeable by any claimer's
        next pass (no lease)."""
        async with self._ledger.writing() as conn:
            await conn.execute(update(claims_table).where(self._open_row(claim_id))
                               .values(state=ClaimState.PENDING, tx_hash=verdict.transaction,
                                       error=verdict.reason[:2000], lease_until=None,
                                       updated_at=self._clock()))

    # -- 1. open claims and sweeps left by a dead replica or an unknown outcome ----------------

    def _takeable(self, now: datetime) -> Any:
        """Open claims and sweeps nobody works on: their lease lapsed (a dead replica's), none
        (pending), or this claimer's own (a failed pass left them: passes run one at a time)."""
        return and_(_K.state.in_(OPEN_CLAIMS), or_(_K.lease_until.is_(None), _K.lease_until < now,
                                                   _K.owner == self._owner))

    async def _resolve_open(self, tally: ClaimTally) -> None:
        now = self._clock()
        async with self._ledger.reading() as conn:
            ids = list((await conn.execute(select(_K.id).where(self._takeable(now))
                                           .order_by(_K.created_at))).scalars())
        for claim_id in ids:
            taken = await self._take(claim_id)
            if taken is None:
                continue  # another claimer took it
            rpc = self._rpc_for(taken.network)
            try:
                if rpc is None:
                    raise ProbeError(f"no RPC for {taken.network}")
                decided = await (self._resolve_claim(taken, rpc) if taken.kind == ClaimKind.CLAIM
                                 else self._resolve_sweep(taken, rpc))
            except ProbeError as exc:
                log.warning("open %s %s on %s: the chain could not be asked (%s); asked again "
                            "next pass", taken.kind, claim_id, taken.network, exc)
                decided = False
            if decided:
                tally.resolved += 1
            else:
                await self._hand_back(claim_id)

    async def _take(self, claim_id: str) -> _Open | None:
        """The open claim, taken by a compare-and-set on its lease (one taker among claimers)."""
        now = self._clock()
        async with self._ledger.writing() as conn:
            taken = (await conn.execute(
                update(claims_table).where(and_(_K.id == claim_id, self._takeable(now)))
                .values(owner=self._owner, updated_at=now,
                        lease_until=now + timedelta(seconds=self._policy.lease_seconds))
                .returning(*claims_table.c))).mappings().first()
            if taken is None:
                return None
            rows = (await conn.execute(select(_R.channel_id, _R.claim_to_atomic)
                                       .where(_R.claim_id == claim_id))).all()
        created = _aware(taken["created_at"])
        assert created is not None
        return _Open(claim_id, taken["network"], ClaimKind(taken["kind"]), taken["tx_hash"],
                     int(taken["amount_atomic"]), created, [(cid, int(to)) for cid, to in rows])

    async def _hand_back(self, claim_id: str) -> None:
        """Undecided: it stays open, takeable again by the next pass."""
        async with self._ledger.writing() as conn:
            await conn.execute(update(claims_table).where(self._open_row(claim_id))
                               .values(lease_until=None, updated_at=self._clock()))

    async def _resolve_claim(self, claim: _Open, rpc: JsonRpc) -> bool:
        """Landed when every row's totalClaimed reached its claim_to (a claim is cumulative:
        nothing else lowers or skips it); its transaction found from its receipt or, when the
        replica died before learning it, from the contract's Claimed log. Otherwise released,
        unless its known transaction may still be mined."""
        read = await read_channels(rpc, [cid for cid, _ in claim.rows])
        for channel_id, onchain in read.items():
            await self._store.mirror(channel_id, onchain)
        if all(read[cid].total_claimed >= to for cid, to in claim.rows):
            tx = claim.tx_hash or await _claim_transaction(rpc, claim.rows[0])
            if await self._settle_claim(claim.claim_id, claim.network, tx, claim.created_at,
                                        claim.rows):
                log.info("claim %s on %s: the chain has it (transaction %s)", claim.claim_id,
                         claim.network, tx or "not found")
            return True
        if claim.tx_hash and await _may_still_land(rpc, claim.tx_hash):
            return False
        await self._release(claim.claim_id, claim.network, "not on chain: claimed again",
                            claim.tx_hash, [cid for cid, _ in claim.rows])
        log.warning("claim %s on %s did not land: its channels are claimed again",
                    claim.claim_id, claim.network)
        return True

    async def _resolve_sweep(self, sweep: _Open, rpc: JsonRpc) -> bool:
        """A sweep is decided by its transaction's receipt. Without one (its replica died before
        learning it) it is released: `settle` moves whatever is left to the receiver, so the
        next sweep does what this one did not (its own fee then goes unmetered)."""
        if sweep.tx_hash:
            receipt = await rpc.call("eth_getTransactionReceipt", [sweep.tx_hash])
            if isinstance(receipt, dict) and receipt.get("blockNumber") is not None:
                if int(str(receipt.get("status", "0x0")), 16) == 1:
                    return await self._finish_sweep(sweep.claim_id, sweep.network, sweep.tx_hash,
                                                    sweep.amount)
            elif await _may_still_land(rpc, sweep.tx_hash):
                return False
        return await self._release(sweep.claim_id, sweep.network, "not on chain: swept again",
                                   sweep.tx_hash, [], kind=FeeKind.SWEEP)

    # -- 8. the sweep --------------------------------------------------------------------------

    async def _sweep(self, tally: ClaimTally) -> None:
        """Per network: after a claim moved there this pass, or when its last sweep is older than
        the settle interval, one `settle` per receiver and token with claimed funds not yet
        transferred (read first: nothing to move sends nothing)."""
        since = self._clock() - timedelta(seconds=self._policy.settle_interval_seconds)
        async with self._ledger.reading() as conn:
            targets = (await conn.execute(select(_C.network, _C.receiver, _C.token).where(
                _C.total_claimed_atomic > 0).distinct())).all()
            recent = set((await conn.execute(select(_K.network).where(and_(
                _K.kind == ClaimKind.SETTLE,
                or_(_K.state.in_(OPEN_CLAIMS),
                    and_(_K.state == ClaimState.SETTLED, _K.created_at >= since)))))).scalars())
        for network, receiver, token in targets:
            if network in recent and network not in tally.networks:
                continue
            rpc = self._rpc_for(network)
            if rpc is None:
                continue
            try:
                claimed, settled = await read_receiver(rpc, receiver, token)
            except ProbeError as exc:
                log.warning("the receiver's totals on %s could not be read (%s)", network, exc)
                continue
            if claimed > settled:
                await self._sweep_one(network, receiver, token, claimed - settled, tally)

    async def _sweep_one(self, network: str, receiver: str, token: str, expected: int,
                         tally: ClaimTally) -> None:
        now = self._clock()
        sweep_id = str(uuid.uuid4())
        async with self._ledger.writing() as conn:
            await conn.execute(insert(claims_table).values(
                id=sweep_id, network=network, kind=ClaimKind.SETTLE, state=ClaimState.SETTLING,
                owner=self._owner, amount_atomic=expected, created_at=now, updated_at=now,
                lease_until=now + timedelta(seconds=self._policy.lease_seconds)))
        payload = build_settle_payment_payload(
            build_payment_requirements(receiver, token, network), receiver, token).payload
        verdict, receipt = await self._send(network, payload)
        if isinstance(verdict, Moved):
            # (the facilitator's reading of the Settled event; empty when it could not decode it)
            told = receipt.amount if receipt is not None else None
            amount = int(told) if told and told.isdigit() else expected
            if await self._finish_sweep(sweep_id, network, verdict.transaction, amount):
                tally.sweeps += 1
                tally.swept_atomic += amount
                log.info("sweep %s on %s: %d atomic to the receiver, transaction %s", sweep_id,
                         network, amount, verdict.transaction)
        elif isinstance(verdict, Unknown):
            tally.pending += 1
            await self._mark_pending(sweep_id, verdict)
        else:
            tally.released += 1
            await self._release(sweep_id, network, verdict.reason, verdict.transaction, [],
                                kind=FeeKind.SWEEP)

    async def _finish_sweep(self, sweep_id: str, network: str, tx: str, amount: int) -> bool:
        async with self._ledger.writing() as conn:
            moved = await conn.execute(update(claims_table).where(self._open_row(sweep_id))
                                       .values(state=ClaimState.SETTLED, tx_hash=tx, error=None,
                                               amount_atomic=amount, lease_until=None,
                                               updated_at=self._clock()))
            if moved.rowcount != 1:
                return False
            if _TX.fullmatch(tx):
                await expect(self._ledger, tx, network, FeeKind.SWEEP, sweep_id, conn=conn)
        return True

    # -- for operators and tests ---------------------------------------------------------------

    async def claims(self, *, kind: ClaimKind | None = None) -> list[dict[str, Any]]:
        """Every claim and sweep (with its rows), oldest first."""
        async with self._ledger.reading() as conn:
            statement = select(claims_table).order_by(_K.created_at, _K.id)
            if kind is not None:
                statement = statement.where(_K.kind == kind)
            found = [dict(m) for m in (await conn.execute(statement)).mappings().all()]
            rows = (await conn.execute(select(claim_rows_table))).mappings().all()
        for claim in found:
            claim["rows"] = {r["channel_id"]: int(r["claim_to_atomic"]) for r in rows
                             if r["claim_id"] == claim["id"]}
        return found


async def _quarantine_in(conn: Any, culprits: list[tuple[str, str]], now: datetime) -> None:
    await conn.execute(update(channels_table).where(and_(
        _C.channel_id.in_([cid for cid, _ in culprits]), _C.state != ChannelState.QUARANTINED))
        .values(state=ChannelState.QUARANTINED, updated_at=now))


def _log_quarantined(culprits: list[tuple[str, str]]) -> None:
    for channel_id, why in culprits:
        log.error("channel %s quarantined: %s; it takes no voucher and is not claimed until the "
                  "operator looks (refund or investigate)", channel_id, why)


async def _claim_transaction(rpc: JsonRpc, row: tuple[str, int]) -> str | None:
    """Best effort (for its gas): a node that caps log searches only loses the fee's record."""
    try:
        return await find_claim_transaction(rpc, *row)
    except ProbeError as exc:
        log.warning("the transaction of a landed claim could not be found (%s): its gas goes "
                    "unrecorded", exc)
        return None


async def _may_still_land(rpc: JsonRpc, tx_hash: str) -> bool:
    """Whether a transaction not mined yet is still known to the node (it may be mined)."""
    receipt = await rpc.call("eth_getTransactionReceipt", [tx_hash])
    if isinstance(receipt, dict) and receipt.get("blockNumber") is not None:
        return False
    return await rpc.call("eth_getTransactionByHash", [tx_hash]) is not None


__all__ = ["TURN", "ChannelClaimer", "ClaimPolicy", "ClaimTally", "Send"]
