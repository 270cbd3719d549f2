"""The reconciler: every unfinished payment whose lease ran out is settled against the chain.

A row is unfinished when its replica died or lost the outcome: `claimed` (nothing was broadcast:
released), `settling` or `pending` (something may have moved: the chain is asked through the same
RPC the facilitator settles on, `payments/chain_probe.py`). Moved -> settled; provably can never
move (an expired, unused authorization; an expired blockhash) -> released; otherwise it stays
pending and is asked again after its lease. Rows are taken one at a time by a compare-and-set on
the lease (`Ledger.take`), so several replicas can run it at once: one works on a row at a time.
It runs at startup, every `interval` seconds, and for one row at once when a retry of its payment
finds the row's lease expired (`resolve`). Each decision is an event row (`paywire ledger`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .chain_probe import CannotMove, JsonRpc, Moved, StillOpen, Verdict, probe
from .leases import SettlementPolicy
from .ledger import Ledger, PaymentRow
from .ledger_schema import PaymentState

log = logging.getLogger(__name__)

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


@dataclass
class Tally:
    settled: int = 0
    released: int = 0
    still_open: int = 0
    skipped: int = 0  # taken by another replica, or the chain could not be asked


class Reconciler:
    def __init__(self, ledger: Ledger, ask: Ask, policy: SettlementPolicy,
                 *, interval_seconds: float = 15.0) -> None:
        self._ledger, self._ask, self._policy = ledger, ask, policy
        self._interval = interval_seconds
        self.actor = f"reconciler@{policy.owner}"

    async def resolve(self, row: PaymentRow) -> PaymentRow | None:
        """Take this row (if its lease ran out and nobody else took it) and decide its fate now.
        Returns the row as it is afterwards, or None if it could not be taken."""
        taken = await self._ledger.take(row.id, owner=self._policy.owner,
                                        lease_seconds=self._policy.lease_seconds)
        if taken is None:
            return None
        await self._decide(taken, Tally())
        after = await self._ledger.get(row.id)
        return PaymentRow.of(after) if after is not None else None

    async def run_once(self, limit: int = 100) -> Tally:
        tally = Tally()
        for row in await self._ledger.expired(limit):
            taken = await self._ledger.take(row.id, owner=self._policy.owner,
                                            lease_seconds=self._policy.lease_seconds)
            if taken is None:
                tally.skipped += 1
                continue
            await self._decide(taken, tally)
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

    async def _decide(self, row: PaymentRow, tally: Tally) -> None:
        if row.state == PaymentState.CLAIMED:
            # A claim is written before the call runs and replaced by the intent before anything
            # is broadcast: a claim whose owner stopped renewing it moved nothing.
            await self._resolve(row, PaymentState.RELEASED,
                                "the claim's lease ran out before anything was broadcast")
            tally.released += 1
            return
        try:
            verdict = await self._ask(row)
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
        if isinstance(verdict, Moved):
            await self._resolve(row, PaymentState.SETTLED, "the chain shows the payment moved",
                                tx_hash=verdict.transaction or row.tx_hash)
            tally.settled += 1
        elif isinstance(verdict, CannotMove):
            await self._resolve(row, PaymentState.RELEASED, f"nothing moved: {verdict.reason}")
            tally.released += 1
        else:
            assert isinstance(verdict, StillOpen)
            tally.still_open += 1
            log.info("payment %s is %s and may still move: %s; asking again later (a retry of "
                     "the same payment settles it again)", row.id, row.state, verdict.reason)
            # Say so in the state, and hand the row back at once: a retry carrying the same
            # payment may take it and settle it again; the next pass asks the chain again.
            if row.state == PaymentState.SETTLING:
                await self._ledger.mark_pending(row.id, f"still open: {verdict.reason}",
                                                tx_hash=row.tx_hash, retry_in_seconds=0)
            else:
                await self._ledger.hand_back(row.id, owner=self._policy.owner)

    async def _resolve(self, row: PaymentRow, to: PaymentState, detail: str,
                       tx_hash: str | None = None) -> None:
        done = await self._ledger.resolve(row.id, owner=self._policy.owner, to=to,
                                          actor=self.actor, detail=detail, tx_hash=tx_hash)
        if done:
            log.info("payment %s %s -> %s by the reconciler: %s", row.id, row.state, to, detail)
