"""The channel claimer (payments/channels/claimer.py) against real chains and real ledgers.

Channels are opened on the py-evm devnet (anvil for the withdrawal race) by the x402 SDK's own
client deposit (`create_batch_settlement_eip3009_deposit_payload`) settled by the SDK's own
`BatchSettlementEvmFacilitator`; calls are charged into them through paywire's channel store
(reserve + commit, vouchers signed by the SDK's client signer), on a SQLite file or PostgreSQL;
the claimer sends its claims and sweeps through that same facilitator, and everything is read
back from the chain: each channel's totalClaimed, the contract's Claimed events, the receiver's
and the payer's USDC.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import create_async_engine
from web3 import Web3
from x402 import x402Facilitator, x402ResourceServer
from x402.mechanisms.evm.batch_settlement.abi import BATCH_SETTLEMENT_ABI
from x402.mechanisms.evm.batch_settlement.authorizer_signer import LocalAuthorizerSigner
from x402.mechanisms.evm.batch_settlement.client.eip3009 import (
    create_batch_settlement_eip3009_deposit_payload,
)
from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher
from x402.mechanisms.evm.batch_settlement.constants import (
    BATCH_SETTLEMENT_ADDRESS,
    ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
    PAYLOAD_TYPE_VOUCHER,
)
from x402.mechanisms.evm.batch_settlement.encoding import build_erc3009_collector_data
from x402.mechanisms.evm.batch_settlement.errors import ERR_CLAIM_SIMULATION_FAILED
from x402.mechanisms.evm.batch_settlement.facilitator.scheme import BatchSettlementEvmFacilitator
from x402.mechanisms.evm.batch_settlement.facilitator.utils import to_contract_channel_config
from x402.mechanisms.evm.batch_settlement.server import BatchSettlementEvmScheme as ServerScheme
from x402.mechanisms.evm.batch_settlement.server import BatchSettlementEvmSchemeServerConfig
from x402.mechanisms.evm.batch_settlement.server.channel_manager_common import (
    build_payment_requirements,
)
from x402.mechanisms.evm.batch_settlement.types import ChannelConfig as SdkChannelConfig
from x402.mechanisms.evm.signers import EthAccountSigner
from x402.schemas import PaymentPayload, PaymentRequirements, ResourceConfig, SettleResponse

from payments import failpoints
from payments.chain_fees import ChainFees
from payments.chain_probe import HttpJsonRpc
from payments.channels.chain import read_channel, read_channels
from payments.channels.claimer import ChannelClaimer, ClaimPolicy
from payments.channels.store import CHANNEL_CLOSING, ChannelCall, ChannelStore, Committed, Refused, Reserved
from payments.channels.wire import ZERO_ADDRESS, ChannelConfig, Voucher, channel_id_of
from payments.devnet.evm import EvmDevnet
from payments.ledger import Ledger
from payments.ledger_schema import ChannelState, ClaimKind, ClaimState, channels_table, claims_table
from tests.support import reports
from tests.support.evm_anvil import anvil_missing
from tests.support.postgres import PostgresServer
from tests.support.x402_devnet import X402Chain, x402_chain

NETWORK = EvmDevnet.NETWORK
CHAIN_ID = EvmDevnet.CHAIN_ID
DEPOSIT = 100_000  # $0.10 per channel
WITHDRAW_DELAY = 900  # the contract's minimum
FUNDS = 1_000_000
CLAIMED_TOPIC = "0x" + keccak(text="Claimed(bytes32,address,uint128,uint128)").hex()
GAS_REPORT = "channel-claimer-gas"
# An ERC-1271 wallet as bare runtime code: it accepts every signature (isValidSignature answers
# the magic value) until anyone calls it with the selector 0xdeadbeef, after which it refuses
# them all: a smart-wallet payer whose signer was revoked after its vouchers were accepted.
REVOCABLE_WALLET = bytes.fromhex(
    "600035" "60e01c" "63deadbeef" "14" "602b57"  # selector == 0xdeadbeef: jump to revoke
    "600054" "602557"  # revoked (slot 0 set): jump to refuse
    "631626ba7e" "60e01b" "600052" "60206000f3"  # return the magic value
    "5b" "60206000f3"  # refuse: return 32 zero bytes
    "5b" "6001600055" "00")  # revoke: slot 0 = 1


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.fresh_url()


@pytest.fixture
async def ledgers(db_url: str) -> AsyncIterator[list[Ledger]]:
    """Two replicas' ledgers: two engines on one database."""
    engines = [create_async_engine(db_url) for _ in range(2)]
    ledgers = [Ledger(engine) for engine in engines]
    await ledgers[0].create_tables()
    yield ledgers
    for ledger, engine in zip(ledgers, engines, strict=True):
        ledger.close()
        await engine.dispose()


@pytest.fixture
def devnet() -> Iterator[X402Chain]:
    with x402_chain("devnet") as chain:
        yield chain


SQLITE_ONLY = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
Sellers = Callable[..., "Seller"]


@pytest.fixture
async def new_seller() -> AsyncIterator[Sellers]:
    """Makes sellers (`Seller(...)`'s arguments), closing their RPC clients after the test."""
    made: list[Seller] = []

    def make(*args: Any, **kwargs: Any) -> Seller:
        made.append(Seller(*args, **kwargs))
        return made[-1]
    yield make
    for seller in made:
        await seller.rpc.aclose()


@dataclass
class Payer:
    """A channel's payer: an EOA signing its vouchers with the SDK's client signer, or an
    ERC-1271 wallet (its vouchers are whatever bytes it accepts)."""

    address: str
    config: ChannelConfig
    account: LocalAccount | None = None

    @property
    def channel_id(self) -> str:
        return channel_id_of(self.config, CHAIN_ID)

    def signature(self, ceiling: int) -> str:
        if self.account is None:
            return "0x" + "00" * 65
        return sign_voucher(EthAccountSigner(self.account), self.channel_id, ceiling, NETWORK).signature


@dataclass
class Seller:
    """One receiver selling calls through channels: the SDK's facilitator (with paywire's
    receiver-authorizer key) on a chain, and paywire's channel store on a ledger."""

    chain: X402Chain
    ledger: Ledger
    threshold: int = 1_000_000
    interval: float = 300.0
    receiver: str = field(default_factory=lambda: Account.create().address)
    authorizer: LocalAuthorizerSigner = field(default_factory=lambda: LocalAuthorizerSigner(Account.create()))
    sent: list[str] = field(default_factory=list)  # the claimer's payload types, in order

    def __post_init__(self) -> None:
        scheme = BatchSettlementEvmFacilitator(self.chain.chain.facilitator_signer(), self.authorizer)
        self.facilitator = x402Facilitator().register([NETWORK], scheme)
        server = x402ResourceServer(self.facilitator).register(NETWORK, ServerScheme(
            self.receiver, BatchSettlementEvmSchemeServerConfig(withdraw_delay=WITHDRAW_DELAY)))
        server.initialize()
        self.quote: PaymentRequirements = server.build_payment_requirements(ResourceConfig(
            scheme="batch-settlement", pay_to=self.receiver, price="$0.001", network=NETWORK))[0]
        self.store = self.store_on(self.ledger)
        self.rpc = HttpJsonRpc(self.chain.rpc_url)
        self.contract = self.chain.w3.eth.contract(address=BATCH_SETTLEMENT_ADDRESS, abi=BATCH_SETTLEMENT_ABI)

    def store_on(self, ledger: Ledger) -> ChannelStore:
        return ChannelStore(ledger, claim_threshold_atomic=self.threshold,
                            claim_interval_seconds=self.interval)

    def config(self, payer: str, payer_authorizer: str) -> ChannelConfig:
        return ChannelConfig(payer.lower(), payer_authorizer.lower(), self.receiver.lower(),
                             self.authorizer.address.lower(), self.chain.usdc.lower(),
                             WITHDRAW_DELAY, "0x" + "00" * 32)

    async def open(self, deposit: int = DEPOSIT) -> Payer:
        """A funded EOA opens a channel: its deposit settled by the SDK's facilitator, the channel
        adopted by the store from paywire's own read of the chain."""
        account = self.chain.funded(FUNDS)
        payer = Payer(account.address, self.config(account.address, account.address), account)
        sdk_config = SdkChannelConfig(account.address, account.address, self.receiver,
                                      self.authorizer.address, self.chain.usdc, WITHDRAW_DELAY,
                                      "0x" + "00" * 32)
        deposit_payload = create_batch_settlement_eip3009_deposit_payload(
            EthAccountSigner(account), self.quote, sdk_config, deposit, 1_000)
        payment = PaymentPayload(x402_version=2, payload=deposit_payload.to_dict(), accepted=self.quote)
        settled = await self.facilitator.settle(payment, self.quote)
        assert settled.success, settled.error_reason
        return await self._adopt(payer)

    async def open_wallet(self, deposit: int = DEPOSIT) -> tuple[Payer, str]:
        """A smart-wallet (ERC-1271) payer's channel, deposited by a relayer; and its wallet."""
        wallet = self.chain.deploy(REVOCABLE_WALLET)
        self.chain.chain.mint(wallet, deposit)
        payer = Payer(wallet, self.config(wallet, ZERO_ADDRESS))
        sdk_config = SdkChannelConfig(wallet, ZERO_ADDRESS, self.receiver, self.authorizer.address,
                                      self.chain.usdc, WITHDRAW_DELAY, "0x" + "00" * 32)
        data = self.contract.encode_abi("deposit", args=[
            to_contract_channel_config(sdk_config), deposit, ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
            build_erc3009_collector_data("0", str(self.chain.now() + 600), "0x01", "0x" + "00" * 65)])
        self.chain.send(self.chain.funded(0, gas=True), BATCH_SETTLEMENT_ADDRESS, data)
        return await self._adopt(payer), wallet

    async def _adopt(self, payer: Payer) -> Payer:
        onchain = await read_channel(self.rpc, payer.channel_id)
        assert onchain.balance > 0
        await self.store.adopt(payer.config, channel_id=payer.channel_id, network=NETWORK, onchain=onchain)
        return payer

    async def charge(self, payer: Payer, *amounts: int, store: ChannelStore | None = None) -> int:
        """Calls charged `amounts` through the channel, each its own voucher (priced at its
        charge); the channel's running total after them."""
        store = store or self.store
        for actual in amounts:
            channel = await store.get(payer.channel_id)
            assert channel is not None
            ceiling = channel.charged + actual
            call = ChannelCall(NETWORK, PAYLOAD_TYPE_VOUCHER, payer.config,
                               Voucher(payer.channel_id, ceiling, payer.signature(ceiling)), actual,
                               self.chain.usdc.lower(), self.receiver.lower(), "token-count-508",
                               uuid.uuid4().hex)
            reserved = await store.reserve(call, owner="gateway", lease_seconds=30)
            assert isinstance(reserved, Reserved), reserved
            committed = await store.commit(reserved.row_id, call, owner="gateway", actual=actual)
            assert isinstance(committed, Committed), committed
        channel = await store.get(payer.channel_id)
        assert channel is not None
        return channel.charged

    async def send(self, network: str, payload: dict[str, Any]) -> SettleResponse:
        """What PaymentProcessor.settle_channel does, on the SDK's facilitator."""
        self.sent.append(payload["type"])
        requirement = build_payment_requirements(self.receiver, self.chain.usdc, network)
        payment = PaymentPayload(x402_version=2, payload=payload, accepted=requirement)
        return await self.facilitator.settle(payment, requirement)

    def claimer(self, *, store: ChannelStore | None = None, owner: str = "replica-a",
                send: Callable[[str, dict[str, Any]], Awaitable[SettleResponse]] | None = None,
                clock: Callable[[], datetime] | None = None, **policy: Any) -> ChannelClaimer:
        extra = {"clock": clock} if clock is not None else {}
        return ChannelClaimer(
            store or self.store, send=send or self.send, authorizer=self.authorizer,
            rpc_for=lambda network: self.rpc if network == NETWORK else None, owner=owner,
            policy=ClaimPolicy(claim_threshold_atomic=self.threshold,
                               claim_interval_seconds=self.interval, **policy), **extra)

    # -- the chain's side --

    def usdc(self, address: str) -> int:
        return self.chain.chain.balance_of(address)

    def claimed_events(self, channel_id: str) -> list[int]:
        """The newTotalClaimed of every Claimed event of the channel, in order."""
        logs = self.chain.w3.eth.get_logs({"address": BATCH_SETTLEMENT_ADDRESS, "fromBlock": 0,
                                           "toBlock": "latest", "topics": [CLAIMED_TOPIC, channel_id]})
        return [int.from_bytes(bytes(entry["data"])[32:64], "big") for entry in logs]

    async def total_claimed(self, *payers: Payer) -> list[int]:
        read = await read_channels(self.rpc, [p.channel_id for p in payers])
        return [read[p.channel_id].total_claimed for p in payers]

    def payer_tx(self, account: LocalAccount, function: str, *args: Any) -> Any:
        self.chain.chain.fund_gas(account.address, 10**17)
        data = Web3().eth.contract(abi=BATCH_SETTLEMENT_ABI).encode_abi(function, args=list(args))
        return self.chain.send(account, BATCH_SETTLEMENT_ADDRESS, data)


async def claims_of(ledger: Ledger, kind: ClaimKind = ClaimKind.CLAIM) -> list[dict[str, Any]]:
    async with ledger.reading() as conn:
        rows = (await conn.execute(select(claims_table).where(claims_table.c.kind == kind)
                                   .order_by(claims_table.c.created_at))).mappings().all()
    return [dict(row) for row in rows]


async def expire_leases(ledger: Ledger) -> None:
    """The claims' leases run out (their replica is gone)."""
    async with ledger.writing() as conn:
        await conn.execute(update(claims_table).values(
            lease_until=datetime.now(UTC) - timedelta(seconds=1)))


async def fees(ledger: Ledger) -> dict[str, str]:
    """The registered chain fees: transaction -> kind."""
    return {row["tx_id"]: row["kind"] for row in await ChainFees(ledger).rows(network=NETWORK)}


# ---- one claim for many channels ----


async def test_one_claim_covers_many_channels_and_the_sweep_pays_exactly_their_charges(
        new_seller: Sellers, devnet: X402Chain, ledgers: list[Ledger]) -> None:
    seller = new_seller(devnet, ledgers[0], threshold=1_000)  # every channel here is due at once
    payers = [await seller.open() for _ in range(10)]
    charged = [await seller.charge(p, 300 + i, 700, 1_000 * i + 1) for i, p in enumerate(payers)]
    escrow_before = seller.usdc(BATCH_SETTLEMENT_ADDRESS)

    tally = await seller.claimer().run_pass()

    assert (tally.claims, tally.channels_claimed, tally.claimed_atomic) == (1, 10, sum(charged))
    assert (tally.sweeps, tally.swept_atomic, tally.quarantined) == (1, sum(charged), 0)
    assert seller.sent == ["claim", "settle"]
    assert await seller.total_claimed(*payers) == charged
    assert [seller.claimed_events(p.channel_id) for p in payers] == [[c] for c in charged]
    assert seller.usdc(seller.receiver) == sum(charged)  # exactly the charges, nothing else
    assert seller.usdc(BATCH_SETTLEMENT_ADDRESS) == escrow_before - sum(charged)
    [claim] = await claims_of(ledgers[0])
    [sweep] = await claims_of(ledgers[0], ClaimKind.SETTLE)
    assert (claim["state"], claim["amount_atomic"]) == (ClaimState.SETTLED, sum(charged))
    assert (sweep["state"], sweep["amount_atomic"]) == (ClaimState.SETTLED, sum(charged))
    assert await fees(ledgers[0]) == {claim["tx_hash"].lower(): "claim", sweep["tx_hash"].lower(): "sweep"}
    for payer, total in zip(payers, charged, strict=True):
        channel = await seller.store.get(payer.channel_id)
        assert channel is not None
        assert (channel.onchain.total_claimed, channel.claim_due_at) == (total, None)
        assert channel.state == ChannelState.OPEN
    gas = int(devnet.w3.eth.get_transaction_receipt(claim["tx_hash"])["gasUsed"])
    reports.report(GAS_REPORT, f"{devnet.name}: one claim of 10 channels: {gas:,} gas "
                               f"({gas // 10:,} per channel)")

    again = await seller.claimer().run_pass()  # nothing left: no transaction
    assert (again.claims, again.sweeps, seller.sent) == (0, 0, ["claim", "settle"])


@SQLITE_ONLY
async def test_a_claim_carries_at_most_max_claims_channels(
        new_seller: Sellers, devnet: X402Chain, ledgers: list[Ledger]) -> None:
    seller = new_seller(devnet, ledgers[0], threshold=1)
    payers = [await seller.open() for _ in range(7)]
    charged = [await seller.charge(p, 500 + i) for i, p in enumerate(payers)]
    tally = await seller.claimer(max_claims=3).run_pass()
    assert (tally.claims, tally.channels_claimed) == (3, 7)
    assert sorted(len(c["rows"]) for c in await seller.claimer().claims(kind=ClaimKind.CLAIM)) == [1, 3, 3]
    assert await seller.total_claimed(*payers) == charged
    assert seller.usdc(seller.receiver) == sum(charged)


# ---- when a channel is due ----


@SQLITE_ONLY
async def test_a_channel_is_due_past_the_threshold_at_once_else_an_interval_after_its_first_charge(
        new_seller: Sellers, devnet: X402Chain, ledgers: list[Ledger]) -> None:
    seller = new_seller(devnet, ledgers[0], threshold=5_000, interval=300)
    busy, quiet = await seller.open(), await seller.open()
    first_charge = datetime.now(UTC)
    await seller.charge(quiet, 1_000)
    await seller.charge(busy, 3_000)
    busy_total = await seller.charge(busy, 3_000)  # 6,000 unclaimed: past the threshold

    tally = await seller.claimer().run_pass()
    assert (tally.channels_claimed, tally.claimed_atomic) == (1, busy_total)
    assert await seller.total_claimed(busy, quiet) == [busy_total, 0]
    quiet_row = await seller.store.get(quiet.channel_id)
    assert quiet_row is not None and quiet_row.claim_due_at is not None
    assert timedelta(seconds=299) < quiet_row.claim_due_at - first_charge < timedelta(seconds=310)

    early = await seller.claimer(clock=lambda: quiet_row.claim_due_at - timedelta(seconds=1)).run_pass()
    assert early.claims == 0
    due = await seller.claimer(clock=lambda: quiet_row.claim_due_at + timedelta(seconds=1)).run_pass()
    assert (due.claims, due.claimed_atomic) == (1, 1_000)
    assert await seller.total_claimed(busy, quiet) == [busy_total, 1_000]
    assert seller.usdc(seller.receiver) == busy_total + 1_000


@SQLITE_ONLY
async def test_a_commit_that_makes_a_channel_due_wakes_the_claimer(
        new_seller: Sellers, devnet: X402Chain, ledgers: list[Ledger]) -> None:
    """The pipeline calls `wake` when a commit makes a channel due: a pass runs at once, not at
    the next poll (an hour away here)."""
    seller = new_seller(devnet, ledgers[0], threshold=2_000)
    payer = await seller.open()
    claimer = seller.claimer(poll_seconds=3_600)
    runner = asyncio.create_task(claimer.run_forever())
    try:
        total = await seller.charge(payer, 2_500)
        claimer.wake()
        deadline = asyncio.get_running_loop().time() + 20
        while await seller.total_claimed(payer) != [total]:
            assert asyncio.get_running_loop().time() < deadline, "no claim after wake()"
            await asyncio.sleep(0.02)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    assert seller.sent[0] == "claim"


# ---- a failing channel never sinks the batch ----


@SQLITE_ONLY
async def test_forged_over_balance_and_refused_channels_are_quarantined_and_the_rest_claimed(
        new_seller: Sellers, devnet: X402Chain, ledgers: list[Ledger]) -> None:
    seller = new_seller(devnet, ledgers[0], threshold=1)
    good = [await seller.open() for _ in range(3)]
    charged = [await seller.charge(p, 1_000 + i) for i, p in enumerate(good)]

    # a voucher in the ledger the payer never signed (a corrupt or tampered row)
    forged = await seller.open()
    await seller.charge(forged, 2_000)
    stranger = sign_voucher(EthAccountSigner(Account.create()), forged.channel_id, 2_000, NETWORK)
    # charged above what the chain holds (a balance once taken from an optimistic report, #2559)
    over = await seller.open(deposit=10_000)
    async with ledgers[0].writing() as conn:
        await conn.execute(update(channels_table).where(channels_table.c.channel_id == forged.channel_id)
                           .values(signature=stranger.signature))
        await conn.execute(update(channels_table).where(channels_table.c.channel_id == over.channel_id)
                           .values(balance_atomic=50_000))
    await seller.charge(over, 15_000)
    # a smart wallet whose signer was revoked after its vouchers were accepted: only the chain
    # can tell (ERC-1271), so the claim's dry run finds it
    revoked, wallet = await seller.open_wallet()
    await seller.charge(revoked, 4_000)
    devnet.send(devnet.funded(0, gas=True), wallet, bytes.fromhex("deadbeef"))

    tally = await seller.claimer().run_pass()

    assert tally.quarantined == 3
    for payer in (forged, over, revoked):
        channel = await seller.store.get(payer.channel_id)
        assert channel is not None and channel.state == ChannelState.QUARANTINED
    assert await seller.total_claimed(forged, over, revoked) == [0, 0, 0]
    assert await seller.total_claimed(*good) == charged
    assert seller.usdc(seller.receiver) == sum(charged)
    # the culprits were found before anything was sent (the pre-check; the batch's dry run, then
    # its halves'): one claim, of the others
    [claim] = await claims_of(ledgers[0])
    assert (claim["state"], claim["amount_atomic"]) == (ClaimState.SETTLED, sum(charged))
    assert seller.sent == ["claim", "settle"]
    # a quarantined channel takes no voucher and is not claimed again
    assert (await seller.claimer().run_pass()).claims == 0
    refused = await seller.store.reserve(ChannelCall(
        NETWORK, PAYLOAD_TYPE_VOUCHER, forged.config,
        Voucher(forged.channel_id, 3_000, forged.signature(3_000)), 1_000, devnet.usdc.lower(),
        seller.receiver.lower(), "token-count-508", "r"), owner="gateway", lease_seconds=30)
    assert isinstance(refused, Refused) and refused.refusal.reason == "channel_quarantined"


@SQLITE_ONLY
async def test_a_batch_the_facilitator_refuses_moves_nothing_and_goes_again_without_its_culprit(
        new_seller: Sellers, devnet: X402Chain, ledgers: list[Ledger]) -> None:
    """The chain changes between paywire's dry run and the facilitator's (a wallet revokes its
    signer): the facilitator refuses the batch before broadcasting; nothing moved, the claim is
    released, and the next pass finds the culprit and claims the rest."""
    seller = new_seller(devnet, ledgers[0], threshold=1)
    good = [await seller.open() for _ in range(2)]
    charged = [await seller.charge(p, 1_000 + i) for i, p in enumerate(good)]
    revoked, wallet = await seller.open_wallet()
    await seller.charge(revoked, 4_000)

    async def revoke_then_send(network: str, payload: dict[str, Any]) -> SettleResponse:
        if payload["type"] == "claim" and seller.sent.count("claim") == 0:
            devnet.send(devnet.funded(0, gas=True), wallet, bytes.fromhex("deadbeef"))
        return await seller.send(network, payload)

    first = await seller.claimer(send=revoke_then_send).run_pass()
    assert (first.claims, first.released, first.quarantined) == (0, 1, 0)
    [refused] = await claims_of(ledgers[0])
    assert refused["state"] == ClaimState.RELEASED and refused["tx_hash"] is None
    assert refused["error"].startswith(ERR_CLAIM_SIMULATION_FAILED)
    assert await seller.total_claimed(*good, revoked) == [0, 0, 0]

    second = await seller.claimer().run_pass()
    assert (second.claims, second.channels_claimed, second.quarantined) == (1, 2, 1)
    assert await seller.total_claimed(*good, revoked) == [*charged, 0]
    assert seller.usdc(seller.receiver) == sum(charged)


@SQLITE_ONLY
async def test_a_batch_above_one_transactions_gas_is_claimed_in_parts(
        new_seller: Sellers, devnet: X402Chain, ledgers: list[Ledger]) -> None:
    """The facilitator's signer sends every transaction with a fixed 500,000 gas limit: a batch
    of 24 channels (~27,000 gas each) would revert out of gas: it goes in parts that fit."""
    seller = new_seller(devnet, ledgers[0], threshold=1)
    payers = [await seller.open() for _ in range(24)]
    charged = [await seller.charge(p, 100 + i) for i, p in enumerate(payers)]
    tally = await seller.claimer().run_pass()
    assert (tally.claims, tally.channels_claimed) == (2, 24)
    claims = await claims_of(ledgers[0])
    assert all(c["state"] == ClaimState.SETTLED for c in claims)
    gas = [int(devnet.w3.eth.get_transaction_receipt(c["tx_hash"])["gasUsed"]) for c in claims]
    assert all(g <= 450_000 for g in gas), gas
    assert await seller.total_claimed(*payers) == charged
    reports.report(GAS_REPORT, f"{devnet.name}: 24 channels claimed in two transactions: "
                               f"{' + '.join(f'{g:,}' for g in gas)} gas")


# ---- crashes: nothing lost, nothing claimed twice ----


class Crash(Exception):
    pass


def crash_at(monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    real = failpoints.reached

    def reached(name: str) -> None:
        if name == point:
            raise Crash(name)
        real(name)
    monkeypatch.setattr(failpoints, "reached", reached)


@pytest.mark.parametrize("how", ["failpoint", "task stopped"])
async def test_a_claim_cut_between_its_intent_and_its_broadcast_is_claimed_once_later(
        new_seller: Sellers, devnet: X402Chain, ledgers: list[Ledger],
        monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    seller = new_seller(devnet, ledgers[0], threshold=1)
    payers = [await seller.open() for _ in range(3)]
    charged = [await seller.charge(p, 2_000 + i) for i, p in enumerate(payers)]

    if how == "failpoint":
        crash_at(monkeypatch, "claim_after_intent")
        with pytest.raises(Crash):
            await seller.claimer().run_pass()
        monkeypatch.undo()
    else:
        sending = asyncio.Event()

        async def never_answers(network: str, payload: dict[str, Any]) -> SettleResponse:
            sending.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")
        task = asyncio.create_task(seller.claimer(send=never_answers).run_pass())
        await sending.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    [open_claim] = await claims_of(ledgers[0])
    assert open_claim["state"] == ClaimState.SETTLING
    assert await seller.total_claimed(*payers) == [0, 0, 0]

    survivor = seller.claimer(store=seller.store_on(ledgers[1]), owner="replica-b")
    assert (await survivor.run_pass()).claims == 0  # its lease is still running: left alone
    await expire_leases(ledgers[0])
    tally = await survivor.run_pass()

    assert (tally.resolved, tally.claims, tally.channels_claimed) == (1, 1, 3)
    claims = await claims_of(ledgers[0])
    assert [c["state"] for c in claims] == [ClaimState.RELEASED, ClaimState.SETTLED]
    assert [seller.claimed_events(p.channel_id) for p in payers] == [[c] for c in charged]
    assert seller.usdc(seller.receiver) == sum(charged)
    [sweep] = await claims_of(ledgers[0], ClaimKind.SETTLE)
    assert sorted(await fees(ledgers[0])) == sorted([claims[1]["tx_hash"].lower(), sweep["tx_hash"].lower()])


async def test_a_send_the_facilitator_does_not_answer_in_time_is_pending_never_released_at_once(
        new_seller: Sellers, devnet: X402Chain, ledgers: list[Ledger]) -> None:
    """Past the send timeout the facilitator's worker may still broadcast: the claim is pending
    (the chain decides at the next pass), not released and sent again while the first may land."""
    seller = new_seller(devnet, ledgers[0], threshold=1)
    payers = [await seller.open() for _ in range(2)]
    charged = [await seller.charge(p, 2_500 + i) for i, p in enumerate(payers)]

    async def never_answers(network: str, payload: dict[str, Any]) -> SettleResponse:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")
    tally = await seller.claimer(send=never_answers, send_timeout_seconds=0.05).run_pass()

    assert (tally.pending, tally.released, tally.claims) == (1, 0, 0)
    [claim] = await claims_of(ledgers[0])
    assert (claim["state"], claim["lease_until"]) == (ClaimState.PENDING, None)
    # the next pass asks the chain: nothing landed, so released, and its channels claimed again
    tally = await seller.claimer().run_pass()
    assert (tally.resolved, tally.claims, tally.channels_claimed) == (1, 1, 2)
    assert [c["state"] for c in await claims_of(ledgers[0])] == [ClaimState.RELEASED, ClaimState.SETTLED]
    assert [seller.claimed_events(p.channel_id) for p in payers] == [[c] for c in charged]


async def test_a_claim_broadcast_before_its_replica_died_is_settled_from_the_chain(
        new_seller: Sellers, devnet: X402Chain, ledgers: list[Ledger],
        monkeypatch: pytest.MonkeyPatch) -> None:
    seller = new_seller(devnet, ledgers[0], threshold=1)
    payers = [await seller.open() for _ in range(3)]
    charged = [await seller.charge(p, 3_000 + i) for i, p in enumerate(payers)]
    crash_at(monkeypatch, "claim_after_broadcast")
    with pytest.raises(Crash):
        await seller.claimer().run_pass()
    monkeypatch.undo()
    assert await seller.total_claimed(*payers) == charged  # it landed; the ledger does not know
    [open_claim] = await claims_of(ledgers[0])
    assert (open_claim["state"], open_claim["tx_hash"]) == (ClaimState.SETTLING, None)

    await expire_leases(ledgers[0])
    survivor = seller.claimer(store=seller.store_on(ledgers[1]), owner="replica-b")
    tally = await survivor.run_pass()

    assert (tally.resolved, tally.claims) == (1, 0)  # decided from the chain, not sent again
    assert seller.sent == ["claim", "settle"]
    [claim] = await claims_of(ledgers[0])
    assert claim["state"] == ClaimState.SETTLED
    assert claim["tx_hash"] is not None  # found from the contract's Claimed event
    assert [seller.claimed_events(p.channel_id) for p in payers] == [[c] for c in charged]
    assert (await fees(ledgers[0]))[claim["tx_hash"].lower()] == "claim"
    for payer, total in zip(payers, charged, strict=True):
        channel = await seller.store.get(payer.channel_id)
        assert channel is not None and (channel.onchain.total_claimed, channel.claim_due_at) == (total, None)
    assert seller.usdc(seller.receiver) == sum(charged)


@pytest.mark.parametrize("turn", ["held", "another replica's"])
async def test_a_claim_whose_outcome_could_not_be_written_is_decided_at_the_next_pass_not_its_lease(
        new_seller: Sellers, devnet: X402Chain, ledgers: list[Ledger],
        monkeypatch: pytest.MonkeyPatch, turn: str) -> None:
    """The database went between the claim's send and its outcome's write: the claim stays open,
    its lease running. The claimer that sent it is alive and nothing of it works on the claim, so
    its next pass (with the turn or not) decides it from the chain, without waiting 120 s."""
    seller = new_seller(devnet, ledgers[0], threshold=1)
    payers = [await seller.open() for _ in range(2)]
    charged = [await seller.charge(p, 4_000 + i) for i, p in enumerate(payers)]
    # (a turn of a millisecond: it has run out once the claim is sent)
    claimer = seller.claimer(poll_seconds=0.001 if turn != "held" else 30.0)

    async def database_gone(*args: Any, **kwargs: Any) -> bool:
        raise OSError("the database is gone")
    monkeypatch.setattr(claimer, "_settle_claim", database_gone)
    with pytest.raises(OSError):
        await claimer.run_once()
    monkeypatch.undo()
    assert await seller.total_claimed(*payers) == charged  # it landed; the ledger does not know
    [open_claim] = await claims_of(ledgers[0])
    assert open_claim["state"] == ClaimState.SETTLING
    assert open_claim["lease_until"].replace(tzinfo=UTC) > datetime.now(UTC) + timedelta(seconds=60)

    if turn != "held":  # another replica holds the turn: it leaves the claim to its lease
        other = seller.claimer(store=seller.store_on(ledgers[1]), owner="replica-b")
        passed = await other.run_once()
        assert (passed.turn, passed.resolved, passed.claims) == (True, 0, 0)
        assert [c["state"] for c in await claims_of(ledgers[0])] == [ClaimState.SETTLING]
    tally = await claimer.run_once()

    assert (tally.resolved, tally.claims) == (1, 0)  # decided from the chain, not sent again
    assert seller.sent == ["claim", "settle"]  # (the sweep: by whichever replica passed first)
    [claim] = await claims_of(ledgers[0])
    assert (claim["state"], claim["lease_until"]) == (ClaimState.SETTLED, None)
    assert [seller.claimed_events(p.channel_id) for p in payers] == [[c] for c in charged]
    for payer, total in zip(payers, charged, strict=True):
        channel = await seller.store.get(payer.channel_id)
        assert channel is not None and channel.onchain.total_claimed == total


# ---- two replicas ----


async def test_two_claimers_never_claim_a_channel_twice(
        new_seller: Sellers, devnet: X402Chain, ledgers: list[Ledger]) -> None:
    seller = new_seller(devnet, ledgers[0], threshold=1)
    replicas = [seller.claimer(store=seller.store_on(ledger), owner=f"replica-{i}")
                for i, ledger in enumerate(ledgers)]
    first = [await seller.open() for _ in range(4)]
    charged = [await seller.charge(p, 1_500 + i) for i, p in enumerate(first)]

    tallies = await asyncio.gather(*(r.run_once() for r in replicas))
    assert sorted(t.turn for t in tallies) == [False, True]  # one replica's turn

    # Both passing at once (a turn that ran out mid-pass): the intent's lock leaves each channel
    # to one claim.
    second = [await seller.open() for _ in range(4)]
    charged += [await seller.charge(p, 2_500 + i) for i, p in enumerate(second)]
    tallies = await asyncio.gather(*(r.run_pass() for r in replicas))
    assert sum(t.channels_claimed for t in tallies) == 4

    payers = first + second
    assert [seller.claimed_events(p.channel_id) for p in payers] == [[c] for c in charged]
    claims = await claims_of(ledgers[0])
    assert [c["state"] for c in claims] == [ClaimState.SETTLED] * 2  # one per round
    rows = [cid for c in await replicas[0].claims(kind=ClaimKind.CLAIM) for cid in c["rows"]]
    assert sorted(rows) == sorted(p.channel_id for p in payers)  # each channel in one claim
    assert seller.sent.count("claim") == 2
    await replicas[1].run_pass()  # (a sweep, if the other's pass left one to do)
    assert seller.usdc(seller.receiver) == sum(charged)


# ---- a payer's withdrawal racing a claim (x402 #3464) ----


@SQLITE_ONLY
async def test_a_withdrawal_racing_a_claim_loses_the_operator_nothing(
        new_seller: Sellers, ledgers: list[Ledger]) -> None:
    """The payer starts withdrawing everything while its charges are unclaimed and not due (an
    hour's interval, a high threshold); the claimer sees the withdrawal, closes the channel to
    vouchers and claims at once; after the delay the payer gets only the unclaimed rest."""
    if anvil_missing():
        pytest.skip(anvil_missing())
    with x402_chain("anvil") as anvil:
        seller = new_seller(anvil, ledgers[0], threshold=10**9, interval=3_600)
        payer = await seller.open()
        total = await seller.charge(payer, 1_200, 3_400, 500)
        assert payer.account is not None
        config = to_contract_channel_config(SdkChannelConfig(
            payer.address, payer.address, seller.receiver, seller.authorizer.address,
            anvil.usdc, WITHDRAW_DELAY, "0x" + "00" * 32))
        seller.payer_tx(payer.account, "initiateWithdraw", config, DEPOSIT)

        tally = await seller.claimer().run_pass()

        assert (tally.claims, tally.claimed_atomic) == (1, total)
        channel = await seller.store.get(payer.channel_id)
        assert channel is not None and channel.state == ChannelState.CLOSING
        late = await seller.store.reserve(ChannelCall(
            NETWORK, PAYLOAD_TYPE_VOUCHER, payer.config,
            Voucher(payer.channel_id, total + 100, payer.signature(total + 100)), 100,
            anvil.usdc.lower(), seller.receiver.lower(), "token-count-508", "late"),
            owner="gateway", lease_seconds=30)
        assert isinstance(late, Refused) and late.refusal.reason == CHANNEL_CLOSING

        anvil.advance(WITHDRAW_DELAY)
        seller.payer_tx(payer.account, "finalizeWithdraw", config)
        assert seller.usdc(payer.address) == FUNDS - total
        assert seller.usdc(seller.receiver) == total
        assert await seller.total_claimed(payer) == [total]
