"""Chain fees (issue 23 §6, payments/chain_fees.py): what every transaction paywire's payments
cause paid in gas or fees, read from the chain after the fact and shown to the operator.

Real chains: the py-evm devnet (DevUSDC, Permit2 and the upto proxy) and the LiteSVM Solana devnet,
each served over loopback JSON-RPC. Real payments: signed by the x402 SDK's clients (exact on
both, upto on EVM), settled by the in-process facilitator over RPC (the production signers) and
written to the ledger as the pipeline writes them (claim, intent, settled with what was charged);
a Solana refund batch as the gateway builds it. Meters as the assembly builds them
(`agent.app.chain_fee_meter` from `Settings`, through `chain_rpcs_for`). SQLite and PostgreSQL.

What must hold: the fee recorded is exactly the receipt's gasUsed x effectiveGasPrice (what the
facilitator's balance lost in that block), Solana's meta.fee (what the fee payer's balance lost),
paid by whom the chain says; once, across two meters at once and a restart; a transaction the
node does not know yet is asked again later; an upto settlement of zero has no transaction and no
fee; the reports, /metrics and the operator API show the figures, in USD at the operator's prices.
"""

from __future__ import annotations

import asyncio
import csv
import hashlib
import io
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from prometheus_client.parser import text_string_to_metric_families
from solders.keypair import Keypair
from sqlalchemy import update
from x402 import x402Client
from x402.mechanisms.evm.constants import PERMIT2_ADDRESS
from x402.mechanisms.evm.exact import ExactEvmClientScheme
from x402.mechanisms.evm.signers import EthAccountSigner, EthAccountSignerWithRPC
from x402.mechanisms.evm.upto import UptoEvmClientScheme
from x402.mechanisms.svm.exact.client import ExactSvmScheme as ExactSvmClientScheme
from x402.mechanisms.svm.signers import KeypairSigner
from x402.schemas import PaymentPayload, PaymentRequirements, ResourceInfo

from agent.app import chain_fee_meter, chain_rpcs_for, make_engine, refund_batchers
from agent.cli.accounting_report import revenue_table
from agent.cli.ledger_report import report as ledger_report
from agent.cli.main import main
from agent.settings import Settings
from payments.accounting import Accounting, decimal_text
from payments.accounting_csv import revenue_csv
from payments.chain_fees import ChainFeeMeter, ChainFees, FeeKind, FeePrices, MeterTally, expect
from payments.chain_probe import HttpJsonRpc, JsonRpc
from payments.devnet.evm import EvmDevnet, load_artifact
from payments.devnet.solana import LAMPORTS_PER_SOL, SolanaDevnet
from payments.facilitators import in_process_facilitator, rpc_signers
from payments.ledger import Claimed, ClaimRequest, Ledger
from payments.ledger_schema import ChainFeeState, turns_table
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from payments.processor import PaymentProcessor, PayTo, identify
from payments.refund_ledger import RefundLedger
from tests.support.jsonrpc_http import JsonRpcHttpServer
from tests.support.live_server import LiveServer, start_server
from tests.support.operator_ledger import BODY, SKILL, admin_token
from tests.support.paying import client_for, header, post_paid, quote, receipt, sign
from tests.support.x402_devnet import MovableClock, X402Chain, new_key

pytestmark = [pytest.mark.filterwarnings("ignore:Client is deprecated"),
              pytest.mark.filterwarnings("ignore:TxOpts is deprecated")]

EVM, SOL = BASE_SEPOLIA.caip2, SOLANA_DEVNET.caip2
PRICE = 10_000  # an exact payment: $0.01
MAX, USED = 20_000, 1_858  # an upto payment: the quoted maximum, what the call used
ETH_USD, SOL_USD = Decimal("3150.25"), Decimal("142.5")
TOKEN_ABI = load_artifact()["abi"]
DEADLINE_S = 60.0


# ------------------------------------------------------------------------------------ chains


@dataclass
class EvmChain:
    """The py-evm devnet on loopback, with a facilitator key of the test's own."""

    x402: X402Chain
    facilitator_key: str

    @property
    def devnet(self) -> EvmDevnet:
        assert isinstance(self.x402.chain, EvmDevnet)
        return self.x402.chain

    @property
    def facilitator(self) -> str:
        return Account.from_key(self.facilitator_key).address.lower()

    def receipt(self, tx: str) -> Any:
        return self.x402.w3.eth.get_transaction_receipt(tx)  # type: ignore[arg-type]

    def lost_in_block(self, address: str, block: int) -> int:
        """What `address`'s ETH balance lost in `block` (the devnet mines one transaction a block)."""
        eth = self.x402.w3.eth
        account = to_checksum_address(address)
        return int(eth.get_balance(account, block - 1)) - int(eth.get_balance(account, block))

    def payer(self, *, upto: bool = False) -> LocalAccount:
        """A payer with USDC; for upto, with gas too, having approved Permit2 once."""
        payer = self.x402.funded(10 * MAX, gas=upto)
        if upto:
            token = self.x402.w3.eth.contract(address=self.x402.usdc, abi=TOKEN_ABI)
            self.x402.send(payer, self.x402.usdc,
                           token.encode_abi("approve", args=[PERMIT2_ADDRESS, 2**256 - 1]))
        return payer


@pytest.fixture(scope="module")
def evm() -> Iterator[EvmChain]:
    key, clock = new_key(), MovableClock()
    devnet = EvmDevnet(facilitator_key=key, minter_key=new_key(), clock=clock)
    with JsonRpcHttpServer(devnet.rpc) as server:
        yield EvmChain(X402Chain("devnet", devnet, server.url, clock=clock), key)


@dataclass
class SolChain:
    devnet: SolanaDevnet
    fee_payer: Keypair
    url: str

    def rpc(self, method: str, params: list[Any]) -> Any:
        answer = self.devnet.rpc(method, params)
        assert "error" not in answer, answer
        return answer["result"]

    def lamports(self, owner: Keypair | str) -> int:
        key = str(owner.pubkey()) if isinstance(owner, Keypair) else owner
        return int(self.rpc("getBalance", [key, {"commitment": "confirmed"}])["value"])

    def funded(self) -> Keypair:
        payer = Keypair()
        self.devnet.mint_to(str(payer.pubkey()), 10 * PRICE)
        return payer

    def merchant(self) -> Keypair:
        """A pay-to wallet: its token account, and SOL for its refunds' fees."""
        wallet = Keypair()
        self.devnet.mint_to(str(wallet.pubkey()), 0)
        self.devnet.airdrop(str(wallet.pubkey()), LAMPORTS_PER_SOL)
        return wallet


@pytest.fixture(scope="module")
def sol() -> Iterator[SolChain]:
    fee_payer = Keypair()
    devnet = SolanaDevnet(fee_payer=fee_payer, mint_authority=Keypair())
    with JsonRpcHttpServer(devnet.rpc) as server:
        yield SolChain(devnet, fee_payer, server.url)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("postgres_server").fresh_url())


# ------------------------------------------------------------------------------------ the shop


class Shop:
    """A production-mode gateway's settings on the devnets, its ledger and payment processor:
    pays and settles as the pipeline does; builds meters and refund batchers as the assembly
    does."""

    def __init__(self, db_url: str, *, evm: EvmChain | None = None, sol: SolChain | None = None
                 ) -> None:
        self.evm, self.sol = evm, sol
        self.evm_pay_to = Account.create().address
        self.wallet = sol.merchant() if sol is not None else None
        env = {"PAYWIRE_DATABASE_URL": db_url, "PAYWIRE_SETTLEMENT_LEASE_SECONDS": "1",
               "PAYWIRE_NETWORKS": ",".join([*(["base-sepolia"] if evm else []),
                                             *(["solana-devnet"] if sol else [])])}
        if evm is not None:
            env |= {"PAYWIRE_EVM_RPC_URL": evm.x402.rpc_url, "PAYWIRE_EVM_PAY_TO": self.evm_pay_to,
                    "PAYWIRE_EVM_FACILITATOR_KEY": evm.facilitator_key}
        if sol is not None and self.wallet is not None:
            env |= {"PAYWIRE_SOLANA_RPC_URL": sol.url, "PAYWIRE_SOLANA_PAY_TO": str(self.wallet.pubkey()),
                    "PAYWIRE_SOLANA_FACILITATOR_KEY": str(sol.fee_payer),
                    "PAYWIRE_REFUND_KEY_SOLANA": str(self.wallet)}
        self.settings = Settings.from_env(env)
        self.engine = make_engine(db_url)
        self.ledger = Ledger(self.engine)
        evm_signer, svm_signer = rpc_signers(
            evm_key=self.settings.secret("evm_facilitator_key"),
            evm_rpc_url=self.settings.evm_rpc_url or "",
            solana_key=self.settings.secret("solana_facilitator_key"),
            solana_rpc_url=self.settings.solana_rpc_url or "")
        self.processor = PaymentProcessor(
            in_process_facilitator(list(self.settings.networks), evm_signer=evm_signer,
                                   svm_signer=svm_signer),
            [PayTo(n, self.evm_pay_to if n.family == "evm" else str(self.wallet.pubkey()))  # type: ignore[union-attr]
             for n in self.settings.networks])
        self.processor.start()
        self._rpcs: list[dict[str, JsonRpc]] = []
        self._engines: list[Any] = []

    # -- paying, as the pipeline records it -------------------------------------------------

    async def pay_exact(self, network: str, payer: LocalAccount | Keypair,
                        charged: int | None = None) -> str:
        """An exact payment of PRICE, settled; recorded with what the call was charged."""
        [requirement] = [r for r in self.processor.requirements(PRICE) if r.network == network]
        client = x402Client()
        if isinstance(payer, Keypair):
            assert self.sol is not None
            client.register("solana:*", ExactSvmClientScheme(KeypairSigner(payer), rpc_url=self.sol.url))
        else:
            client.register("eip155:*", ExactEvmClientScheme(EthAccountSigner(payer)))
        return await self._settle(client, requirement, None, charged)

    async def pay_upto(self, payer: LocalAccount, used: int) -> str:
        """An upto payment authorized at MAX, settling what the call `used` (0 moves nothing)."""
        assert self.evm is not None
        [requirement] = [r for r in self.processor.requirements(MAX, upto=True)
                         if r.scheme == "upto"]
        client = x402Client().register(
            EVM, UptoEvmClientScheme(EthAccountSignerWithRPC(payer, self.evm.x402.rpc_url)))
        return await self._settle(client, requirement, used, used)

    async def _settle(self, client: x402Client, requirement: PaymentRequirements,
                      amount: int | None, charged: int | None) -> str:
        resource = ResourceInfo(url="http://gateway.test/v1/chat/completions")
        payload = await client.create_payment_payload(
            self.processor.payment_required([requirement], resource))
        assert isinstance(payload, PaymentPayload)
        matched = self.processor.match(payload, [requirement], resource)
        assert matched is not None
        identity = identify(matched, self.processor.transaction_id)
        claim = await self.ledger.claim(ClaimRequest(
            identity.key, int(requirement.amount), requirement.asset, requirement.pay_to, "gpt-4o",
            hashlib.sha256(b"request").hexdigest()), owner="pipeline", lease_seconds=30)
        assert isinstance(claim, Claimed)
        assert await self.ledger.begin_settlement(claim.row_id, owner="pipeline",
                                                  chain_ref=identity.chain_ref, lease_seconds=30,
                                                  charged_atomic=amount)
        assert (await self.processor.verify(matched)).is_valid
        settled = await self.processor.settle(matched, amount)
        assert settled.success, settled.error_reason
        assert await self.ledger.mark_settled(claim.row_id, settled.transaction,
                                              charged_atomic=charged)
        return claim.row_id

    async def tx_of(self, row_id: str) -> str | None:
        return (await self.ledger.get(row_id) or {}).get("tx_hash")

    # -- the assembly's background work ------------------------------------------------------

    async def other_ledger(self) -> Ledger:
        """Another replica's ledger: its own engine on the same database."""
        engine = make_engine(self.settings.db_url)
        self._engines.append(engine)
        return Ledger(engine)

    def rpcs(self) -> dict[str, JsonRpc]:
        """The RPCs the reconciler asks, as the assembly builds them."""
        rpcs = chain_rpcs_for(self.settings, None)
        self._rpcs.append(rpcs)
        return rpcs

    def meter(self, owner: str, ledger: Ledger | None = None) -> ChainFeeMeter:
        return chain_fee_meter(self.settings, ledger or self.ledger, self.rpcs(), owner)

    async def end_turn(self) -> None:
        """The meter's turn ends now (as if its period had been waited out)."""
        async with self.ledger.writing() as conn:
            await conn.execute(update(turns_table).values(until=datetime.now(UTC) - timedelta(1)))

    async def fees(self) -> dict[str, dict[str, Any]]:
        """The fee rows by transaction."""
        return {row["tx_id"]: row for row in await ChainFees(self.ledger).rows()}

    async def close(self) -> None:
        for rpcs in self._rpcs:
            for rpc in rpcs.values():
                if isinstance(rpc, HttpJsonRpc):
                    await rpc.aclose()
        for engine in self._engines:
            await engine.dispose()
        await self.processor.aclose()
        self.ledger.close()
        await self.engine.dispose()


@asynccontextmanager
async def shop(db_url: str, **chains: Any) -> AsyncIterator[Shop]:
    opened = Shop(db_url, **chains)
    try:
        await opened.ledger.create_tables()
        yield opened
    finally:
        await opened.close()


def tallied(*tallies: MeterTally) -> tuple[int, int, int]:
    return (sum(t.registered for t in tallies), sum(t.recorded for t in tallies),
            sum(t.waiting for t in tallies))


# ------------------------------------------------------------------------------------ EVM


async def test_evm_fees_are_the_receipts_gas_times_price_once_across_two_meters_and_a_restart(
        evm: EvmChain, db_url: str) -> None:
    async with shop(db_url, evm=evm) as s:
        exact = [await s.pay_exact(EVM, evm.payer()) for _ in range(2)]
        upto = await s.pay_upto(evm.payer(upto=True), USED)
        txs = {row: await s.tx_of(row) for row in [*exact, upto]}
        assert all(txs.values())

        # two replicas' meters at once: one holds the turn ...
        other = await s.other_ledger()
        first = await asyncio.gather(s.meter("replica-1").run_once(),
                                     s.meter("replica-2", other).run_once())
        assert sorted(t.turn for t in first) == [False, True]
        assert tallied(*first) == (3, 3, 0)
        # ... and two passes at once all the same (a turn that ran out mid-pass)
        await s.end_turn()
        raced = [MeterTally(), MeterTally()]
        await asyncio.gather(s.meter("racer-1").meter(raced[0]),
                             s.meter("racer-2", other).meter(raced[1]))
        assert tallied(*raced) == (0, 0, 0)

        fees = await s.fees()
        assert sorted(fees) == sorted(tx.lower() for tx in txs.values() if tx)
        for row, tx in txs.items():
            assert tx is not None
            fee, receipt = fees[tx.lower()], evm.receipt(tx)
            assert (fee["kind"], fee["ref"], fee["state"]) == (
                FeeKind.UPTO_SETTLEMENT if row == upto else FeeKind.SETTLEMENT, row,
                ChainFeeState.RECORDED)
            assert fee["gas_used"] == receipt["gasUsed"] > 21_000
            assert fee["gas_price"] == receipt["effectiveGasPrice"] > 0
            assert fee["fee"] == receipt["gasUsed"] * receipt["effectiveGasPrice"]
            assert fee["fee"] == evm.lost_in_block(evm.facilitator, receipt["blockNumber"])
            assert (fee["paid_by"], fee["block_number"], fee["succeeded"], fee["l1_fee"]) == (
                evm.facilitator, receipt["blockNumber"], True, None)
        print("gas per settlement on the py-evm devnet: exact",
              [fees[str(txs[r]).lower()]["gas_used"] for r in exact], "upto",
              fees[str(txs[upto]).lower()]["gas_used"])

        # a restart: fresh meters (their scans start over) find everything, count nothing again
        await s.end_turn()
        again = await s.meter("restarted", await s.other_ledger()).run_once()
        assert again.turn and tallied(again) == (0, 0, 0)
        assert await s.fees() == fees


async def test_an_upto_settlement_of_zero_has_no_transaction_and_no_fee(
        evm: EvmChain, tmp_path: Path) -> None:
    async with shop(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}", evm=evm) as s:
        zero = await s.pay_upto(evm.payer(upto=True), 0)
        used = await s.pay_upto(evm.payer(upto=True), USED)
        row = await s.ledger.get(zero)
        assert row is not None and (row["state"], row["tx_hash"], row["charged_atomic"]) == (
            "settled", None, 0)

        tally = await s.meter("replica").run_once()

        assert tallied(tally) == (1, 1, 0)
        assert [(f["ref"], f["kind"]) for f in (await s.fees()).values()] == [
            (used, FeeKind.UPTO_SETTLEMENT)]
        report = await Accounting(s.engine).chain_fees()
        assert [(line.kind, line.transactions) for line in report.lines] == [("upto_settlement", 1)]
        [per_call] = report.per_call
        assert per_call.paid_calls == 2 and per_call.transactions == 1  # the zero call rode free


async def test_a_transaction_the_node_does_not_know_yet_is_asked_again(
        evm: EvmChain, db_url: str) -> None:
    """The channel code's hook: `ChainFees.expect` registers a transaction (here a claim the node
    has not seen yet); the meter asks again later, and gives one never seen up long after."""
    async with shop(db_url, evm=evm) as s:
        fees = ChainFees(s.ledger)
        sender = evm.x402.funded(0, gas=True)
        claim = _signed_transfer(evm, sender, nonce_offset=0)
        tx = claim.hash.to_0x_hex()
        assert await expect(s.ledger, "0x" + tx[2:].upper(), EVM, "claim", ref="channel-1")
        assert await fees.expect(tx, EVM, FeeKind.CLAIM, ref="channel-1") is False  # once
        with pytest.raises(ValueError, match="^kind: one of settlement, "):
            await fees.expect(tx, EVM, "gas")
        with pytest.raises(ValueError, match="^tx_id: a transaction id of eip155:84532"):
            await fees.expect("0x12", EVM, FeeKind.CLAIM)
        meter = ChainFeeMeter(s.ledger, s.rpcs(), owner="replica", retry_seconds=0)

        unknown = MeterTally()
        await meter.meter(unknown)

        assert (unknown.recorded, unknown.waiting) == (0, 1)
        row = (await s.fees())[tx]
        assert (row["state"], row["attempts"], row["fee"], row["kind"], row["ref"]) == (
            ChainFeeState.WAITING, 1, None, FeeKind.CLAIM, "channel-1")
        assert row["error"] == "the node does not know this transaction (yet)"

        evm.x402.w3.eth.send_raw_transaction(claim.raw_transaction)
        known = MeterTally()
        await meter.meter(known)

        assert (known.recorded, known.waiting) == (1, 0)
        row, receipt = (await s.fees())[tx], evm.receipt(tx)
        assert (row["state"], row["attempts"], row["error"]) == (ChainFeeState.RECORDED, 1, None)
        assert row["fee"] == receipt["gasUsed"] * receipt["effectiveGasPrice"]
        assert row["fee"] == evm.lost_in_block(sender.address, receipt["blockNumber"]) - 1  # + 1 wei sent
        assert row["paid_by"] == sender.address.lower()

        never = _signed_transfer(evm, sender, nonce_offset=5).hash.to_0x_hex()  # a nonce gap: never mined
        assert await fees.expect(never, EVM, FeeKind.SWEEP)
        gives_up = ChainFeeMeter(s.ledger, s.rpcs(), owner="replica", give_up_seconds=0)
        tally = MeterTally()
        await gives_up.meter(tally)
        assert tally.missing == 1
        assert ((await s.fees())[never]["state"], tally.recorded) == (ChainFeeState.MISSING, 0)
        report = await Accounting(s.engine).chain_fees()
        assert (report.waiting, report.missing) == (0, 1)
        assert [(line.kind, line.transactions) for line in report.lines] == [("claim", 1)]


def _signed_transfer(evm: EvmChain, sender: LocalAccount, *, nonce_offset: int) -> Any:
    """A transfer of 1 wei from `sender`, signed, not sent."""
    w3 = evm.x402.w3
    base_fee = int(w3.eth.get_block("latest")["baseFeePerGas"])
    return sender.sign_transaction({
        "to": to_checksum_address(Account.create().address), "value": 1, "gas": 21_000,
        "nonce": w3.eth.get_transaction_count(sender.address, "pending") + nonce_offset,
        "chainId": EvmDevnet.CHAIN_ID, "maxFeePerGas": 2 * base_fee + 10**6,
        "maxPriorityFeePerGas": 10**6})


# ------------------------------------------------------------------------------------ Solana


async def test_solana_fees_are_what_the_fee_payers_paid_and_the_margin_takes_them(
        sol: SolChain, db_url: str) -> None:
    async with shop(db_url, sol=sol) as s:
        assert s.wallet is not None
        payer = sol.funded()
        before = sol.lamports(sol.fee_payer)
        rows = [await s.pay_exact(SOL, payer, charged=4_000), await s.pay_exact(SOL, payer, charged=1_000)]
        settlements_cost = before - sol.lamports(sol.fee_payer)
        _, [refunds] = refund_batchers(s.settings, None, s.ledger, s.rpcs(), "replica")
        before = sol.lamports(s.wallet)
        assert (await refunds.run_once()).confirmed == 1
        refund_cost = before - sol.lamports(s.wallet)
        [refund] = await RefundLedger(s.ledger).refunds()

        tally = await s.meter("replica").run_once()

        assert tallied(tally) == (3, 3, 0)
        fees = await s.fees()
        txs = [str(await s.tx_of(row)) for row in rows]
        for row, tx in zip(rows, txs, strict=True):
            fee, meta = fees[tx], sol.rpc("getTransaction", [tx, {
                "encoding": "base64", "maxSupportedTransactionVersion": 0}])
            assert (fee["kind"], fee["ref"], fee["paid_by"], fee["fee"], fee["block_number"]) == (
                FeeKind.SETTLEMENT, row, str(sol.fee_payer.pubkey()), meta["meta"]["fee"], meta["slot"])
            assert (fee["gas_used"], fee["gas_price"], fee["succeeded"]) == (None, None, True)
        assert sum(fees[tx]["fee"] for tx in txs) == settlements_cost > 0
        back = fees[refund.attempt.signature]
        assert (back["kind"], back["ref"], back["paid_by"], back["fee"]) == (
            FeeKind.REFUND, refund.id, str(s.wallet.pubkey()), refund_cost)
        lamports = settlements_cost + refund_cost
        print(f"Solana fees: {settlements_cost // 2} lamports per settlement, {refund_cost} per refund")

        # no SOL price: shown in lamports, named unpriced, left out of the margin
        plain = (await Accounting(s.engine).revenue()).total
        assert (plain.chain_fees.transactions, plain.chain_fees.usd, plain.chain_fees.unpriced) == (
            3, 0, ("SOL",))
        assert plain.margin_usd == plain.revenue_usd == Decimal("0.005")
        # priced: the margin takes them, exactly
        accounting = Accounting(s.engine, FeePrices.of(sol_usd=SOL_USD))
        report = await accounting.revenue(by=["skill"])
        usd = Decimal(lamports).scaleb(-9) * SOL_USD
        total = report.total
        assert (total.chain_fees.native, total.chain_fees.usd, total.chain_fees.unpriced) == (
            (("SOL", lamports),), usd, ())
        assert total.margin_usd == Decimal("0.005") - usd
        # by skill: the settlements' fees with their skill, the refund's in a group of no skill
        assert [(line.skill, line.calls, line.chain_fees.transactions) for line in report.lines] == [
            ("gpt-4o", 2, 2), (None, 0, 1)]
        rows_csv = list(csv.DictReader(io.StringIO("".join(revenue_csv(report)))))
        *lines, last = rows_csv
        assert last["chain_fees_sol_lamports"] == str(lamports)
        assert Decimal(last["chain_fees_usd"]) == usd
        assert sum(int(r["chain_fees_sol_lamports"]) for r in lines) == lamports
        assert Decimal(last["margin_usd"]) == Decimal(last["revenue_usd"]) - Decimal(
            last["upstream_cost_usd"]) - Decimal(last["unbilled_cost_usd"]) - usd
        fee_report = await accounting.chain_fees()
        table = revenue_table(report, fee_report).splitlines()
        assert table[1].split() == ["skill", "calls", "revenue", "upstream", "cost", "unbilled",
                                    "cost", "chain", "fees", "margin", "failed", "pending",
                                    "refunded", "refund", "owed"]
        refund_line = table[3].split()  # the refund's fee: a group of no skill
        assert refund_line[0] == "-" and Decimal(refund_line[5]) == Decimal(
            refund_cost).scaleb(-9) * SOL_USD
        assert "chain fees by day, network and kind (fee in the network's native token's " \
               "smallest unit; USD where its price is set):" in table
        [per_call] = fee_report.per_call
        assert (per_call.paid_calls, per_call.fee) == (2, lamports)
        overview = json.loads(await ledger_report(s.ledger, as_json=True,
                                                  prices=FeePrices.of(sol_usd=SOL_USD)))
        assert {(f["kind"], f["transactions"], f["fee"]) for f in overview["chain_fees"]} == {
            ("settlement", 2, str(settlements_cost)), ("refund", 1, str(refund_cost))}


# ------------------------------------------------------------------------ a live gateway


@dataclass
class Metered:
    """A live devnet gateway whose meter recorded the fees of its paid calls."""

    live: LiveServer
    token: str
    fees: list[dict[str, Any]]  # the recorded rows (one EVM settlement, one Solana settlement)

    def get(self, path: str, **params: str) -> httpx.Response:
        answer = httpx.get(f"{self.live.url}{path}", params=params, timeout=30,
                           headers={"Authorization": f"Bearer {self.token}"})
        assert answer.status_code == 200, answer.text
        return answer

    def fee(self, network: str) -> dict[str, Any]:
        [row] = [f for f in self.fees if f["network"] == network]
        return row

    def usd(self) -> Decimal:
        return (Decimal(self.fee(EVM)["fee"]).scaleb(-18) * ETH_USD
                + Decimal(self.fee(SOL)["fee"]).scaleb(-9) * SOL_USD)


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Metered]:
    token = admin_token()
    live = start_server(tmp_path_factory.mktemp("fees"), env={
        "PAYWIRE_ADMIN_TOKEN": token, "PAYWIRE_CHAIN_FEES_INTERVAL_SECONDS": "0.2",
        "PAYWIRE_ETH_USD": str(ETH_USD), "PAYWIRE_SOL_USD": str(SOL_USD)})
    try:
        url = f"{live.url}/v1/marketplace/api/{SKILL}"
        client = client_for(live.url, evm_key=live.devnet.keys.evm_payer,
                            sol_key=live.devnet.keys.sol_payer)
        for network in (EVM, SOL):
            _, required = quote(url, BODY)
            paid = post_paid(url, BODY, header(sign(client, required, network)))
            assert paid.status_code == 200 and receipt(paid)["success"], paid.text
        yield Metered(live, token, asyncio.run(_recorded(live.runtime.settings.db_url, 2)))
    finally:
        live.stop()


async def _recorded(db_url: str, count: int) -> list[dict[str, Any]]:
    """The fee rows, once the gateway's own meter recorded `count` of them (polled, deadline)."""
    engine = make_engine(db_url)
    ledger = Ledger(engine)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            rows = await ChainFees(ledger).rows()
            if sum(r["state"] == ChainFeeState.RECORDED for r in rows) >= count:
                return rows
            assert time.monotonic() < deadline, f"the meter recorded {rows} in {DEADLINE_S} s"
            await asyncio.sleep(0.05)  # polling with a deadline
    finally:
        ledger.close()
        await engine.dispose()


def test_metrics_count_the_fees_by_network_and_kind(metered: Metered) -> None:
    answer = httpx.get(f"{metered.live.url}/metrics", timeout=30)
    assert answer.status_code == 200
    samples = {(s.name, frozenset(s.labels.items())): s.value
               for family in text_string_to_metric_families(answer.text) for s in family.samples}
    evm, sol = metered.fee(EVM), metered.fee(SOL)

    def sample(name: str, **labels: str) -> float:
        return samples[(name, frozenset(labels.items()))]

    assert sample("paywire_chain_fees_native_total", network=EVM, kind="settlement",
                  unit="wei") == evm["fee"] == evm["gas_used"] * evm["gas_price"]
    assert sample("paywire_chain_fees_native_total", network=SOL, kind="settlement",
                  unit="lamports") == sol["fee"] > 0
    assert sample("paywire_chain_fee_transactions_total", network=EVM, kind="settlement") == 1
    assert sample("paywire_chain_fee_transactions_total", network=SOL, kind="settlement") == 1
    assert sample("paywire_chain_gas_used_total", network=EVM, kind="settlement") == evm["gas_used"]
    assert not [key for key in samples if key[0] == "paywire_chain_fee_transactions_unread"]
    keys = metered.live.devnet.keys
    assert evm["paid_by"] == keys.evm_address(keys.evm_facilitator).lower()
    assert sol["paid_by"] == str(keys.sol_keypair(keys.sol_fee_payer).pubkey())


def test_the_operator_api_and_the_cli_show_the_fees_in_usd_and_take_them_from_the_margin(
        metered: Metered, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    usd = metered.usd()
    summary = metered.get("/admin/summary").json()
    totals = summary["totals"]
    assert (totals["chain_fee_transactions"], totals["chain_fees_eth_wei"],
            totals["chain_fees_sol_lamports"], Decimal(totals["chain_fees_usd"]),
            totals["chain_fees_unpriced"]) == (
        2, str(metered.fee(EVM)["fee"]), str(metered.fee(SOL)["fee"]), usd, [])
    assert Decimal(totals["margin_usd"]) == (Decimal(totals["revenue_usd"]) - Decimal(
        totals["upstream_cost_usd"]) - Decimal(totals["unbilled_cost_usd"]) - usd)
    assert summary["chain_fees"]["prices_usd"] == {"ETH": str(ETH_USD), "SOL": str(SOL_USD)}
    fees = metered.get("/admin/chain-fees").json()
    assert [(line["network"], line["kind"], line["transactions"], line["fee"], line["unit"])
            for line in fees["lines"]] == [
        (EVM, "settlement", 1, str(metered.fee(EVM)["fee"]), "wei"),
        (SOL, "settlement", 1, str(metered.fee(SOL)["fee"]), "lamports")]
    assert [(p["network"], p["paid_calls"], p["gas_per_paid_call"]) for p in fees["per_paid_call"]
            ] == [(EVM, 1, str(metered.fee(EVM)["gas_used"])), (SOL, 1, None)]
    exported = list(csv.DictReader(io.StringIO(metered.get("/admin/chain-fees.csv").text)))
    assert [(r["network"], r["fee"], r["fee_usd"]) for r in exported] == [
        (line["network"], line["fee"], line["fee_usd"]) for line in fees["lines"]]

    # the CLI gives the same figures, at the prices its settings give
    monkeypatch.setenv("PAYWIRE_ETH_USD", str(ETH_USD))
    monkeypatch.setenv("PAYWIRE_SOL_USD", str(SOL_USD))
    where = ["--data-dir", str(metered.live.data_dir)]
    assert main(["ledger", "revenue", "--by", "network", "--format", "json", *where]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == metered.get("/admin/revenue", by="network").json()
    assert [(line["network"], line["chain_fee_transactions"]) for line in printed["lines"]] == [
        (EVM, 1), (SOL, 1)]
    assert main(["ledger", "revenue", "--by", "network", "--format", "csv", *where]) == 0
    assert capsys.readouterr().out == metered.get("/admin/revenue.csv", by="network").text
    assert main(["ledger", *where]) == 0
    overview = capsys.readouterr().out
    assert "chain fees (all time; fee in the native token's smallest unit" in overview
    evm_line = next(line for line in overview.splitlines() if line.strip().startswith(EVM))
    assert evm_line.split()[1:6] == ["settlement", "1", str(metered.fee(EVM)["gas_used"]),
                                     str(metered.fee(EVM)["fee"]), "wei"]


CHROMIUM = Path("/usr/bin/chromium")


def test_the_operator_page_shows_the_chain_fees_beside_revenue_and_margin(metered: Metered) -> None:
    """In headless Chromium (as tests/test_operator_page.py drives it)."""
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            raise RuntimeError(f"{CHROMIUM} is missing: `make chromium` installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing: `make chromium` (apt-get install chromium) installs it")
    sync_api = pytest.importorskip("playwright.sync_api")
    usd = metered.usd()
    problems: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" and not
                    m.location["url"].endswith("/favicon.ico") else None)  # the browser's own ask
            page.set_default_timeout(15_000)
            page.goto(f"{metered.live.url}/admin/")
            page.fill("#token", metered.token)
            page.click("#login button[type=submit]")
            page.wait_for_selector("body[data-loaded=true]")
            labels = page.eval_on_selector_all("#cards .card", "cards => cards.map(c => c.dataset.label)")
            assert labels[labels.index("unbilled cost") + 1:][:2] == ["chain fees (2 tx)", "margin"]
            card = page.locator('#cards .card[data-label="chain fees (2 tx)"] .value')
            assert card.text_content() == f"${decimal_text(usd)}"
            fees = page.inner_text("#fees")
            for network in (EVM, SOL):
                row = page.locator("#fees tr", has=page.locator(f'td[title="{network}"]'))
                assert row.count() == 1, fees
            assert f"{metered.fee(EVM)['fee']} wei" in fees
            assert f"{metered.fee(SOL)['fee']} lamports" in fees
            assert "chain fees" in page.inner_text("#margin thead")
            widths = page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
        finally:
            browser.close()
    assert not problems, problems
    assert widths[0] <= widths[1], f"the page is {widths[0]} px wide in a {widths[1]} px window"
