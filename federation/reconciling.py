"""Outgoing payments nobody is finishing (their replica died, their seller failed after being
sent payment), resolved from the chain like incoming ones (payments/reconciler.py): an intent
never signed is void; a signed one whose transfer moved is the operator's loss unless its answer
was kept; one that provably cannot move any more is void, and its cap reservation is freed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from payments.chain_probe import CannotMove, JsonRpc, Moved, probe

from .store import FederationStore, Intent, IntentState

log = logging.getLogger(__name__)

RpcFor = Callable[[str], JsonRpc | None]


class OutgoingReconciler:
    def __init__(self, store: FederationStore, rpc_for: RpcFor, *, owner: str,
                 interval_seconds: float = 30.0, lease_seconds: float = 120.0) -> None:
        self.store = store
        self.rpc_for = rpc_for
        self.owner = owner
        self.interval_seconds = interval_seconds
        self.lease_seconds = lease_seconds

    async def run_once(self) -> int:
        """Resolve what can be resolved now; the number of intents that reached a verdict."""
        done = 0
        for intent in await self.store.take_expired(owner=self.owner,
                                                    lease_seconds=self.lease_seconds):
            try:
                if await self._decide(intent):
                    done += 1
                    continue
            except Exception as exc:  # noqa: BLE001 - asked again next time
                log.warning("outgoing payment %s: cannot resolve now (%s)", intent.id,
                            type(exc).__name__)
            await self.store.hand_back(intent.id, owner=self.owner)
        return done

    async def _decide(self, intent: Intent) -> bool:
        if intent.state == IntentState.INTENT or intent.payload is None:
            return await self.store.mark_void(intent.id, "never signed")
        rpc = self.rpc_for(intent.network)
        if rpc is None or intent.chain_ref is None:
            return False  # a network this gateway cannot read: it stays open, shown as such
        verdict = await probe(intent.chain_ref, rpc, tx_hash=intent.tx_hash)
        if isinstance(verdict, Moved):
            log.warning("outgoing payment %s to %s moved without an answer kept: the operator's "
                        "loss", intent.id, intent.seller)
            return await self.store.mark_lost(
                intent.id, "the seller took the payment and delivered no answer",
                tx_hash=verdict.transaction)
        if isinstance(verdict, CannotMove):
            return await self.store.mark_void(intent.id, f"nothing moved: {verdict.reason}")
        return False

    async def run_forever(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception as exc:  # noqa: BLE001 - the ledger may be down: try again later
                log.warning("outgoing payments: reconciling failed (%s)", type(exc).__name__)
            await asyncio.sleep(self.interval_seconds)
