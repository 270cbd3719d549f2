"""Solana refunds: a token-priced call paid with `exact` on Solana gets back what it did not use.

The x402 SDK has neither `upto` nor channels on Solana: the payer pays the quoted maximum, the
call is charged what it used (`paywire_payments.charged_atomic`), and the difference is owed back.
What is owed is derived from the settled rows (payments/refund_ledger.py), never written apart.

Batches. Once per period (`RefundPolicy.period_seconds`, a ledger turn: one replica, once, per
period), each payer owed at least the dust threshold in total gets ONE SPL transfer from the
operator's pay-to wallet (which signs and pays the fee) for every owed payment no refund covers
yet. Each refund is, in this order:

1. signed: a fresh blockhash, a TransferChecked to the payer's token account and a memo naming
   the refund; the transaction's id is its signature, known now;
2. recorded (the intent): the refund row (payer, network, asset, amount, signature, blockhash
   and its last valid block height, the signed transaction) and the link of each payment it
   covers, in one transaction; a row already linked makes it roll back, and this transfer is
   never sent (two replicas batching at once: one transfer);
3. broadcast; 4. confirmed.

Reconciled like settlements (payments/reconciler.py), every pass, by whichever replica takes the
refund's lease: the chain is asked through `chain_probe.probe` (the same RPC). Landed -> confirmed.
Not landed while its blockhash may still be valid -> the same signed transaction is sent again
(the same signature: it lands at most once; a crash between the intent and the broadcast ends
here). Provably never landing -> a fresh attempt for the same rows: the block height read BEFORE
the probe is past the blockhash's last valid height and the probe finds no landed transaction
(a blockhash expired before the status lookup takes no transaction after it). So two transfers
for the same rows never exist: a new one is signed only once the old one cannot land.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import uuid
from dataclasses import dataclass
from typing import Any

from solders.hash import Hash
from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.message import MessageV0
from solders.pubkey import Pubkey
from solders.transaction import VersionedTransaction
from x402.mechanisms.svm.constants import MEMO_PROGRAM_ADDRESS, TOKEN_PROGRAM_ADDRESS
from x402.mechanisms.svm.utils import derive_ata

from . import failpoints
from .chain_probe import (
    CannotMove,
    JsonRpc,
    Moved,
    ProbeError,
    RpcError,
    UnexpectedAnswer,
    probe,
    svm_message_hash,
)
from .ledger import Ledger
from .money import USDC_DECIMALS, atomic_to_usd, usd_text
from .refund_ledger import Attempt, Owed, Refund, RefundLedger, RefundScope, owed_atomic

log = logging.getLogger("paywire.refunds")

_COMMITMENT = {"commitment": "confirmed"}
_TRANSFER_CHECKED = 12  # SPL Token instruction


@dataclass(frozen=True)
class RefundPolicy:
    """The operator's refund settings (agent/settings.py): on or off, the dust threshold (the
    least a payer's owed total must be for a transfer), the batch period, and how often a replica
    checks (the longest a due batch waits past its period)."""

    enabled: bool = False
    min_atomic: int = 10_000
    period_seconds: float = 3600.0
    check_seconds: float = 15.0

    def refund_note(self, paid_atomic: int, charged_atomic: int | None,
                    network: str) -> dict[str, Any] | None:
        """What a call's receipt says about the refund its payment is owed, or None (nothing
        owed, or refunds are off)."""
        owed = owed_atomic(paid_atomic, charged_atomic, network)
        if not self.enabled or owed <= 0:
            return None
        return {"refund": {
            "amount": usd_text(atomic_to_usd(owed)), "amount_atomic": str(owed), "status": "owed",
            "sent_within_seconds": math.ceil(self.period_seconds + self.check_seconds),
            "min_total": usd_text(atomic_to_usd(self.min_atomic)),
            "how": "sent back to the payer in the next refund batch, one transfer per payer, once "
                   "what the payer is owed reaches min_total"}}


@dataclass
class RefundTally:
    confirmed: int = 0  # refunds seen landed this pass
    sent: int = 0  # transfers broadcast (new ones and ones sent again)
    started: int = 0  # new refunds recorded
    skipped: int = 0  # taken by another replica, or the chain could not be asked
    batch: bool = False  # this pass held the batch turn


def transfer_transaction(wallet: Keypair, *, payer: str, mint: str, amount_atomic: int,
                         blockhash: str, memo: str,
                         decimals: int = USDC_DECIMALS) -> VersionedTransaction:
    """The refund's transfer, signed by the wallet (the fee payer and the tokens' owner)."""
    owner = wallet.pubkey()
    transfer = Instruction(
        Pubkey.from_string(TOKEN_PROGRAM_ADDRESS),
        bytes([_TRANSFER_CHECKED]) + amount_atomic.to_bytes(8, "little") + bytes([decimals]),
        [AccountMeta(Pubkey.from_string(derive_ata(str(owner), mint)), False, True),
         AccountMeta(Pubkey.from_string(mint), False, False),
         AccountMeta(Pubkey.from_string(derive_ata(payer, mint)), False, True),
         AccountMeta(owner, True, False)])
    # The memo names the refund: two refunds of one amount to one payer are two transactions.
    note = Instruction(Pubkey.from_string(MEMO_PROGRAM_ADDRESS), memo.encode(), [])
    message = MessageV0.try_compile(owner, [transfer, note], [], Hash.from_string(blockhash))
    return VersionedTransaction(message, [wallet])


async def latest_blockhash(rpc: JsonRpc) -> tuple[str, int]:
    """A blockhash to sign with, and the last block height at which a transaction using it lands."""
    answer = await rpc.call("getLatestBlockhash", [_COMMITMENT])
    value = answer.get("value") if isinstance(answer, dict) else None
    if (not isinstance(value, dict) or not isinstance(value.get("blockhash"), str)
            or not isinstance(value.get("lastValidBlockHeight"), int)):
        raise UnexpectedAnswer("getLatestBlockhash: no blockhash and lastValidBlockHeight")
    return value["blockhash"], value["lastValidBlockHeight"]


async def block_height(rpc: JsonRpc) -> int:
    height = await rpc.call("getBlockHeight", [_COMMITMENT])
    if not isinstance(height, int) or isinstance(height, bool):
        raise UnexpectedAnswer("getBlockHeight: not a number")
    return height


def chain_ref(refund: Refund) -> dict[str, Any]:
    """The refund's current attempt as `chain_probe.probe` reads a Solana settlement."""
    attempt = refund.attempt
    return {"kind": "svm", "signature": attempt.signature, "blockhash": attempt.blockhash,
            "fee_payer": refund.pay_to,
            "message_hash": svm_message_hash(base64.b64decode(attempt.transaction))}


class RefundBatcher:
    """Sends and reconciles one network's refunds from the operator's pay-to wallet."""

    def __init__(self, ledger: Ledger, rpc: JsonRpc, wallet: Keypair, policy: RefundPolicy, *,
                 network: str, asset: str, owner: str, lease_seconds: float = 30.0) -> None:
        self._ledger, self._store = ledger, RefundLedger(ledger)
        self._rpc, self._wallet, self._policy = rpc, wallet, policy
        self.scope = RefundScope(network, asset, str(wallet.pubkey()))
        self._owner, self._lease = f"refunds@{owner}", lease_seconds

    async def run_once(self) -> RefundTally:
        """Finish the open refunds, then, if the period's batch is due and this replica takes its
        turn, start the new ones."""
        tally = RefundTally()
        await self._finish_open(tally)
        tally.batch = await self._ledger.take_turn(
            f"refunds:{self.scope.network}", owner=self._owner,
            seconds=self._policy.period_seconds)
        if tally.batch:
            await self.start_batch(tally)
        if tally.started or tally.confirmed:
            log.info("refunds on %s: %d started, %d confirmed, %d sent, %d skipped",
                     self.scope.network, tally.started, tally.confirmed, tally.sent, tally.skipped)
        return tally

    async def run_forever(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception as exc:  # noqa: BLE001 - the database or the node may be down
                log.warning("refund pass failed (%s: %s); next pass in %.0f s",
                            type(exc).__name__, exc, self._policy.check_seconds)
            await asyncio.sleep(self._policy.check_seconds)

    # -- new refunds ---------------------------------------------------------------------------

    async def start_batch(self, tally: RefundTally) -> None:
        """The batch itself, without the turn (`run_once` takes it first): a refund for each payer
        owed at least the threshold. Safe to run beside another replica's (a turn that ran out
        mid-batch): the database lets one refund cover a payment, the other is never sent."""
        minimum = max(self._policy.min_atomic, 1)
        for payer in await self._store.owed_payers(self.scope, minimum=minimum):
            owed = await self._store.owed(self.scope, payer)
            if owed.amount_atomic >= minimum:
                await self._start(owed, tally)

    async def _start(self, owed: Owed, tally: RefundTally) -> None:
        refund_id = str(uuid.uuid4())
        attempt = await self._sign(refund_id, owed.payer, owed.amount_atomic)
        if not await self._store.record_intent(refund_id, self.scope, owed, attempt,
                                               owner=self._owner, lease_seconds=self._lease):
            tally.skipped += 1  # another replica's refund covers some of these payments
            return
        tally.started += 1
        log.info("refund %s: %d atomic to %s for %d payments, transaction %s", refund_id,
                 owed.amount_atomic, owed.payer, len(owed.rows), attempt.signature)
        failpoints.reached("refund_after_intent")
        refund = await self._store.get(refund_id)
        assert refund is not None
        await self._send_and_check(refund, tally)
        await self._store.hand_back(refund_id, owner=self._owner)

    async def _sign(self, refund_id: str, payer: str, amount_atomic: int) -> Attempt:
        blockhash, last_valid = await latest_blockhash(self._rpc)
        tx = transfer_transaction(self._wallet, payer=payer, mint=self.scope.asset,
                                  amount_atomic=amount_atomic, blockhash=blockhash,
                                  memo=f"paywire refund {refund_id}")
        return Attempt(str(tx.signatures[0]), blockhash, last_valid,
                       base64.b64encode(bytes(tx)).decode())

    # -- open refunds --------------------------------------------------------------------------

    async def _finish_open(self, tally: RefundTally) -> None:
        for listed in await self._store.open(self.scope):
            refund = await self._store.take(listed.id, owner=self._owner,
                                            lease_seconds=self._lease)
            if refund is None:
                tally.skipped += 1
                continue
            try:
                await self._advance(refund, tally)
            except ProbeError as exc:
                log.warning("refund %s: asking %s failed (%s); asking again next pass", refund.id,
                            refund.network, exc)
                tally.skipped += 1
            finally:
                await self._store.hand_back(refund.id, owner=self._owner)

    async def _advance(self, refund: Refund, tally: RefundTally) -> None:
        height = await block_height(self._rpc)  # before the probe: see the module's docstring
        verdict = await probe(chain_ref(refund), self._rpc)
        if isinstance(verdict, Moved):
            await self._confirmed(refund, tally)
        elif isinstance(verdict, CannotMove) and height > refund.attempt.last_valid_height:
            attempt = await self._sign(refund.id, refund.payer, refund.amount_atomic)
            if not await self._store.new_attempt(refund.id, expired=refund.attempt.signature,
                                                 attempt=attempt, owner=self._owner):
                tally.skipped += 1
                return
            log.info("refund %s: transaction %s never landed (%s); sending %s instead",
                     refund.id, refund.attempt.signature, verdict.reason, attempt.signature)
            renewed = await self._store.get(refund.id)
            assert renewed is not None
            await self._send_and_check(renewed, tally)
        else:  # not landed, and may still land: the same transaction again (it lands once)
            await self._send_and_check(refund, tally)

    async def _send_and_check(self, refund: Refund, tally: RefundTally) -> None:
        """Broadcast the refund's current transaction, then ask once whether it landed (a pass
        later asks again)."""
        attempt = refund.attempt
        try:
            await self._rpc.call("sendTransaction", [attempt.transaction, {
                "encoding": "base64", "preflightCommitment": "confirmed"}])
        except RpcError as exc:  # refused (or already processed): the chain says which below
            log.warning("refund %s: the node refused transaction %s: %s", refund.id,
                        attempt.signature, exc.message[:300])
            await self._store.note_error(refund.id, attempt.signature, exc.message)
        except ProbeError as exc:  # no answer: it may or may not have been taken
            log.warning("refund %s: sending transaction %s failed (%s); next pass asks the chain",
                        refund.id, attempt.signature, exc)
            return
        else:
            tally.sent += 1
            await self._store.mark_sent(refund.id, attempt.signature)
        failpoints.reached("refund_after_broadcast")
        try:
            landed = isinstance(await probe(chain_ref(refund), self._rpc), Moved)
        except ProbeError:
            return  # the next pass asks again
        if landed:
            await self._confirmed(refund, tally)

    async def _confirmed(self, refund: Refund, tally: RefundTally) -> None:
        if await self._store.mark_confirmed(refund.id, refund.attempt.signature):
            tally.confirmed += 1
            log.info("refund %s confirmed: %d atomic to %s, transaction %s", refund.id,
                     refund.amount_atomic, refund.payer, refund.attempt.signature)
