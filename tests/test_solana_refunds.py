"""Solana refunds (issue 23 §4) on the real LiteSVM Solana devnet (payments/devnet/solana.py, served
on loopback JSON-RPC), on a SQLite file and on PostgreSQL: real exact payments signed by the SDK's
client, settled by the in-process facilitator over RPC (the production signer) and written to the
ledger as the pipeline writes them (claim, intent, settled with what the call was charged); then
the refund batches as the gateway builds them (`agent.app.refund_batchers` from `Settings`).

What must hold: one transfer per payer owed at least the dust threshold, none below; the payer
ends at what it paid minus its refund; a `kill -9` of the process running the batch after the
intent (nothing broadcast) or after the broadcast (not confirmed), then a restart: exactly one
transfer, no payment refunded twice; a retry, and two replicas batching at once: one transfer; a
transfer whose blockhash expired without landing is signed again for the same payments; switched
off, nothing is sent."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from solders.keypair import Keypair
from sqlalchemy import update
from x402 import x402Client
from x402.mechanisms.svm.exact.client import ExactSvmScheme as ExactSvmClientScheme
from x402.mechanisms.svm.signers import KeypairSigner
from x402.schemas import PaymentPayload, ResourceInfo

from agent.app import chain_rpcs_for, create_app, make_engine, refund_batchers
from agent.cli.accounting_report import revenue_table
from agent.cli.ledger_report import report as ledger_report
from agent.devnet.server import gateway_env
from agent.settings import ConfigError, Settings
from payments.accounting import Accounting
from payments.devnet.keys import DevnetKeys
from payments.devnet.solana import LAMPORTS_PER_SOL, SLOT_SECONDS, SolanaDevnet
from payments.facilitators import in_process_facilitator, rpc_signers
from payments.ledger import Claimed, ClaimRequest, Ledger
from payments.ledger_schema import RefundState, turns_table
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from payments.processor import PaymentProcessor, PayTo, identify
from payments.refund_ledger import Refund, RefundLedger
from payments.refunds import RefundBatcher, RefundPolicy, RefundTally
from tests.support.jsonrpc_http import JsonRpcHttpServer
from tests.support.postgres import PostgresServer
from tests.support.served_process import ROOT

pytestmark = [pytest.mark.filterwarnings("ignore:Client is deprecated"),
              pytest.mark.filterwarnings("ignore:TxOpts is deprecated")]

NET = SOLANA_DEVNET.caip2
FUNDS = 1_000_000  # each payer's test USDC
PAID = 50_000  # each payment: $0.05 quoted
DEADLINE_S = 60.0


class FakeClock:
    """The devnet's slot clock, moved by hand (a blockhash expires without waiting)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Chain:
    devnet: SolanaDevnet
    clock: FakeClock
    fee_payer: Keypair
    url: str

    def rpc(self, method: str, params: list[Any]) -> Any:
        answer = self.devnet.rpc(method, params)
        assert "error" not in answer, answer
        return answer["result"]

    def funded(self, amount: int = FUNDS) -> Keypair:
        payer = Keypair()
        self.devnet.mint_to(str(payer.pubkey()), amount)
        return payer

    def merchant(self) -> Keypair:
        """A pay-to wallet of its own: its token account, and SOL for its refunds' fees."""
        wallet = Keypair()
        self.devnet.mint_to(str(wallet.pubkey()), 0)
        self.devnet.airdrop(str(wallet.pubkey()), LAMPORTS_PER_SOL)
        return wallet

    def balance(self, owner: Keypair | str) -> int:
        return self.devnet.token_balance(str(owner.pubkey()) if isinstance(owner, Keypair) else owner)

    def sent_by(self, wallet: Keypair) -> list[dict[str, Any]]:
        """The refund transfers from the wallet that landed (their memo names a refund; the
        devnet's opening of the wallet's token account lists the wallet too), newest first."""
        return [t for t in self.rpc("getSignaturesForAddress", [str(wallet.pubkey()), {}])
                if "paywire refund " in (t["memo"] or "")]

    def status(self, signature: str) -> dict[str, Any] | None:
        return self.rpc("getSignatureStatuses", [[signature], {"searchTransactionHistory": True}]
                        )["value"][0]


@pytest.fixture(scope="module")
def chain() -> Iterator[Chain]:
    clock, fee_payer = FakeClock(), Keypair()
    devnet = SolanaDevnet(fee_payer=fee_payer, mint_authority=Keypair(), clock=clock)
    server = JsonRpcHttpServer(devnet.rpc).start()
    try:
        yield Chain(devnet, clock, fee_payer, server.url)
    finally:
        server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.fresh_url()


class Shop:
    """A production-mode gateway's settings on the devnet, its ledger and payment processor: pays
    and settles as the pipeline does, builds refund batchers as the assembly does."""

    def __init__(self, chain: Chain, db_url: str, **env: str) -> None:
        self.chain, self.wallet = chain, chain.merchant()
        self.env = {"PAYWIRE_NETWORKS": "solana-devnet", "PAYWIRE_SOLANA_RPC_URL": chain.url,
                    "PAYWIRE_SOLANA_PAY_TO": str(self.wallet.pubkey()),
                    "PAYWIRE_SOLANA_FACILITATOR_KEY": str(chain.fee_payer),
                    "PAYWIRE_REFUND_KEY_SOLANA": str(self.wallet), "PAYWIRE_DATABASE_URL": db_url,
                    "PAYWIRE_SETTLEMENT_LEASE_SECONDS": "1"} | env
        self.settings = Settings.from_env(self.env)
        self.engine = make_engine(db_url)
        self.ledger = Ledger(self.engine)
        _, signer = rpc_signers(solana_key=str(chain.fee_payer), solana_rpc_url=chain.url)
        self.processor = PaymentProcessor(
            in_process_facilitator([SOLANA_DEVNET], svm_signer=signer),
            [PayTo(SOLANA_DEVNET, str(self.wallet.pubkey()))])
        self.processor.start()
        self.rows: dict[str, list[str]] = {}  # payer -> its payment rows

    async def pay(self, payer: Keypair, charged: int | None, amount: int = PAID) -> str:
        """One exact payment signed by the SDK's client, settled, recorded with what the call was
        charged (None: all of it). Returns its ledger row."""
        requirements = self.processor.requirements(amount)
        resource = ResourceInfo(url="http://gateway.test/v1/chat/completions")
        client = x402Client()
        client.register("solana:*", ExactSvmClientScheme(KeypairSigner(payer), rpc_url=self.chain.url))
        payload = await client.create_payment_payload(
            self.processor.payment_required(requirements, resource))
        assert isinstance(payload, PaymentPayload)
        matched = self.processor.match(payload, requirements, resource)
        assert matched is not None
        identity = identify(matched, self.processor.transaction_id)
        claim = await self.ledger.claim(ClaimRequest(
            identity.key, amount, SOLANA_DEVNET.usdc, str(self.wallet.pubkey()), "gpt-4o",
            hashlib.sha256(b"request").hexdigest()), owner="pipeline", lease_seconds=30)
        assert isinstance(claim, Claimed)
        assert await self.ledger.begin_settlement(claim.row_id, owner="pipeline",
                                                  chain_ref=identity.chain_ref, lease_seconds=30)
        assert (await self.processor.verify(matched)).is_valid
        settled = await self.processor.settle(matched)
        assert settled.success, settled.error_reason
        assert await self.ledger.mark_settled(claim.row_id, settled.transaction,
                                              charged_atomic=charged)
        self.rows.setdefault(str(payer.pubkey()), []).append(claim.row_id)
        return claim.row_id

    def batcher(self, owner: str = "replica-1", ledger: Ledger | None = None,
                **env: str) -> RefundBatcher:
        """The refund batcher a replica named `owner` runs (on its own ledger, if given)."""
        settings = Settings.from_env(self.env | env) if env else self.settings
        policy, batchers = refund_batchers(settings, None, ledger or self.ledger,
                                           chain_rpcs_for(settings, None), owner)
        assert policy.enabled and len(batchers) == 1
        return batchers[0]

    def policy(self) -> RefundPolicy:
        return refund_batchers(self.settings, None, self.ledger, {}, "receipts")[0]

    async def end_period(self) -> None:
        """The batch period ends now (as if it had been waited out): the next pass may batch."""
        async with self.ledger.writing() as conn:
            await conn.execute(update(turns_table).values(until=datetime.now(UTC) - timedelta(1)))

    async def refunds(self) -> list[Refund]:
        return await RefundLedger(self.ledger).refunds()

    async def refund_of(self, row_id: str) -> str | None:
        return (await self.ledger.get(row_id) or {}).get("refund_id")

    async def close(self) -> None:
        await self.processor.aclose()
        self.ledger.close()
        await self.engine.dispose()


@contextlib.asynccontextmanager
async def shop(chain: Chain, db_url: str, **env: str) -> AsyncIterator[Shop]:
    opened = Shop(chain, db_url, **env)
    try:
        await opened.ledger.create_tables()
        yield opened
    finally:
        await opened.close()


def payer_of(keypair: Keypair) -> str:
    return str(keypair.pubkey())


async def test_a_batch_sends_one_transfer_per_payer_owed_at_least_the_threshold(
        chain: Chain, db_url: str) -> None:
    async with shop(chain, db_url) as s:
        many, few, whole = chain.funded(), chain.funded(), chain.funded()
        await s.pay(many, charged=20_000)  # owed 30,000
        await s.pay(many, charged=35_000)  # owed 15,000: 45,000 in all, one transfer
        await s.pay(few, charged=45_000)  # owed 5,000: below the threshold, it waits
        await s.pay(whole, charged=None)  # charged all it paid: owed nothing
        assert chain.balance(s.wallet) == 4 * PAID

        # the receipt's note, as the pipeline asks for it
        policy = s.policy()
        assert policy.refund_note(PAID, 20_000, NET) == {"refund": {
            "amount": "0.03", "amount_atomic": "30000", "status": "owed",
            "sent_within_seconds": 3615, "min_total": "0.01",
            "how": "sent back to the payer in the next refund batch, one transfer per payer, once "
                   "what the payer is owed reaches min_total"}}
        assert policy.refund_note(PAID, None, NET) is None
        assert policy.refund_note(PAID, 20_000, BASE_SEPOLIA.caip2) is None  # upto moved only that

        tally = await s.batcher().run_once()

        assert (tally.batch, tally.started, tally.confirmed) == (True, 1, 1)
        [refund] = await s.refunds()
        assert (refund.payer, refund.amount_atomic, refund.payments, refund.state,
                refund.attempts) == (payer_of(many), 45_000, 2, RefundState.CONFIRMED, 1)
        assert [await s.refund_of(r) for r in s.rows[payer_of(many)]] == [refund.id] * 2
        assert [await s.refund_of(r) for r in s.rows[payer_of(few)] + s.rows[payer_of(whole)]] == [
            None, None]
        # the payer ends at what it paid minus its refund; the merchant keeps what was charged
        assert chain.balance(many) == FUNDS - 2 * PAID + 45_000
        assert chain.balance(few) == chain.balance(whole) == FUNDS - PAID
        assert chain.balance(s.wallet) == 4 * PAID - 45_000
        assert [t["signature"] for t in chain.sent_by(s.wallet)] == [refund.attempt.signature]
        assert chain.status(refund.attempt.signature)["err"] is None

        # a retry: nothing new, whether the period's turn is taken or free again
        again = await s.batcher("replica-2").run_once()
        assert (again.batch, again.started) == (False, 0)
        await s.end_period()
        free = await s.batcher("replica-3").run_once()
        assert (free.batch, free.started, free.sent) == (True, 0, 0)
        assert len(chain.sent_by(s.wallet)) == 1 and chain.balance(many) == FUNDS - 2 * PAID + 45_000

        # what the operator reads: revenue net of refunds, the refunds by payer
        total = (await Accounting(s.engine).revenue()).total
        assert (total.calls, total.revenue_atomic, total.refunded_atomic,
                total.refund_owed_atomic) == (4, 20_000 + 35_000 + 45_000 + PAID, 45_000, 5_000)
        assert "refunded  refund owed" in revenue_table(await Accounting(s.engine).revenue())
        shown = json.loads(await ledger_report(s.ledger, as_json=True))["refunds"]
        assert shown["total"] == {"payer": None, "owed_atomic": 5_000, "owed_payments": 1,
                                  "sending_atomic": 0, "confirmed_atomic": 45_000}
        assert shown["by_payer"] == [
            {"payer": payer_of(few), "owed_atomic": 5_000, "owed_payments": 1,
             "sending_atomic": 0, "confirmed_atomic": 0},
            {"payer": payer_of(many), "owed_atomic": 0, "owed_payments": 0,
             "sending_atomic": 0, "confirmed_atomic": 45_000}]
        text = await ledger_report(s.ledger)
        assert "refunds (Solana), atomic units: owed 5000 (1 payments), sending 0, confirmed 45000" \
            in text


# The process a crash test kills: the gateway's refund batcher, built from the environment as
# `paywire serve` builds it; RUN=once: one pass; RUN=settle: passes until no refund is open (the
# lease of a killed process's refund must run out first: polled with a deadline).
BATCH_SCRIPT = """
import asyncio, json, sys, time
from agent.app import chain_rpcs_for, make_engine, refund_batchers
from agent.settings import Settings
from payments.ledger import Ledger
from payments.ledger_schema import RefundState
from payments.refund_ledger import RefundLedger

async def main(run):
    settings = Settings.from_env()
    engine = make_engine(settings.db_url)
    ledger = Ledger(engine)
    _, [batcher] = refund_batchers(settings, None, ledger, chain_rpcs_for(settings, None), sys.argv[2])
    deadline = time.monotonic() + 60
    while True:
        tally = await batcher.run_once()
        refunds = await RefundLedger(ledger).refunds()
        if run == "once" or (refunds and all(r.state == RefundState.CONFIRMED for r in refunds)):
            break
        assert time.monotonic() < deadline, [r.state for r in refunds]
        await asyncio.sleep(0.1)
    print(json.dumps(tally.__dict__))
    ledger.close()
    await engine.dispose()

asyncio.run(main(sys.argv[1]))
"""


def run_batch(s: Shop, run: str, owner: str, failpoint: str | None = None
              ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **s.env, "PYTHONPATH": str(ROOT)}
    env.pop("PAYWIRE_FAILPOINTS", None)
    if failpoint is not None:
        env["PAYWIRE_FAILPOINTS"] = f"{failpoint}=kill"
    return subprocess.run([sys.executable, "-c", BATCH_SCRIPT, run, owner], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


async def test_a_crash_after_the_intent_sends_the_same_transfer_once_after_restart(
        chain: Chain, db_url: str) -> None:
    async with shop(chain, db_url) as s:
        payer = chain.funded()
        rows = [await s.pay(payer, charged=10_000), await s.pay(payer, charged=30_000)]

        crashed = run_batch(s, "once", "crashing", failpoint="refund_after_intent")

        assert crashed.returncode == -signal.SIGKILL, crashed.stderr
        [intent] = await s.refunds()
        assert (intent.state, intent.amount_atomic, intent.payments) == (
            RefundState.SIGNED, 60_000, 2)
        assert chain.status(intent.attempt.signature) is None  # never broadcast
        assert chain.balance(payer) == FUNDS - 2 * PAID

        restarted = run_batch(s, "settle", "restarted")

        assert restarted.returncode == 0, restarted.stderr
        assert json.loads(restarted.stdout.splitlines()[-1])["started"] == 0  # no new refund
        [refund] = await s.refunds()
        assert (refund.id, refund.state, refund.attempt, refund.attempts) == (
            intent.id, RefundState.CONFIRMED, intent.attempt, 1)  # the very transfer signed before
        assert [t["signature"] for t in chain.sent_by(s.wallet)] == [intent.attempt.signature]
        assert chain.balance(payer) == FUNDS - 2 * PAID + 60_000
        assert [await s.refund_of(r) for r in rows] == [refund.id, refund.id]

        await s.end_period()
        retried = await s.batcher("retry").run_once()
        assert (retried.started, retried.sent) == (0, 0) and len(chain.sent_by(s.wallet)) == 1


async def test_a_crash_after_the_broadcast_confirms_that_transfer_and_sends_no_other(
        chain: Chain, db_url: str) -> None:
    async with shop(chain, db_url) as s:
        payer = chain.funded()
        await s.pay(payer, charged=5_000)
        chain.rpc("devnet_setAutoProcess", [False])  # the node takes transactions, lands none yet
        try:
            crashed = run_batch(s, "once", "crashing", failpoint="refund_after_broadcast")
            assert crashed.returncode == -signal.SIGKILL, crashed.stderr
            [sent] = await s.refunds()
            assert (sent.state, sent.amount_atomic) == (RefundState.SENT, 45_000)
            assert chain.status(sent.attempt.signature) is None  # queued, not landed

            # restarted while it waits: the same transaction is sent again, nothing else
            again = run_batch(s, "once", "restarted")
            assert again.returncode == 0, again.stderr
            [waiting] = await s.refunds()
            assert (waiting.state, waiting.attempt) == (RefundState.SENT, sent.attempt)
        finally:
            chain.rpc("devnet_processQueued", [])
            chain.rpc("devnet_setAutoProcess", [True])

        settled = run_batch(s, "settle", "restarted-again")

        assert settled.returncode == 0, settled.stderr
        [refund] = await s.refunds()
        assert (refund.id, refund.state, refund.attempt) == (sent.id, RefundState.CONFIRMED,
                                                             sent.attempt)
        assert [t["signature"] for t in chain.sent_by(s.wallet)] == [sent.attempt.signature]
        assert chain.balance(payer) == FUNDS - PAID + 45_000


async def test_two_replicas_batching_at_once_send_one_transfer(chain: Chain, db_url: str) -> None:
    async with shop(chain, db_url) as s:
        payers = [chain.funded() for _ in range(3)]
        for payer in payers:
            await s.pay(payer, charged=1_000)
        # another replica: its own engine and ledger on the same database
        other_engine = make_engine(s.settings.db_url)
        other = Ledger(other_engine)
        try:
            # the period's turn: one replica batches, the other does not
            tallies = await asyncio.gather(s.batcher("replica-1").run_once(),
                                           s.batcher("replica-2", other).run_once())
            assert sorted(t.batch for t in tallies) == [False, True]
            assert sum(t.started for t in tallies) == 3
            # two batches at once all the same (a turn that ran out mid-batch): the database lets
            # one refund cover a payment, and the losing replica's signed transfer is never sent
            for payer in payers:
                await s.pay(payer, charged=2_000)
            tallies = [RefundTally(), RefundTally()]
            await asyncio.gather(*(s.batcher(f"racer-{i}", ledger).start_batch(tally)
                                   for i, (ledger, tally) in enumerate(zip((s.ledger, other),
                                                                          tallies, strict=True))))
            assert sum(t.started for t in tallies) == 3
            assert sum(t.skipped for t in tallies) >= 1  # an intent refused: its rows were taken
        finally:
            other.close()
            await other_engine.dispose()
        refunds = await s.refunds()
        assert len(refunds) == 6 and {r.state for r in refunds} == {RefundState.CONFIRMED}
        assert sorted(t["signature"] for t in chain.sent_by(s.wallet)) == sorted(
            r.attempt.signature for r in refunds)
        for payer in payers:
            assert chain.balance(payer) == FUNDS - 2 * PAID + 49_000 + 48_000
            rows = s.rows[payer_of(payer)]
            assert len({await s.refund_of(r) for r in rows}) == 2  # one refund per batch


async def test_a_transfer_whose_blockhash_expired_unlanded_is_signed_again_for_the_same_rows(
        chain: Chain, db_url: str) -> None:
    async with shop(chain, db_url) as s:
        payer = chain.funded()
        rows = [await s.pay(payer, charged=0)]
        chain.rpc("devnet_setAutoProcess", [False])
        try:
            first = await s.batcher().run_once()
            assert (first.started, first.sent, first.confirmed) == (1, 1, 0)
            [signed] = await s.refunds()
            # the transfer waits in the node until its blockhash is past its last valid height,
            # then the node drops it
            slots = signed.attempt.last_valid_height - chain.rpc("getBlockHeight", []) + 1
            chain.clock.now += (slots + 1) * SLOT_SECONDS
            assert chain.rpc("devnet_processQueued", []) == [{
                "signature": signed.attempt.signature, "landed": False, "err": "BlockhashNotFound"}]
        finally:
            chain.rpc("devnet_setAutoProcess", [True])

        second = await s.batcher("replica-2").run_once()

        assert (second.started, second.sent, second.confirmed) == (0, 1, 1)
        [refund] = await s.refunds()
        assert (refund.id, refund.state, refund.attempts, refund.amount_atomic) == (
            signed.id, RefundState.CONFIRMED, 2, PAID)
        assert refund.attempt.signature != signed.attempt.signature
        assert chain.status(signed.attempt.signature) is None  # never landed
        assert [t["signature"] for t in chain.sent_by(s.wallet)] == [refund.attempt.signature]
        assert chain.balance(payer) == FUNDS  # paid 50,000, charged nothing, refunded 50,000
        assert [await s.refund_of(r) for r in rows] == [refund.id]


async def test_switched_off_nothing_is_sent_and_the_receipt_promises_nothing(
        chain: Chain, tmp_path: Path) -> None:
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    async with shop(chain, db_url, PAYWIRE_REFUNDS="false") as s:
        payer = chain.funded()
        await s.pay(payer, charged=10_000)
        policy, batchers = refund_batchers(s.settings, None, s.ledger,
                                           chain_rpcs_for(s.settings, None), "replica")
        assert (policy.enabled, batchers) == (False, [])
        assert policy.refund_note(PAID, 10_000, NET) is None
        # the gateway runs no batcher: started and stopped, it sent nothing
        app = create_app(s.settings)
        async with app.router.lifespan_context(app):
            assert app.state.runtime.refunds == policy
        assert chain.sent_by(s.wallet) == [] and await s.refunds() == []
        assert chain.balance(payer) == FUNDS - PAID
        # what is owed stays shown as owed
        total = (await Accounting(s.engine).revenue()).total
        assert (total.revenue_atomic, total.refund_owed_atomic) == (10_000, 40_000)

    # switched on (the default with a refund key), the gateway sends it as it starts
    async with shop(chain, db_url) as s:
        payer = chain.funded()
        await s.pay(payer, charged=10_000)
        app = create_app(s.settings)
        async with app.router.lifespan_context(app):
            deadline = time.monotonic() + DEADLINE_S
            while not [r for r in await s.refunds() if r.state == RefundState.CONFIRMED]:
                assert time.monotonic() < deadline, "the gateway sent no refund"
                await asyncio.sleep(0.05)
        [refund] = await s.refunds()
        assert (refund.payer, refund.amount_atomic) == (payer_of(payer), 40_000)
        assert chain.balance(payer) == FUNDS - PAID + 40_000


def test_the_refund_key_must_be_the_solana_pay_to_wallets() -> None:
    wallet, other = Keypair(), Keypair()
    base = {"PAYWIRE_NETWORKS": "solana", "PAYWIRE_SOLANA_PAY_TO": str(wallet.pubkey()),
            "PAYWIRE_FACILITATOR_URL": "https://facilitator.example",
            "PAYWIRE_SOLANA_RPC_URL": "https://node.example"}
    assert Settings.from_env(base | {"PAYWIRE_REFUND_KEY_SOLANA": str(wallet)}).refunds_on
    assert not Settings.from_env(base).refunds_on  # no key: off
    with pytest.raises(ConfigError) as wrong:
        Settings.from_env(base | {"PAYWIRE_REFUND_KEY_SOLANA": str(other)})
    assert wrong.value.problems == [
        f"PAYWIRE_REFUND_KEY_SOLANA is the key of {other.pubkey()}, not of PAYWIRE_SOLANA_PAY_TO "
        f"({wallet.pubkey()}): refunds are sent from the wallet payments are paid to; set that "
        "wallet's key"]
    with pytest.raises(ConfigError, match="PAYWIRE_REFUNDS is true but PAYWIRE_REFUND_KEY_SOLANA "
                                          "is not set"):
        Settings.from_env(base | {"PAYWIRE_REFUNDS": "true"})
    with pytest.raises(ConfigError, match="PAYWIRE_SOLANA_RPC_URL is not set: refunds are sent"):
        Settings.from_env({k: v for k, v in base.items() if k != "PAYWIRE_SOLANA_RPC_URL"}
                          | {"PAYWIRE_REFUND_KEY_SOLANA": str(wallet)})
    with pytest.raises(ConfigError, match="PAYWIRE_REFUND_KEY_SOLANA is not a Solana secret key"):
        Settings.from_env(base | {"PAYWIRE_REFUND_KEY_SOLANA": "not-a-key"})
    with pytest.raises(ConfigError, match="PAYWIRE_NETWORKS has no Solana network"):
        Settings.from_env({"PAYWIRE_NETWORKS": "base", "PAYWIRE_EVM_PAY_TO": "0x" + "11" * 20,
                           "PAYWIRE_FACILITATOR_URL": "https://facilitator.example",
                           "PAYWIRE_REFUND_KEY_SOLANA": str(wallet)})
    with pytest.raises(ConfigError, match="PAYWIRE_REFUND_MIN_USD must be a USD amount"):
        Settings.from_env(base | {"PAYWIRE_REFUND_MIN_USD": "-1"})


def test_the_devnet_env_file_carries_the_pay_to_wallets_refund_key() -> None:
    keys = DevnetKeys.generate()
    devnet = SimpleNamespace(keys=keys, networks=[BASE_SEPOLIA, SOLANA_DEVNET])
    env = gateway_env(devnet, "http://127.0.0.1:9")  # type: ignore[arg-type]
    assert env["PAYWIRE_REFUND_KEY_SOLANA"] == keys.sol_merchant
    settings = Settings.from_env(env)
    assert settings.refunds_on and settings.solana_pay_to == keys.sol_merchant_address
