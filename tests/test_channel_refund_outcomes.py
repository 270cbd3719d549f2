"""A channel's cooperative refund (agent/pipeline/channel_refunds.py) when it does not simply go
through: what the payer is told (the HTTP answer the REST face renders of the outcome), and what
the chain and the ledger hold after.

1. The refund's send gets no answer within REFUND_SEND_TIMEOUT_SECONDS: 503 `refund_pending`,
   the channel held (closing, this replica's lease) and taking no voucher. If it landed (the
   chain stopped mining: its transaction waited in the pending block), the claimer's mirror ends
   the hold and the channel reopens with what is left. If it never left (the facilitator's key
   was busy sending until the refund's send window had closed), the payer's retry takes the
   lapsed hold over and goes through once, on the same refundNonce.
2. It landed, but the chain could not be read after it (the node went away): 200 with the
   receipt; the hold ends at the claimer's next mirror.
3. It landed, but the ledger was down at `end_refund`: 200 with the receipt; the same.
4. Nothing moved (the facilitator's signer refused to send: past its send window): 402 with the
   failed receipt, and the channel open again.

In process: the gateway over the SDK's in-process facilitator with the py-evm devnet's signer, the
channel store on a real ledger (a SQLite file, PostgreSQL), paywire's reads through the devnet's
JSON-RPC; the payer's deposit signed by the SDK's own client, its vouchers and refunds by the SDK's
signing functions. The waits are scaled down (the refund's send timeout, the signer's send window)
so that a timeout costs a second or two, not a minute. A fault starts at a failpoint of the refund
(`channel_refund_after_broadcast`), as tests/test_channel_claimer.py's crashes do."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import ExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from sqlalchemy import update
from x402 import x402Client
from x402.mechanisms.evm.batch_settlement.abi import BATCH_SETTLEMENT_ABI
from x402.mechanisms.evm.batch_settlement.authorizer_signer import LocalAuthorizerSigner
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme as ChannelClient
from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher
from x402.mechanisms.evm.batch_settlement.constants import BATCH_SETTLEMENT_ADDRESS, SCHEME_BATCH_SETTLEMENT
from x402.mechanisms.evm.batch_settlement.errors import ERR_CHANNEL_BUSY
from x402.mechanisms.evm.batch_settlement.types import ChannelConfig, RefundPayload, VoucherPayload
from x402.mechanisms.evm.batch_settlement.utils import compute_channel_id
from x402.mechanisms.evm.signers import EthAccountSigner, EthAccountSignerWithRPC
from x402.schemas import PaymentPayload

from agent.app import make_engine
from agent.edge.http_io import render
from agent.pipeline import channel_refunds
from agent.pipeline.channel_refunds import REFUND_PENDING
from agent.pipeline.gateway import Gateway
from agent.pipeline.outcomes import Delivered, Outcome, PaymentDemanded
from agent.pipeline.paid import ChannelServices
from agent.pipeline.requests import CallRequest, Payment
from payments import broadcast_trace, failpoints
from payments.chain_fees import ChainFees
from payments.chain_probe import HttpJsonRpc, InProcessRpc, JsonRpc
from payments.channels.claimer import ChannelClaimer
from payments.channels.requirements import ChannelTerms
from payments.channels.store import CHANNEL_CLOSING, REFUND_LEASE_SECONDS, Channel, ChannelStore
from payments.codec import decode_base64_any
from payments.devnet.evm import EvmDevnet
from payments.facilitators import in_process_facilitator
from payments.leases import SettlementPolicy
from payments.ledger import Ledger
from payments.ledger_schema import ChannelState, channels_table
from payments.networks import lookup_network
from payments.processor import PaymentProcessor, PayTo
from skills.registry import SkillRegistry
from skills.skill import Payload, Skill, SkillResult
from tests.pipeline.harness import ledger_down
from tests.support.jsonrpc_http import JsonRpcHttpServer
from tests.support.x402_devnet import X402Chain, new_key, x402_chain

EVM_NET = EvmDevnet.NETWORK
PAY_TO = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
PRICE = 10_000  # atomic USDC: the echo skill's fixed $0.01, what each call is charged
MIN_DEPOSIT = 100_000
FUNDS = 1_000_000
CALLS = 3  # the deposit's call and two vouchers: the running total before each refund
LEASE = int(REFUND_LEASE_SECONDS)


# ------------------------------------------------------------------------------- the replica


@pytest.fixture(scope="module")
def devnet_chain() -> Iterator[X402Chain]:
    with x402_chain("devnet") as chain:
        yield chain



async def _echo(payload: Payload) -> SkillResult:
    return SkillResult(body={"echo": payload})


@dataclass
class Replica:
    """One paywire process in process, assembled for channels as agent/app.py does: the gateway
    over the in-process facilitator (the devnet's signer), its ledger and channel store, and its
    claimer; `reads` are its reads of the chain, by network (a test may point them elsewhere)."""

    chain: X402Chain
    ledger: Ledger
    store: ChannelStore
    processor: PaymentProcessor
    gateway: Gateway
    reads: dict[str, JsonRpc]

    @property
    def owner(self) -> str:
        return self.gateway.services.policy.owner

    async def call(self, payment: Payment | None, body: dict[str, Any] | None = None) -> Outcome:
        """A request to the echo route (a refund: with no body, as the SDK's client sends it)."""
        return await self.gateway.call(CallRequest(
            skill_id="echo", payload=body, resource_url="https://paywire.test/echo",
            payment=payment))

    def claimer(self) -> ChannelClaimer:
        """The claimer as agent/app.py's `channel_claimer` builds it."""
        processor = self.processor
        assert processor.channel_authorizer is not None
        return ChannelClaimer(self.store, send=processor.settle_channel,
                              authorizer=processor.channel_authorizer, rpc_for=self.reads.get,
                              owner=self.owner, traced=processor.traces_broadcasts)

    async def channel(self, channel_id: str) -> Channel:
        channel = await self.store.get(channel_id)
        assert channel is not None
        return channel

    async def lapse_hold(self, channel_id: str) -> None:
        """The refund's hold has lapsed (its lease of REFUND_LEASE_SECONDS ran out)."""
        async with self.ledger.writing() as conn:
            await conn.execute(update(channels_table).where(channels_table.c.channel_id == channel_id)
                               .values(lease_until=datetime.now(UTC) - timedelta(seconds=1)))

    async def fees(self) -> dict[str, str]:
        """The registered chain fees: transaction -> kind."""
        return {row["tx_id"].lower(): row["kind"]
                for row in await ChainFees(self.ledger).rows(network=EVM_NET)}


@asynccontextmanager
async def replica_on(chain: X402Chain, url: str) -> AsyncIterator[Replica]:
    engine = make_engine(url)
    ledger = Ledger(engine)
    await ledger.create_tables()
    network = lookup_network(EVM_NET)
    facilitator = in_process_facilitator([network], evm_signer=chain.chain.facilitator_signer(),
                                         workers=4)
    terms = ChannelTerms(LocalAuthorizerSigner(Account.from_key(new_key())),
                         min_deposit_atomic=MIN_DEPOSIT)
    processor = PaymentProcessor(facilitator, [PayTo(network, PAY_TO, chain.usdc)], channels=terms)
    processor.start()
    store = ChannelStore(ledger, claim_threshold_atomic=10**6, claim_interval_seconds=300)
    reads: dict[str, JsonRpc] = {EVM_NET: InProcessRpc(chain.chain.rpc)}
    skill = Skill(id="echo", name="echo", description="echo", categories=("Test",), run=_echo,
                  price_usd=Decimal("0.01"))
    gateway = Gateway(SkillRegistry([skill]), processor, ledger,
                      policy=SettlementPolicy(owner=f"replica-{id(engine)}"),
                      channels=ChannelServices(store, reads.get))
    try:
        yield Replica(chain, ledger, store, processor, gateway, reads)
    finally:
        facilitator.close()
        ledger.close()
        await engine.dispose()


@pytest.fixture
async def replica(devnet_chain: X402Chain, ledger_url: str) -> AsyncIterator[Replica]:
    async with replica_on(devnet_chain, ledger_url) as made:
        yield made


# ---------------------------------------------------------------------------------- the payer


def payment_of(signed: PaymentPayload) -> Payment:
    payment = Payment.from_object(signed.model_dump(by_alias=True, exclude_none=True),
                                  "PAYMENT-SIGNATURE")
    assert payment.payload is not None, payment.problem
    return payment


@dataclass
class Opened:
    """A payer's channel to the replica, with `charged` its running total as the payer signs it."""

    account: LocalAccount
    channel_id: str
    config: ChannelConfig
    opening: PaymentPayload  # the deposit's payload: its `accepted` is the channel's requirement
    deposit: int
    charged: int

    def _paying(self, inner: dict[str, Any]) -> Payment:
        return payment_of(self.opening.model_copy(update={"payload": inner}))

    def voucher(self) -> Payment:
        """The next call's voucher: the running total plus the price."""
        payload = VoucherPayload()
        payload.channel_config = self.config
        payload.voucher = sign_voucher(EthAccountSigner(self.account), self.channel_id,
                                       self.charged + PRICE, EVM_NET)
        return self._paying(payload.to_dict())

    def refund(self, amount: int | None = None) -> Payment:
        """A refund of `amount` (None: all that is left), its voucher on the running total."""
        payload = RefundPayload()
        payload.channel_config = self.config
        payload.voucher = sign_voucher(EthAccountSigner(self.account), self.channel_id,
                                       self.charged, EVM_NET)
        payload.amount = None if amount is None else str(amount)
        return self._paying(payload.to_dict())


async def open_channel(r: Replica, tag: str) -> Opened:
    """A funded payer deposits through the SDK's client (its first call), then pays two calls by
    voucher: the channel holds the deposit, CALLS x PRICE of it charged."""
    account: LocalAccount = r.chain.funded(FUNDS)
    quoted = await r.call(None, {"text": "quote"})
    assert isinstance(quoted, PaymentDemanded), quoted
    [offer] = [o for o in quoted.required.accepts if o.scheme == SCHEME_BATCH_SETTLEMENT]
    scheme = ChannelClient(EthAccountSignerWithRPC(account, r.chain.rpc_url))
    client = x402Client().register(EVM_NET, scheme)
    opening = await client.create_payment_payload(
        quoted.required.model_copy(update={"accepts": [offer]}))
    assert isinstance(opening, PaymentPayload) and opening.payload["type"] == "deposit"
    config = scheme.build_channel_config(offer)
    first = await r.call(payment_of(opening), {"text": f"{tag}: call 0"})
    assert isinstance(first, Delivered) and first.receipt is not None, first
    deposit = int(first.receipt.amount)
    opened = Opened(account, compute_channel_id(config, EVM_NET).lower(), config, opening,
                    deposit, PRICE)
    for k in range(1, CALLS):
        await pay(r, opened, f"{tag}: call {k}")
    assert onchain(r.chain, opened.channel_id) == (deposit, 0, 0)  # vouchers: nothing on chain
    assert wallet(r.chain, opened) == FUNDS - deposit
    return opened


async def pay(r: Replica, opened: Opened, text: str) -> None:
    """A call paid by the channel's next voucher, delivered and charged its price."""
    paid = await r.call(opened.voucher(), {"text": text})
    assert isinstance(paid, Delivered), answer(paid).body
    opened.charged += PRICE


# -------------------------------------------------------------------- what the payer is told


@dataclass(frozen=True)
class Answer:
    """The HTTP answer the REST face renders of an outcome (agent/edge/http_io.py `render`)."""

    status: int
    headers: Mapping[str, str]
    body: dict[str, Any]

    @property
    def code(self) -> str:
        """The error's code: a 402's `reason`, else OpenAI's `error.code`."""
        if self.status == 402:
            return str(self.body["reason"])
        return str(self.body["error"]["code"])

    @property
    def retry_after(self) -> int | None:
        value = self.headers.get("retry-after")
        return None if value is None else int(value)

    @property
    def receipt(self) -> dict[str, Any] | None:
        value = self.headers.get("payment-response")
        return None if value is None else json.loads(decode_base64_any(value))


def answer(outcome: Outcome) -> Answer:
    response = render(outcome)
    return Answer(response.status_code, response.headers, json.loads(bytes(response.body)))


# ------------------------------------------------------------------------ the chain, the faults


def onchain(chain: X402Chain, channel_id: str) -> tuple[int, int, int]:
    """(balance, totalClaimed, refundNonce) of the channel, read from the contract."""
    contract = chain.w3.eth.contract(address=BATCH_SETTLEMENT_ADDRESS, abi=BATCH_SETTLEMENT_ABI)
    key = bytes.fromhex(channel_id[2:])
    balance, claimed = contract.functions.channels(key).call()
    return int(balance), int(claimed), int(contract.functions.refundNonce(key).call())


def wallet(chain: X402Chain, opened: Opened) -> int:
    return int(chain.chain.balance_of(opened.account.address))


def at_failpoint(monkeypatch: pytest.MonkeyPatch, point: str, fault: Callable[[], Any]) -> None:
    """`fault()` runs where the refund reaches failpoint `point` (where `kill -9` would stop the
    process in tests/faults/), and the refund goes on."""
    assert point in failpoints.POINTS
    real = failpoints.reached

    def reached(name: str) -> None:
        if name == point:
            fault()
        real(name)
    monkeypatch.setattr(failpoints, "reached", reached)


def assert_held(channel: Channel, owner: str) -> None:
    """The refund's hold: closing (no voucher), no call's reservation, this replica's lease."""
    assert (channel.state, channel.pending_row, channel.owner) == (ChannelState.CLOSING, None, owner)
    assert channel.lease_until is not None
    left = (channel.lease_until - datetime.now(UTC)).total_seconds()
    assert LEASE - 30 < left <= LEASE


def assert_reopened(channel: Channel, state: ChannelState, chain: tuple[int, int, int]) -> None:
    """The hold ended, the channel's mirror the chain's after the refund."""
    assert (channel.state, channel.owner, channel.lease_until) == (state, None, None)
    assert (channel.onchain.balance, channel.onchain.total_claimed,
            channel.onchain.refund_nonce) == chain


async def assert_no_voucher_meanwhile(r: Replica, opened: Opened, refund: Payment) -> None:
    """While the hold runs: a voucher is refused (the channel is closing), and the refund asked
    again is told to wait until the hold lapses."""
    voucher = answer(await r.call(opened.voucher(), {"text": "during the hold"}))
    assert (voucher.status, voucher.code) == (402, CHANNEL_CLOSING), voucher.body
    again = answer(await r.call(refund))
    assert (again.status, again.code) == (402, ERR_CHANNEL_BUSY), again.body
    assert again.retry_after is not None and LEASE - 30 < again.retry_after <= LEASE


# ------------------------------------------------------------- 1. no answer within the timeout


async def test_a_refund_with_no_answer_is_pending_and_the_mirror_reopens_the_channel_once_it_lands(
        replica: Replica, monkeypatch: pytest.MonkeyPatch) -> None:
    r = replica
    monkeypatch.setattr(channel_refunds, "REFUND_SEND_TIMEOUT_SECONDS", 2.0)
    opened = await open_channel(r, "landed late")
    cid, charged, deposit = opened.channel_id, opened.charged, opened.deposit
    amount = (deposit - charged) // 2  # a partial refund: the channel keeps the rest
    refund = opened.refund(amount)

    r.chain.chain.rpc("evm_setAutomine", [False])  # the chain stops mining: the refund waits
    try:
        pending = answer(await r.call(refund))
        assert (pending.status, pending.code) == (503, REFUND_PENDING), pending.body
        assert pending.retry_after is not None and LEASE - 30 < pending.retry_after <= LEASE
        receipt = pending.receipt
        assert receipt is not None and receipt["success"] is False
        tx = receipt["transaction"]  # sent: the transaction the payer can look for
        assert tx.startswith("0x") and len(tx) == 66
        assert onchain(r.chain, cid) == (deposit, 0, 0)
        assert_held(await r.channel(cid), r.owner)
        # (the busy refund's own mirror, before its hold, read the nonce unmoved: the hold stays)
        await assert_no_voucher_meanwhile(r, opened, refund)
        assert_held(await r.channel(cid), r.owner)
    finally:
        r.chain.chain.rpc("evm_setAutomine", [True])  # mines what waits

    mined = r.chain.w3.eth.get_transaction_receipt(tx)
    assert mined["status"] == 1 and mined["to"].lower() == BATCH_SETTLEMENT_ADDRESS.lower()
    after = (deposit - amount, charged, 1)  # the charges claimed, the amount refunded, once
    assert onchain(r.chain, cid) == after
    assert wallet(r.chain, opened) == FUNDS - deposit + amount
    assert_held(await r.channel(cid), r.owner)  # nobody read the chain since

    await r.claimer().run_pass()  # the claimer mirrors closing channels: the nonce moved
    assert_reopened(await r.channel(cid), ChannelState.OPEN, after)
    await pay(r, opened, "after the refund")  # vouchers again, on what is left
    assert (await r.channel(cid)).charged == charged + PRICE


async def test_a_refund_that_never_left_is_pending_then_the_payers_retry_goes_through_once(
        replica: Replica, monkeypatch: pytest.MonkeyPatch) -> None:
    r = replica
    # (scaled down, in production's order: send window 20 s < send timeout 60 s < lease 120 s)
    monkeypatch.setattr(channel_refunds, "REFUND_SEND_TIMEOUT_SECONDS", 2.0)
    monkeypatch.setattr(broadcast_trace, "SEND_WINDOW_SECONDS", 1.5)
    opened = await open_channel(r, "never left")
    cid, charged, deposit = opened.channel_id, opened.charged, opened.deposit
    refund = opened.refund()  # all that is left

    # Another settlement holds the facilitator key's send turn until the refund timed out: the
    # refund's send begins past its window, so it leaves nothing (SendWindowClosed).
    with r.chain.chain.facilitator_signer().send_lock.held():
        pending = answer(await r.call(refund))
    assert (pending.status, pending.code) == (503, REFUND_PENDING), pending.body
    assert pending.retry_after is not None and LEASE - 30 < pending.retry_after <= LEASE
    assert pending.receipt is not None and pending.receipt["transaction"] == ""  # none sent
    assert_held(await r.channel(cid), r.owner)
    await assert_no_voucher_meanwhile(r, opened, refund)
    # the claimer's pass: nothing landed, the hold stays; it claims the closing channel's charges
    tally = await r.claimer().run_pass()
    assert (tally.claims, tally.claimed_atomic) == (1, charged)
    assert onchain(r.chain, cid) == (deposit, charged, 0)
    assert_held(await r.channel(cid), r.owner)

    await r.lapse_hold(cid)
    retried = answer(await r.call(refund))  # the same payment, once the hold lapsed
    assert retried.status == 200, retried.body
    receipt = retried.receipt
    assert receipt is not None and receipt["success"] is True
    assert int(receipt["amount"]) == deposit - charged and receipt["transaction"].startswith("0x")
    assert retried.body == {"refunded": str(deposit - charged), "channel": cid,
                            "transaction": receipt["transaction"],
                            "channelState": receipt["extra"]["channelState"]}
    # once: the refundNonce moved by one (the retry signed the one the first attempt had signed)
    assert onchain(r.chain, cid) == (charged, charged, 1)
    assert wallet(r.chain, opened) == FUNDS - charged
    assert_reopened(await r.channel(cid), ChannelState.CLOSED, (charged, charged, 1))
    assert (await r.fees())[receipt["transaction"].lower()] == "channel_refund"


# ----------------------------------------------------- 2, 3. it landed, what follows failed


async def test_a_refund_that_landed_is_a_200_when_the_chain_cannot_be_read_after_it(
        replica: Replica, monkeypatch: pytest.MonkeyPatch) -> None:
    r = replica
    opened = await open_channel(r, "unread after")
    cid, charged, deposit = opened.channel_id, opened.charged, opened.deposit
    amount = (deposit - charged) // 4
    with JsonRpcHttpServer(r.chain.chain.rpc) as node:  # paywire's reads, over HTTP
        r.reads[EVM_NET] = over_http = HttpJsonRpc(node.url)
        try:
            # the node goes away once the refund was sent: the read after it fails (ProbeError)
            at_failpoint(monkeypatch, "channel_refund_after_broadcast", node.close)
            refunded = answer(await r.call(opened.refund(amount)))
        finally:
            await over_http.aclose()
    assert refunded.status == 200, refunded.body
    receipt = refunded.receipt
    assert receipt is not None and receipt["success"] is True
    assert int(receipt["amount"]) == amount and int(refunded.body["refunded"]) == amount
    tx = receipt["transaction"]
    # the channel as the refund leaves it (paywire could not read it)
    assert receipt["extra"]["channelState"] == {
        "channelId": cid, "balance": str(deposit - amount), "totalClaimed": str(charged),
        "withdrawRequestedAt": 0, "refundNonce": "1", "chargedCumulativeAmount": str(charged)}
    after = (deposit - amount, charged, 1)
    assert onchain(r.chain, cid) == after
    assert wallet(r.chain, opened) == FUNDS - deposit + amount
    assert (await r.fees())[tx.lower()] == "channel_refund"
    assert_held(await r.channel(cid), r.owner)  # not ended: the chain was not read

    r.reads[EVM_NET] = InProcessRpc(r.chain.chain.rpc)  # the node is back
    await r.claimer().run_pass()
    assert_reopened(await r.channel(cid), ChannelState.OPEN, after)
    await pay(r, opened, "after the refund")


async def test_a_refund_that_landed_is_a_200_when_the_ledger_is_down_at_its_end(
        replica: Replica, monkeypatch: pytest.MonkeyPatch) -> None:
    r = replica
    opened = await open_channel(r, "ledger down")
    cid, charged, deposit = opened.channel_id, opened.charged, opened.deposit
    amount = (deposit - charged) // 3
    with ExitStack() as outage:
        # the database stops once the refund was sent: `end_refund` fails (OperationalError)
        at_failpoint(monkeypatch, "channel_refund_after_broadcast",
                     lambda: outage.enter_context(ledger_down(r.ledger)))
        refunded = answer(await r.call(opened.refund(amount)))
    assert refunded.status == 200, refunded.body
    receipt = refunded.receipt
    assert receipt is not None and receipt["success"] is True and int(receipt["amount"]) == amount
    after = (deposit - amount, charged, 1)
    # the channel as paywire read it after the refund
    assert receipt["extra"]["channelState"]["balance"] == str(deposit - amount)
    assert receipt["extra"]["channelState"]["refundNonce"] == "1"
    assert onchain(r.chain, cid) == after
    assert wallet(r.chain, opened) == FUNDS - deposit + amount
    assert (await r.fees())[receipt["transaction"].lower()] == "channel_refund"  # (before it)
    assert_held(await r.channel(cid), r.owner)  # the end was not written

    await r.claimer().run_pass()
    assert_reopened(await r.channel(cid), ChannelState.OPEN, after)
    await pay(r, opened, "after the refund")


# ------------------------------------------------------------------------ 4. nothing moved


async def test_a_refund_refused_before_anything_was_sent_is_a_402_and_the_channel_opens_again(
        replica: Replica, monkeypatch: pytest.MonkeyPatch) -> None:
    r = replica
    opened = await open_channel(r, "refused")
    cid, charged, deposit = opened.channel_id, opened.charged, opened.deposit
    # the facilitator's signer refuses every send (as one that began past its window)
    window = broadcast_trace.SEND_WINDOW_SECONDS
    monkeypatch.setattr(broadcast_trace, "SEND_WINDOW_SECONDS", 0.0)
    refused = answer(await r.call(opened.refund()))
    assert refused.status == 402, refused.body
    receipt = refused.receipt
    assert receipt is not None and receipt["success"] is False and receipt["transaction"] == ""
    assert refused.code == receipt["errorReason"] and refused.code
    assert "PAYMENT-REQUIRED" in refused.headers and refused.retry_after is None
    assert onchain(r.chain, cid) == (deposit, 0, 0)
    assert wallet(r.chain, opened) == FUNDS - deposit
    assert_reopened(await r.channel(cid), ChannelState.OPEN, (deposit, 0, 0))
    assert await r.fees() == {}

    await pay(r, opened, "after the refused refund")  # open again: vouchers go on
    monkeypatch.setattr(broadcast_trace, "SEND_WINDOW_SECONDS", window)  # sends again
    retried = answer(await r.call(opened.refund()))
    assert retried.status == 200, retried.body
    assert retried.receipt is not None and int(retried.receipt["amount"]) == deposit - charged - PRICE
    assert onchain(r.chain, cid) == (charged + PRICE, charged + PRICE, 1)
