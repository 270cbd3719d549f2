"""The reconciler: every unfinished payment whose lease ran out is settled against the chain.

A row is unfinished when its replica died or lost the outcome: `claimed` (nothing was broadcast:
released), `settling` or `pending` (something may have moved: the chain is asked through the same
RPC the facilitator settles on, `payments/chain_probe.py`). Moved -> settled; provably can never
move (an expired, unused authorization or permit; one its signer cancelled; an expired
blockhash) -> released; otherwise it stays pending and is asked again after its lease. Rows
are taken one at a time by a compare-and-set on the lease (`Ledger.take`), so several replicas
can run it at once: one works on a row at a time. It runs at startup, every `interval` seconds,
and for one row at once when a retry of its payment finds the row's lease expired (`resolve`).
Each decision is an event row (`paywire ledger`).

Before validBefore (issue 22). An EVM payment whose replica died before broadcasting is still
"valid until validBefore" on chain: without more, nothing proves it unmoved before validBefore +
`CLOCK_SKEW_SECONDS` (about 7 minutes with a 300 s quote), and a payer who never retries waits that
long. When the facilitator is in process (`EvmSender`: its key, its RPC, its send lock), a pass
proves it earlier (`chain_probe.probe_our_sends`): once no settlement of the payment can begin a
send any more (its last attempt began more than `broadcast_trace.SEND_WINDOW_SECONDS` plus
`EARLY_MARGIN_SECONDS` ago), with the key's send lock held, the authorization unused and nothing
of the key in the node's pool. A busy key's pool is seldom empty: the pending count is remembered
and a later pass releases once the key's mined nonce reached it (`probe_nonce_reached`), provided
the row shows no new attempt since. A remote facilitator's key is not ours: its payments keep the
validBefore rule. An `upto` payment (a Permit2 permit) is proven the same way, more strongly: the
upto proxy takes its settlement only from the facilitator its witness names, so when that is our
key no one else can move it at all; a permit naming another account waits for its deadline. A
channel's Permit2 deposit names no facilitator, and is proven as an EIP-3009 authorization is. Only
a pass proves early, and it takes rows under an owner of its own (`actor`), so a retry in this
very process cannot settle the payment again between the proof and the release (a retry
re-settles what is still open instead: `resolve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from . import broadcast_trace
from .chain_probe import (
    CannotMove,
    Draining,
    JsonRpc,
    Moved,
    StillOpen,
    Verdict,
    probe,
    probe_nonce_reached,
    probe_our_sends,
)
from .channels.reconciling import ChannelResolutions
from .leases import SettlementPolicy
from .ledger import Ledger, PaymentRow
from .ledger_schema import UNFINISHED, PaymentState
from .send_lock import SendLock

log = logging.getLogger(__name__)

# A payment is proven unmoved early only once its last settlement attempt began longer ago than
# the send window (payments/broadcast_trace.py: no attempt begins a send later) plus this margin:
# clocks of replicas, the step from writing the intent to making the trace, a request of a dead
# replica still on its way to the node.
EARLY_MARGIN_SECONDS = 10.0
# What a pass can prove unmoved early: an EIP-3009 authorization, and a Permit2 permit. An `upto`
# permit's witness names the one account that may settle it (the proof checks that it is ours);
# a channel deposit's (its witness the channel id) names none: anyone holding it may submit it,
# so it is proven as an EIP-3009 one is (no transaction of our key carries it or still can).
EARLY_KINDS = frozenset({"eip3009", "permit2"})
# The early proof holds the key's send lock, and every send from that key waits meanwhile: at
# most this long, the wait for the lock included; past it the payment is asked about next pass.
PROOF_TIMEOUT_SECONDS = 10.0

RpcFor = Callable[[str], JsonRpc | None]  # CAIP-2 network -> the RPC its facilitator settles on
# What the chain says about a row (None: no way to ask its chain). The production one is
# `chain_asker`; the pipeline tests script one.
Ask = Callable[[PaymentRow], Awaitable[Verdict | None]]


def chain_asker(rpc_for: RpcFor) -> Ask:
    """Ask each row's chain through the RPC its facilitator settles on."""

    async def ask(row: PaymentRow) -> Verdict | None:
        rpc = rpc_for(row.network)
        if rpc is None:
            return None
        return await probe(chain_ref_of(row), rpc, tx_hash=row.tx_hash)

    return ask


def chain_ref_of(row: PaymentRow) -> dict[str, Any]:
    """What identifies the row's on-chain action: its intent's, or (a row written before
    settlement intents) what the row itself says."""
    if row.chain_ref:
        return dict(row.chain_ref)
    if row.network.startswith("eip155:"):
        return {"kind": "eip3009", "token": row.asset, "from": row.payer, "to": row.pay_to,
                "value": str(row.amount_atomic), "valid_after": "0", "valid_before": "",
                "nonce": row.nonce}
    return {"kind": "svm", "message_hash": row.nonce, "signature": row.tx_hash,
            "blockhash": None, "fee_payer": None}


@dataclass(frozen=True)
class EvmSender:
    """The account an in-process facilitator settles a network's EVM payments from: its
    address, the RPC its signer sends through, and the lock its signers hold from reading the
    account's nonce to the node's answer on a send: the signer's own lock object
    (payments/send_lock.py; a `ProcessSendLock` is only shared through the object)."""

    address: str
    rpc: JsonRpc
    lock: SendLock


@dataclass(frozen=True)
class _Seen:
    """What a pass learned about a row it leaves open, valid while the row is unchanged."""

    stamp: tuple[Any, ...]  # the row's (updated_at, state, tx_hash) after the pass's own writes
    began: datetime  # when its last settlement attempt began (before the pass's own writes)
    sender: str
    nonce: int | None  # Draining: the key's nonce that proves it once mined


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _stamp(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """What changes whenever a settlement attempt of the row begins, sends or ends."""
    return (_aware(row["updated_at"]), str(row["state"]), row["tx_hash"])


@contextlib.asynccontextmanager
async def _holding(lock: SendLock) -> AsyncIterator[None]:
    """Hold a send lock while this task works. `held()` blocks (a thread lock, `flock`, or
    PostgreSQL's, which its taker awaits on this very loop), so a worker thread takes it, says so,
    and gives it back when told. Cancelled while waiting, the thread gives it back as soon as it
    has it."""
    loop = asyncio.get_running_loop()
    acquired: asyncio.Future[None] = loop.create_future()
    release = threading.Event()

    def granted() -> None:
        if not acquired.done():
            acquired.set_result(None)

    def hold() -> None:
        with lock.held():
            loop.call_soon_threadsafe(granted)
            release.wait()

    holder = loop.run_in_executor(None, hold)
    holder.add_done_callback(lambda f: f.cancelled() or f.exception())  # seen, never lost
    try:
        await asyncio.wait([acquired, holder], return_when=asyncio.FIRST_COMPLETED)
        if not acquired.done():
            holder.result()  # the lock's own error
            raise RuntimeError("the send lock was given back before it was held")
        yield
    finally:
        release.set()
        if acquired.done() and not acquired.cancelled():
            try:
                await asyncio.shield(holder)
            except Exception as exc:  # noqa: BLE001 - what was proven under it stands
                log.warning("giving back the send lock failed: %s", type(exc).__name__)


@dataclass
class Tally:
    settled: int = 0
    released: int = 0
    still_open: int = 0
    skipped: int = 0  # taken by another replica, or the chain could not be asked


class Reconciler:
    def __init__(self, ledger: Ledger, ask: Ask, policy: SettlementPolicy,
                 *, interval_seconds: float = 15.0,
                 senders: Mapping[str, EvmSender] | None = None,
                 channels: ChannelResolutions | None = None) -> None:
        """`senders`: the in-process facilitator's EVM account per CAIP-2 network (none for a
        remote facilitator); `know_sender` adds one later (its send lock is shared at startup)."""
        self._ledger, self._ask, self._policy = ledger, ask, policy
        self._interval = interval_seconds
        self.actor = f"reconciler@{policy.owner}"
        self.senders: dict[str, EvmSender] = dict(senders or {})
        # No attempt of a payment begins a send later than this after it began.
        self.early_after_seconds = broadcast_trace.SEND_WINDOW_SECONDS + EARLY_MARGIN_SECONDS
        self._seen: dict[str, _Seen] = {}
        self._channels = channels  # a channel call's verdict carries its channel's part

    def know_sender(self, network: str, sender: EvmSender) -> None:
        """Prove payments on `network` unmoved before they expire, through `sender`: the
        in-process facilitator's EVM signer, its RPC, and its send lock as its signers use it
        (once the replicas' lock is shared: after `share_sends`)."""
        self.senders[network] = sender

    async def resolve(self, row: PaymentRow) -> PaymentRow | None:
        """Take this row (if its lease ran out and nobody else took it) and decide its fate now.
        Returns the row as it is afterwards, or None if it could not be taken."""
        # Taken as this replica: a payment still open is handed to the retry, under the lease,
        # and the retry settles it again (`retake_for_settlement` wants this owner).
        taken = await self._ledger.take(row.id, owner=self._policy.owner,
                                        lease_seconds=self._policy.lease_seconds)
        if taken is None:
            return None
        await self._decide(taken, Tally(), owner=self._policy.owner, early=False)
        after = await self._ledger.get(row.id)
        return PaymentRow.of(after) if after is not None else None

    async def run_once(self, limit: int = 100) -> Tally:
        tally = Tally()
        rows = await self._ledger.expired(limit)
        for row in rows:
            # Taken as the reconciler, not as this replica: a retry here takes the row again
            # (a new owner) before it settles again, so this pass's release cannot follow it.
            taken = await self._ledger.take(row.id, owner=self.actor,
                                            lease_seconds=self._policy.lease_seconds)
            if taken is None:
                tally.skipped += 1
                continue
            await self._decide(taken, tally, owner=self.actor, early=True)
        listed = {row.id for row in rows}
        self._seen = {k: v for k, v in self._seen.items() if k in listed}
        if tally.settled or tally.released:
            log.info("reconciler: %d settled, %d released, %d still open, %d skipped",
                     tally.settled, tally.released, tally.still_open, tally.skipped)
        return tally

    async def run_forever(self) -> None:
        while True:
            try:
                await self.run_once()
                await self._ledger.prune_results()
            except Exception as exc:  # noqa: BLE001 - the database or a node may be down
                log.warning("reconciler pass failed (%s: %s); next pass in %.0f s",
                            type(exc).__name__, exc, self._interval)
            await asyncio.sleep(self._interval)

    async def _decide(self, row: PaymentRow, tally: Tally, *, owner: str, early: bool) -> None:
        if row.state == PaymentState.CLAIMED:
            # A claim is written before the call runs and replaced by the intent before anything
            # is broadcast: a claim whose owner stopped renewing it moved nothing.
            await self._resolve(row, PaymentState.RELEASED,
                                "the claim's lease ran out before anything was broadcast", owner)
            tally.released += 1
            return
        seen: _Seen | None = None
        try:
            verdict = await self._ask(row)
            if early and isinstance(verdict, StillOpen):
                verdict, seen = await self._prove_nothing_sent(row, verdict)
        except Exception as exc:  # noqa: BLE001 - the node did not answer: ask again later
            log.warning("payment %s: asking %s failed (%s); asking again later", row.id,
                        row.network, type(exc).__name__)
            tally.skipped += 1
            return
        if verdict is None:
            log.warning("payment %s on %s is %s and no RPC is configured to ask its chain",
                        row.id, row.network, row.state)
            tally.skipped += 1
            return
        self._seen.pop(row.id, None)
        if isinstance(verdict, Moved):
            await self._resolve(row, PaymentState.SETTLED, "the chain shows the payment moved",
                                owner, tx_hash=verdict.transaction or row.tx_hash)
            tally.settled += 1
        elif isinstance(verdict, CannotMove):
            await self._resolve(row, PaymentState.RELEASED, f"nothing moved: {verdict.reason}",
                                owner)
            tally.released += 1
        else:
            assert isinstance(verdict, StillOpen)
            tally.still_open += 1
            log.info("payment %s is %s and may still move: %s; asking again later (a retry of "
                     "the same payment settles it again)", row.id, row.state, verdict.reason)
            # Say so in the state, and hand the row back at once: a retry carrying the same
            # payment may take it and settle it again; the next pass asks the chain again. What
            # this pass learned for the next one (`seen`) is noted first, while the row is still
            # its own (nobody can begin a settlement of it meanwhile).
            keep = self._policy.lease_seconds if seen is not None else 0
            if row.state == PaymentState.SETTLING:
                await self._ledger.mark_pending(row.id, f"still open: {verdict.reason}",
                                                tx_hash=row.tx_hash, retry_in_seconds=keep)
            if seen is not None:
                after = await self._ledger.get(row.id)
                if (after is not None and after["owner"] == owner
                        and str(after["state"]) in UNFINISHED):
                    self._seen[row.id] = _Seen(_stamp(after), seen.began, seen.sender, seen.nonce)
            if row.state != PaymentState.SETTLING or keep:
                await self._ledger.hand_back(row.id, owner=owner)

    async def _prove_nothing_sent(self, row: PaymentRow, verdict: StillOpen
                                  ) -> tuple[Verdict, _Seen | None]:
        """Before validBefore: can any transaction of ours still move this payment? (EVM, with
        the in-process facilitator's key; see the module's docstring). Returns the verdict and,
        for a payment left open, what the next pass may build on."""
        sender = self.senders.get(row.network)
        ref = row.chain_ref
        if sender is None or not ref or ref.get("kind") not in EARLY_KINDS:
            return verdict, None  # a remote facilitator, or Solana: the chain's expiry decides
        current = await self._ledger.get(row.id)
        if current is None:
            return verdict, None
        stamp, address = _stamp(current), sender.address.lower()
        known = self._seen.pop(row.id, None)
        if known is not None and (known.stamp != stamp or known.sender != address):
            known = None  # a settlement attempt began (or wrote) since: start over
        began = known.began if known is not None else stamp[0]
        seen = _Seen(stamp, began, address, None)
        try:
            async with asyncio.timeout(PROOF_TIMEOUT_SECONDS):
                if known is not None and known.nonce is not None:
                    found = await probe_nonce_reached(ref, sender.rpc, address, known.nonce)
                else:
                    left = began.timestamp() + self.early_after_seconds - time.time()
                    if left > 0:
                        return StillOpen(f"{verdict.reason}; its last settlement attempt began "
                                         f"at {began:%Y-%m-%d %H:%M:%S} UTC and may begin a send "
                                         f"for {left:.0f} s more"), seen
                    hashes = list(dict.fromkeys(h for h in (row.tx_hash, ref.get("tx_hash"))
                                                if h))
                    async with _holding(sender.lock):
                        found = await probe_our_sends(ref, sender.rpc, address, tx_hashes=hashes)
        except TimeoutError:
            return StillOpen(f"{verdict.reason}; the send lock or the node took longer than "
                             f"{PROOF_TIMEOUT_SECONDS:.0f} s"), seen
        if isinstance(found, Draining):
            return found, _Seen(stamp, began, address, found.nonce)
        return found, seen if isinstance(found, StillOpen) else None

    async def _resolve(self, row: PaymentRow, to: PaymentState, detail: str, owner: str,
                       tx_hash: str | None = None) -> None:
        within = (await self._channels.within(row, to)
                  if self._channels is not None and row.channel_id is not None else None)
        done = await self._ledger.resolve(row.id, owner=owner, to=to, actor=self.actor,
                                          detail=detail, tx_hash=tx_hash, within=within)
        if done:
            log.info("payment %s %s -> %s by the reconciler: %s", row.id, row.state, to, detail)
