"""Payers who never retry (issue 22): how soon a payment whose settlement was cut short is
resolved, when nobody comes back for it.

The pieces are the production ones, in process: `Gateway` over the SDK's in-process facilitator
with paywire's signer (`ResilientFacilitatorWeb3Signer`) on anvil, a real `Ledger` (a SQLite file,
and a PostgreSQL schema: each test runs on both), the send lock replicas share
(`send_lock_for`: a lock file beside SQLite, PostgreSQL's advisory lock) and the `Reconciler` with
`chain_asker`, wired to the facilitator's key as the assembly wires it (`Reconciler.know_sender`).
Two replicas share the database, the chain and one facilitator key: A is the one that dies, B the
one whose reconciler pass (or whose retrying client) finds the payment. A crash is a failpoint
(payments/failpoints.py) that raises `Crash` where `kill -9` would stop the process: nothing after
it runs, and A is not used again; its lease runs out because nobody renews it.

Time: the defaults are a 30 s lease and a 20 s send window + 10 s margin (a payment is provable
30 s after its last settlement attempt began: as its lease runs out). Here the same proportions on
a short scale (`LEASE`, `WINDOW`, `MARGIN`) for the test that waits on the clock; the others move a
row's clock back (`age`), as if the crash had happened that long ago.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
from eth_account import Account
from eth_utils import to_checksum_address
from sqlalchemy import event, update
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from x402.schemas import PaymentPayload

from agent.pipeline.gateway import Gateway
from agent.pipeline.outcomes import Delivered, Outcome, PaymentDemanded, Refused
from agent.pipeline.requests import CallRequest, Payment
from payments import broadcast_trace
from payments.broadcast_trace import BroadcastTrace, SendWindowClosed, Sent, current_trace
from payments.chain_probe import HttpJsonRpc, InProcessRpc, JsonRpc
from payments.devnet.evm import load_artifact
from payments.facilitators import in_process_facilitator
from payments.leases import SettlementPolicy
from payments.ledger import ClaimRequest, Ledger, sqlite_pragmas
from payments.ledger_schema import payments_table
from payments.networks import lookup_network
from payments.processor import Matched, PaymentProcessor, PayTo, identify
from payments.reconciler import EvmSender, Reconciler, Tally, chain_asker
from payments.send_lock import SendLock, send_lock_for
from payments.signers import ResilientFacilitatorWeb3Signer
from skills.registry import SkillRegistry
from skills.skill import Payload, Skill, SkillResult
from tests.support.crashes import Crash, crash_at
from tests.support.evm_anvil import AnvilNode, AnvilUsdc, anvil_missing, run_anvil
from tests.support.jsonrpc_http import JsonRpcHttpServer
from tests.support.paying import client_for

pytestmark = [
    pytest.mark.filterwarnings("ignore:Client is deprecated"),
    pytest.mark.filterwarnings("ignore:TxOpts is deprecated"),
]

EVM_NET = "eip155:84532"
PAY_TO = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
PRICE = 10_000  # atomic USDC: $0.01
LEASE = 2.0  # seconds; the default is 30
WINDOW, MARGIN = 1.5, 0.5  # the send window and the reconciler's margin; the defaults are 20, 10
RECEIPT_WAIT = 1.0  # the in-process facilitator's receipt wait (PAYWIRE_SETTLEMENT_RECEIPT_...)
ABI = load_artifact()["abi"]



def _key() -> str:
    return "0x" + bytes(Account.create().key).hex()


async def _echo(payload: Payload) -> SkillResult:
    return SkillResult(body={"echo": payload})


def _engine(url: str) -> AsyncEngine:
    """As agent/app.py's make_engine."""
    if url.startswith("sqlite"):
        engine = create_async_engine(url, connect_args={"timeout": 30})
        event.listen(engine.sync_engine, "connect", sqlite_pragmas)
        return engine
    return create_async_engine(url, pool_pre_ping=True)


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def chain() -> Iterator[AnvilUsdc]:
    missing = anvil_missing()
    if missing:  # never a skip: `npm ci` installs it
        raise RuntimeError(missing)
    with run_anvil() as node:
        yield AnvilUsdc(node, facilitator_key=_key(), minter_key=_key())



class CountingLock:
    """A send lock that says when someone asks for it, and counts who got it."""

    def __init__(self, inner: SendLock) -> None:
        self.inner = inner
        self.asked = threading.Event()
        self.held_times = 0

    @contextmanager
    def held(self) -> Iterator[None]:
        self.asked.set()
        with self.inner.held():
            self.held_times += 1
            yield


class RecordingRpc:
    """The reconciler's RPC, recording the methods it called."""

    def __init__(self, inner: JsonRpc) -> None:
        self.inner = inner
        self.calls: list[str] = []

    async def call(self, method: str, params: list[Any]) -> Any:
        self.calls.append(method)
        return await self.inner.call(method, params)


@dataclass
class Replica:
    """One paywire process, in process: its ledger, the in-process facilitator, the gateway and
    the reconciler, wired to the facilitator's key and send lock."""

    name: str
    engine: AsyncEngine
    ledger: Ledger
    signer: ResilientFacilitatorWeb3Signer
    facilitator: Any
    gateway: Gateway
    reconciler: Reconciler
    lock: CountingLock
    rpc: RecordingRpc
    http: HttpJsonRpc

    async def call(self, body: dict[str, Any], payment: Payment | None = None) -> Outcome:
        return await self.gateway.call(CallRequest(
            skill_id="echo", payload=body, resource_url="https://paywire.test/echo",
            payment=payment))

    async def close(self) -> None:
        self.facilitator.close()
        await self.http.aclose()
        self.ledger.close()
        await self.engine.dispose()


async def start_replica(name: str, url: str, node: AnvilNode, key: str, *,
                        send_url: str | None = None, early: bool = True,
                        receipt_wait: float = RECEIPT_WAIT) -> Replica:
    engine = _engine(url)
    ledger = Ledger(engine)
    await ledger.create_tables()
    network = lookup_network(EVM_NET)
    signer = ResilientFacilitatorWeb3Signer(private_key=key, rpc_url=send_url or node.url,
                                            confirmation_timeout_seconds=receipt_wait)
    facilitator = in_process_facilitator([network], evm_signer=signer, workers=4)
    loop = asyncio.get_running_loop()
    facilitator.share_sends(lambda lock_name: send_lock_for(engine, loop, lock_name))
    processor = PaymentProcessor(facilitator, [PayTo(network, PAY_TO)])
    processor.start()
    policy = SettlementPolicy(owner=f"{name}:{id(engine)}:test", lease_seconds=LEASE,
                              pending_retry_seconds=1)
    http = HttpJsonRpc(node.url, timeout=10)
    rpc = RecordingRpc(http)
    reconciler = Reconciler(ledger, chain_asker({EVM_NET: rpc}.get), policy, interval_seconds=0.1)
    reconciler.early_after_seconds = WINDOW + MARGIN
    lock = CountingLock(signer._lock())
    if early:  # an in-process facilitator: its key is ours (a remote one's is not)
        reconciler.know_sender(EVM_NET, EvmSender(signer.address, rpc, lock))
    skill = Skill(id="echo", name="echo", description="echo", categories=("Test",), run=_echo,
                  price_usd=Decimal("0.01"))
    gateway = Gateway(SkillRegistry([skill]), processor, ledger, policy=policy,
                      reconciler=reconciler)
    return Replica(name, engine, ledger, signer, facilitator, gateway, reconciler, lock, rpc, http)


@dataclass
class Signed:
    body: dict[str, Any]
    payment: Payment
    payer: str
    nonce: str
    valid_before: int
    signed_at: float = field(default_factory=time.time)


@dataclass
class World:
    chain: AnvilUsdc
    url: str
    key: str  # the facilitator key both replicas share
    replicas: list[Replica] = field(default_factory=list)

    @property
    def node(self) -> AnvilNode:
        return self.chain.node

    async def replica(self, name: str, **kwargs: Any) -> Replica:
        replica = await start_replica(name, self.url, self.node, self.key, **kwargs)
        self.replicas.append(replica)
        return replica

    async def sign(self, via: Replica, text: str) -> Signed:
        """A fresh payer, funded, signs the gateway's own quote for `{"text": text}`."""
        payer_key = _key()
        payer = Account.from_key(payer_key).address
        self.chain.mint(payer, 10 * PRICE)
        body = {"text": text}
        quote = await via.call(body)
        assert isinstance(quote, PaymentDemanded), quote
        signed = client_for("http://unused.invalid", evm_key=payer_key).create_payment_payload(
            quote.required)
        assert isinstance(signed, PaymentPayload)
        auth = signed.payload["authorization"]
        payment = Payment.from_object(signed.model_dump(by_alias=True, exclude_none=True),
                                      "PAYMENT-SIGNATURE")
        assert payment.payload is not None, payment.problem
        return Signed(body, payment, payer.lower(), str(auth["nonce"]).lower(),
                      int(auth["validBefore"]))

    def used(self, paid: Signed) -> bool:
        token = self.chain.w3.eth.contract(address=AnvilUsdc.USDC_ADDRESS, abi=ABI)
        return bool(token.functions.authorizationState(
            to_checksum_address(paid.payer), bytes.fromhex(paid.nonce[2:])).call())

    def merchant(self) -> int:
        return self.chain.balance_of(PAY_TO)

    def nonces(self) -> tuple[int, int]:
        """The facilitator key's (mined, pending) transaction counts."""
        address = Account.from_key(self.key).address
        mined = int(self.node.rpc("eth_getTransactionCount", [address, "latest"]), 16)
        return mined, int(self.node.rpc("eth_getTransactionCount", [address, "pending"]), 16)

    def pause_mining(self) -> None:
        self.node.rpc("evm_setAutomine", [False])

    def resume_mining(self) -> None:
        self.node.rpc("evm_mine", [])
        self.node.rpc("evm_setAutomine", [True])


@asynccontextmanager
async def world(chain: AnvilUsdc, url: str) -> AsyncIterator[World]:
    key = _key()
    chain.fund_gas(Account.from_key(key).address, 10**21)
    here = World(chain, url, key)
    try:
        yield here
    finally:
        here.resume_mining()
        for replica in here.replicas:
            await replica.close()




async def row_of(replica: Replica, paid: Signed) -> dict[str, Any]:
    [row] = [r for r in await replica.ledger.list(network=EVM_NET)
             if (r["payer"], r["nonce"]) == (paid.payer, paid.nonce)]
    return row


async def age(replica: Replica, row_id: str, seconds: float) -> None:
    """The row as if its last settlement attempt began `seconds` earlier and its replica stopped
    renewing its lease then: its lease ran out."""
    async with replica.engine.begin() as conn:
        row = (await conn.execute(payments_table.select().where(payments_table.c.id == row_id))
               ).mappings().one()
        began = row["updated_at"] if row["updated_at"].tzinfo else row["updated_at"].replace(
            tzinfo=UTC)
        await conn.execute(update(payments_table).where(payments_table.c.id == row_id).values(
            updated_at=began - timedelta(seconds=seconds),
            lease_until=datetime.now(UTC) - timedelta(seconds=1)))


async def wait_until(condition: Any, what: str, timeout: float = 30.0) -> None:
    """Poll an async condition with a deadline."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        await asyncio.sleep(0.05)  # polling with a deadline


def tallied(tally: Tally) -> tuple[int, int, int, int]:
    return tally.settled, tally.released, tally.still_open, tally.skipped


# ------------------------------------------------------------------- never broadcast: released


async def test_a_payment_never_broadcast_is_released_by_the_first_pass_after_its_lease(
    chain: AnvilUsdc, ledger_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dies right after writing the settlement intent (nothing sent). B's first reconciler
    pass after A's lease ran out proves nothing can move (the authorization unused, nothing of
    the facilitator's key in the pool, no settlement able to send any more) and releases it,
    minutes before the authorization expires. Today's rule waited for validBefore + 120 s."""
    monkeypatch.setattr(broadcast_trace, "SEND_WINDOW_SECONDS", WINDOW)
    async with world(chain, ledger_url) as w:
        a, b = await w.replica("a"), await w.replica("b")
        paid = await w.sign(a, "never broadcast")
        merchant = w.merchant()
        with crash_at("after_intent"), pytest.raises(Crash):
            await a.call(paid.body, paid.payment)
        crashed = time.monotonic()
        row = await row_of(b, paid)
        assert row["state"] == "settling" and row["chain_ref"]["kind"] == "eip3009"
        assert w.nonces()[0] == w.nonces()[1]  # nothing was sent

        async def lease_ran_out() -> bool:
            return (await b.ledger.expired()) != []

        await wait_until(lease_ran_out, "expired lease")
        tally = await b.reconciler.run_once()
        waited = time.monotonic() - crashed
        assert tallied(tally) == (0, 1, 0, 0)
        row = await row_of(b, paid)
        assert row["state"] == "released", row
        [event_row] = await b.ledger.events(row["id"])
        assert event_row["to_state"] == "released" and event_row["actor"] == b.reconciler.actor
        assert "nothing from the facilitator's key" in event_row["detail"]
        assert b.lock.held_times == 1  # proven under the key's send lock
        assert waited < LEASE + 1.5  # one pass after the lease ran out
        assert paid.valid_before - time.time() > 280  # well before the authorization expires
        assert not w.used(paid) and w.merchant() == merchant

        # The payer who does come back later is served with the same signed payment, charged once.
        again = await b.call(paid.body, paid.payment)
        assert isinstance(again, Delivered) and again.result.body == {"echo": paid.body}
        assert w.used(paid) and w.merchant() == merchant + PRICE
        assert (await row_of(b, paid))["state"] == "settled"


async def test_before_its_send_window_closed_a_payment_stays_pending(
    chain: AnvilUsdc, ledger_url: str,
) -> None:
    """The same crash, and a pass as soon as the lease ran out but before any settlement of the
    payment could have stopped sending (a lease shorter than the window and its margin): still
    pending, and the attempt's start is remembered (the pass's own write to the row does not move
    it), so a pass once the window and margin are over releases it."""
    async with world(chain, ledger_url) as w:
        a, b = await w.replica("a"), await w.replica("b")
        b.reconciler.early_after_seconds = 60.0
        paid = await w.sign(a, "young intent")
        with crash_at("after_intent"), pytest.raises(Crash):
            await a.call(paid.body, paid.payment)
        row = await row_of(b, paid)
        await age(b, row["id"], 30)  # the attempt began 30 s ago; 60 s must pass here
        assert tallied(await b.reconciler.run_once()) == (0, 0, 1, 0)
        row = await row_of(b, paid)
        assert row["state"] == "pending" and "may begin a send for 30 s more" in row["error"]
        assert b.lock.held_times == 0  # nothing asked under the lock before the window closed
        # 35 s later, as it were (the row is not touched: its clock is the attempt's):
        b.reconciler.early_after_seconds = 60.0 - 35.0
        assert tallied(await b.reconciler.run_once()) == (0, 1, 0, 0)
        assert (await row_of(b, paid))["state"] == "released" and not w.used(paid)


async def test_a_remote_facilitator_keeps_the_valid_before_rule(
    chain: AnvilUsdc, ledger_url: str,
) -> None:
    """Without the facilitator's key (a remote facilitator) nothing proves that its sends are all
    in sight: the payment stays pending until the authorization expires."""
    async with world(chain, ledger_url) as w:
        a, b = await w.replica("a"), await w.replica("b", early=False)
        paid = await w.sign(a, "remote facilitator")
        with crash_at("after_intent"), pytest.raises(Crash):
            await a.call(paid.body, paid.payment)
        row = await row_of(b, paid)
        await age(b, row["id"], 120)
        assert tallied(await b.reconciler.run_once()) == (0, 0, 1, 0)
        row = await row_of(b, paid)
        assert row["state"] == "pending"
        assert f"valid until {paid.valid_before}" in row["error"]


# ---------------------------------------------------------- something of ours may land: pending


async def test_a_transaction_of_ours_waiting_in_the_pool_keeps_it_pending(
    chain: AnvilUsdc, ledger_url: str,
) -> None:
    """A dies right after the node took its transaction (mining paused: it waits in the pool),
    before its id reached the ledger. B's pass sees the key's pending transaction and leaves the
    payment pending; the payer's retry is told `settlement_pending`; once mined, the pass records
    it settled and the payer gets the result A kept, charged once."""
    async with world(chain, ledger_url) as w:
        a, b = await w.replica("a"), await w.replica("b")
        paid = await w.sign(a, "waits in the pool")
        merchant = w.merchant()
        w.pause_mining()
        with crash_at("after_broadcast"), pytest.raises(Crash):
            await a.call(paid.body, paid.payment)
        mined, pending = w.nonces()
        assert pending == mined + 1
        row = await row_of(b, paid)
        assert row["state"] == "settling" and row["tx_hash"] is None
        await age(b, row["id"], 120)
        assert tallied(await b.reconciler.run_once()) == (0, 0, 1, 0)
        row = await row_of(b, paid)
        assert row["state"] == "pending"
        assert "wait in the node's pool" in row["error"] and f"reaches {pending}" in row["error"]

        # The payer comes back meanwhile: the first answer is "not known yet", never "free".
        retried = await b.call(paid.body, paid.payment)
        assert isinstance(retried, Refused), retried
        assert (retried.status, retried.code) == (503, "settlement_pending")
        assert (await row_of(b, paid))["state"] == "pending"

        w.resume_mining()
        assert w.used(paid)
        await age(b, row["id"], 0)
        assert tallied(await b.reconciler.run_once()) == (1, 0, 0, 0)
        row = await row_of(b, paid)
        assert row["state"] == "settled"
        again = await b.call(paid.body, paid.payment)
        assert isinstance(again, Delivered) and again.result.body == {"echo": paid.body}
        assert again.receipt is not None and again.receipt.transaction == row["tx_hash"]
        assert w.merchant() == merchant + PRICE


async def test_a_transaction_the_node_dropped_is_not_proof(
    chain: AnvilUsdc, ledger_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """The settlement's transaction was sent (its id is in the ledger) and the node dropped it:
    the key's pool is empty, but whoever holds the transaction could send it again while its nonce
    is free. Not provable: the payment stays pending (until validBefore)."""
    async with world(chain, ledger_url) as w:
        a, b = await w.replica("a"), await w.replica("b")
        paid = await w.sign(a, "dropped")
        w.pause_mining()
        first = await a.call(paid.body, paid.payment)
        assert isinstance(first, Refused) and first.code == "settlement_pending"
        row = await row_of(b, paid)
        assert row["state"] == "pending" and row["tx_hash"]
        w.node.rpc("anvil_dropTransaction", [row["tx_hash"]])
        mined, pending = w.nonces()
        assert mined == pending
        await age(b, row["id"], 120)
        with caplog.at_level("INFO", logger="payments.reconciler"):
            assert tallied(await b.reconciler.run_once()) == (0, 0, 1, 0)
        assert (await row_of(b, paid))["state"] == "pending"
        assert f"transaction {row['tx_hash']} of this settlement is unknown to the node" in caplog.text
        assert not w.used(paid)


async def test_a_send_in_progress_under_the_send_lock_is_waited_for(
    chain: AnvilUsdc, ledger_url: str,
) -> None:
    """A is alive but has lost its lease (it stopped renewing it) and is inside the send lock:
    its transaction is on its way to the node and not in the pool yet. B's pass waits for the
    lock before it reads the key's nonces, then sees the transaction and leaves the payment
    pending; A's payer gets the result once it is mined."""
    async with world(chain, ledger_url) as w:
        gate = RpcGate(w.node.url)
        try:
            a = await w.replica("a", send_url=gate.url, receipt_wait=30)
            b = await w.replica("b")
            paid = await w.sign(a, "mid-send")
            w.pause_mining()
            gate.hold("eth_sendRawTransaction")
            paying = asyncio.create_task(a.call(paid.body, paid.payment))
            assert await asyncio.to_thread(gate.held.wait, 30), "A's send did not start"

            async def noted() -> bool:  # A writes the transaction's id a second in
                return (await row_of(b, paid))["tx_hash"] is not None

            await wait_until(noted, "transaction id in the ledger")
            row = await row_of(b, paid)
            await age(b, row["id"], 120)
            passing = asyncio.create_task(b.reconciler.run_once())
            assert await asyncio.to_thread(b.lock.asked.wait, 30), "B never asked for the lock"
            assert not passing.done() and "eth_getTransactionCount" not in b.rpc.calls
            gate.release()  # A's send reaches the node, A gives the lock back
            assert tallied(await passing) == (0, 0, 1, 0)
            row = await row_of(b, paid)
            assert row["state"] == "pending" and "wait in the node's pool" in row["error"]
            w.resume_mining()
            outcome = await paying
            assert isinstance(outcome, Delivered), outcome
            assert (await row_of(b, paid))["state"] == "settled" and w.used(paid)
        finally:
            gate.close()


# --------------------------------------------------------------------- the authorization moved


async def test_an_authorization_already_used_is_settled(chain: AnvilUsdc, ledger_url: str) -> None:
    """A dies right after its transaction was mined: the pass finds the authorization used and
    records the settlement (the early proof never releases a used one); the payer's retry gets
    the result A kept, with A's transaction."""
    async with world(chain, ledger_url) as w:
        a, b = await w.replica("a"), await w.replica("b")
        paid = await w.sign(a, "moved")
        merchant = w.merchant()
        with crash_at("after_broadcast"), pytest.raises(Crash):
            await a.call(paid.body, paid.payment)
        assert w.used(paid)
        row = await row_of(b, paid)
        await age(b, row["id"], 120)
        assert tallied(await b.reconciler.run_once()) == (1, 0, 0, 0)
        row = await row_of(b, paid)
        assert row["state"] == "settled" and row["tx_hash"]
        again = await b.call(paid.body, paid.payment)
        assert isinstance(again, Delivered) and again.result.body == {"echo": paid.body}
        assert again.receipt is not None and again.receipt.transaction == row["tx_hash"]
        assert w.merchant() == merchant + PRICE


# -------------------------------------------------------------------------------- a busy key


async def test_on_a_busy_key_the_payment_is_released_once_what_waited_is_mined(
    chain: AnvilUsdc, ledger_url: str,
) -> None:
    """The key's pool is seldom empty when it settles many payments. The pass notes the key's
    pending count (under the lock) and leaves the payment pending; once the key's mined nonce
    reached it, with the authorization still unused, a later pass releases it without taking the
    lock again."""
    async with world(chain, ledger_url) as w:
        a, b = await w.replica("a"), await w.replica("b")
        paid = await w.sign(a, "busy key")
        with crash_at("after_intent"), pytest.raises(Crash):
            await a.call(paid.body, paid.payment)
        w.pause_mining()
        other = await asyncio.to_thread(b.signer.send_transaction, PAY_TO, b"")  # another send
        mined, pending = w.nonces()
        assert pending == mined + 1
        row = await row_of(b, paid)
        await age(b, row["id"], 120)
        assert tallied(await b.reconciler.run_once()) == (0, 0, 1, 0)
        assert f"reaches {pending}" in (await row_of(b, paid))["error"]
        assert b.lock.held_times == 1
        assert tallied(await b.reconciler.run_once()) == (0, 0, 1, 0)  # still waiting
        w.resume_mining()
        assert w.chain.w3.eth.get_transaction_receipt(other)["status"] == 1
        assert tallied(await b.reconciler.run_once()) == (0, 1, 0, 0)
        assert b.lock.held_times == 1  # the second step needs no lock
        row = await row_of(b, paid)
        assert row["state"] == "released" and not w.used(paid)
        [event_row] = await b.ledger.events(row["id"])
        assert f"reached nonce {pending}" in event_row["detail"]


# ------------------------------------------------------------------------------ the send window


async def test_a_settlement_past_its_send_window_sends_nothing(
    chain: AnvilUsdc, ledger_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the early proof stands on: a settlement that would begin a send later than its
    window after it began sends nothing (here the window is 0 s), so the payer is told nothing
    was charged, and the same payment works once the window allows it."""
    async with world(chain, ledger_url) as w:
        a = await w.replica("a")
        paid = await w.sign(a, "late send")
        monkeypatch.setattr(broadcast_trace, "SEND_WINDOW_SECONDS", 0.0)
        refused = await a.call(paid.body, paid.payment)
        assert isinstance(refused, PaymentDemanded), refused
        assert "nothing was charged" in (refused.message or "")
        assert (await row_of(a, paid))["state"] == "released"
        mined, pending = w.nonces()
        assert mined == pending and not w.used(paid)
        monkeypatch.undo()
        assert isinstance(await a.call(paid.body, paid.payment), Delivered)
        assert w.used(paid)


def test_the_trace_refuses_a_send_past_its_window() -> None:
    trace = BroadcastTrace(window=5.0)
    token = current_trace.set(trace)
    try:
        with broadcast_trace.broadcasting("0x01", RuntimeError):
            pass
        assert trace.sent is Sent.YES
        late = BroadcastTrace(began=time.monotonic() - 6.0, window=5.0)
        current_trace.set(late)
        with pytest.raises(SendWindowClosed), broadcast_trace.broadcasting("0x02", RuntimeError):
            raise AssertionError("the send must not begin")
        assert (late.sent, late.transaction) == (Sent.NO, None)
    finally:
        current_trace.reset(token)


# ------------------------------------------------------------------------------------ Solana


async def test_solana_has_no_earlier_point_than_the_blockhash(ledger_url: str) -> None:
    """A Solana settlement that was never sent: no RPC tells that nothing of it is in flight (a
    node forwards and retries a transaction until its blockhash expires), so the blockhash is the
    bound. The pass keeps it pending one slot before the blockhash expires and releases it one
    slot after (the devnet's blockhash lives 2,250 slots of 0.4 s, 900 s; Solana's 150 blocks,
    about 60-90 s)."""
    from payments.devnet.solana import BLOCKHASH_LIFETIME_SLOTS, SLOT_SECONDS, SolanaDevnet
    from tests.test_chain_probe import SolanaChain

    sol = SolanaChain("in_process")
    engine = _engine(ledger_url)
    ledger = Ledger(engine)
    try:
        await ledger.create_tables()
        payer, pay_to = sol.funded_payer(), sol.payee()
        requirements = sol.quote(pay_to)
        payload = await sol.pay(payer, requirements)
        identity = identify(Matched(payload, requirements, requirements), sol.transaction_id)
        signed_at = sol.clock.now
        claimed = await ledger.claim(ClaimRequest(
            key=identity.key, amount_atomic=int(requirements.amount), asset=requirements.asset,
            pay_to=pay_to, skill_id="echo", request_digest="d"), owner="dead", lease_seconds=1)
        row_id = claimed.row_id  # type: ignore[union-attr]
        assert await ledger.begin_settlement(row_id, owner="dead", chain_ref=identity.chain_ref,
                                             lease_seconds=1)
        reconciler = Reconciler(
            ledger, chain_asker({SolanaDevnet.NETWORK: InProcessRpc(sol.devnet.rpc)}.get),
            SettlementPolicy(owner="b:1:test", lease_seconds=LEASE))

        async def pass_at(seconds_after_signing: float) -> tuple[int, int, int, int]:
            sol.clock.now = signed_at + seconds_after_signing
            async with engine.begin() as conn:
                await conn.execute(update(payments_table).values(
                    lease_until=datetime.now(UTC) - timedelta(seconds=1)))
            return tallied(await reconciler.run_once())

        lifetime = BLOCKHASH_LIFETIME_SLOTS * SLOT_SECONDS
        assert await pass_at(LEASE) == (0, 0, 1, 0)
        assert await pass_at(lifetime - SLOT_SECONDS) == (0, 0, 1, 0)
        assert await pass_at(lifetime + 2 * SLOT_SECONDS) == (0, 1, 0, 0)
        [row] = await ledger.list(id=row_id)
        assert row["state"] == "released" and "blockhash expired" in row["error"]
        assert lifetime == 900.0
    finally:
        sol.server.close()
        ledger.close()
        await engine.dispose()


# ------------------------------------------------------------------------------------ helpers


class RpcGate:
    """A JSON-RPC pass-through to a node that holds every call of one method, before it reaches
    the node, until released."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._method: str | None = None
        self._open = threading.Event()
        self._open.set()
        self.held = threading.Event()
        self._http = httpx.Client(timeout=30)
        self._lock = threading.Lock()
        self._server = JsonRpcHttpServer(self._forward).start()
        self.url = self._server.url

    def _forward(self, method: str, params: list[Any]) -> dict[str, Any]:
        if method == self._method:
            self.held.set()
            self._open.wait(60)
        with self._lock:
            reply = self._http.post(self._target, json={
                "jsonrpc": "2.0", "id": 1, "method": method, "params": params}).json()
        return {"error": reply["error"]} if "error" in reply else {"result": reply.get("result")}

    def hold(self, method: str) -> None:
        self.held.clear()
        self._open.clear()
        self._method = method

    def release(self) -> None:
        self._method = None
        self._open.set()

    def close(self) -> None:
        self.release()
        self._server.close()
        self._http.close()
