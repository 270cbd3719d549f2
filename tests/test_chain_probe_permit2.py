"""The reconciler's chain probe for `upto` payments (payments/chain_probe.py, chain_ref kind
"permit2"), against real chains holding the real Permit2 and paywire's upto proxy.

Payments are signed by the x402 SDK's upto client and settled by its upto facilitator; the probe
reads the ledger's `chain_ref` as `payments.processor.identify` writes it, and asks the py-evm
devnet (in process and over loopback HTTP) and an anvil node (over HTTP). The payer's own
`invalidateUnorderedNonces` is sent to Permit2 as a wallet would. An RPC that lags or answers
garbage is a wrapper around the real one. Last, the reconciler on a SQLite ledger settles and
releases permit2 rows (early, with the in-process facilitator's key: see chain_probe's docstring).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from sqlalchemy import event, update
from sqlalchemy.ext.asyncio import create_async_engine
from web3 import Web3
from x402 import x402Client, x402Facilitator
from x402.extensions.eip2612_gas_sponsoring import declare_eip2612_gas_sponsoring_extension
from x402.mechanisms.evm.constants import PERMIT2_ADDRESS
from x402.mechanisms.evm.signers import EthAccountSigner, EthAccountSignerWithRPC
from x402.mechanisms.evm.upto import UptoEvmClientScheme, UptoEvmFacilitatorScheme
from x402.schemas import PaymentPayload, PaymentRequired, PaymentRequirements, SettleResponse

from payments.chain_probe import (
    CLOCK_SKEW_SECONDS,
    CannotMove,
    HttpJsonRpc,
    InProcessRpc,
    InvalidChainRef,
    JsonRpc,
    Moved,
    RpcError,
    StillOpen,
    UnexpectedAnswer,
    probe,
    probe_our_sends,
)
from payments.devnet.evm import EvmDevnet, load_artifact
from payments.devnet.x402_contracts import BUILD_PERMIT2, PERMIT2_ARTIFACT
from payments.leases import SettlementPolicy
from payments.ledger import Claimed, ClaimRequest, Ledger, sqlite_pragmas
from payments.ledger_schema import PaymentState, payments_table
from payments.processor import Matched, identify
from payments.reconciler import EvmSender, Reconciler, chain_asker
from payments.send_lock import ProcessSendLock
from tests.support.evm_anvil import anvil_missing
from tests.support.x402_devnet import X402Chain, new_key, x402_chain

NETWORK = EvmDevnet.NETWORK
MAX = 20_000  # the quoted maximum (atomic USDC)
USED = 1_858  # what the call cost
FUNDS = 100_000
TOKEN_ABI = load_artifact()["abi"]


def _permit2_abi() -> list[dict[str, Any]]:
    assert PERMIT2_ARTIFACT.is_file(), f"Permit2 is not built: run {BUILD_PERMIT2}"
    return json.loads(PERMIT2_ARTIFACT.read_text())["abi"]


PERMIT2_ABI = _permit2_abi()


class FakeClock:
    """A clock the test moves by hand (the py-evm devnet stamps blocks with it)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------------- chains


@pytest.fixture(scope="module")
def devnet_chain() -> Iterator[X402Chain]:
    with x402_chain("devnet") as chain:
        yield chain


@pytest.fixture(scope="module")
def anvil_chain() -> Iterator[X402Chain]:
    reason = anvil_missing()
    if reason:
        pytest.skip(reason)
    with x402_chain("anvil") as chain:
        yield chain


@dataclass
class Target:
    """A chain with Permit2 and the upto proxy, the SDK's upto facilitator on it, the probe's
    RPC, and the chain's own RPC for what the probe never does (mining)."""

    chain: X402Chain
    rpc: JsonRpc
    facilitator: x402Facilitator
    facilitator_address: str
    raw: Callable[[str, list[Any]], Any]

    def payer(self, *, approve: bool = True) -> LocalAccount:
        """A funded payer with gas, who approved Permit2 once (the specs' option A)."""
        payer = self.chain.funded(FUNDS, gas=True)
        if approve:
            token = self.chain.w3.eth.contract(address=self.chain.usdc, abi=TOKEN_ABI)
            self.chain.send(payer, self.chain.usdc,
                            token.encode_abi("approve", args=[PERMIT2_ADDRESS, 2**256 - 1]))
        return payer

    def quote(self, pay_to: str, *, facilitator: str | None = None) -> PaymentRequirements:
        return PaymentRequirements(
            scheme="upto", network=NETWORK, asset=self.chain.usdc, amount=str(MAX), pay_to=pay_to,
            max_timeout_seconds=300,
            extra={"name": "USDC", "version": "2", "assetTransferMethod": "permit2",
                   "facilitatorAddress": facilitator or self.facilitator_address})

    async def pay(self, payer: LocalAccount, quote: PaymentRequirements, *,
                  gasless: bool = False) -> PaymentPayload:
        """The SDK's upto client answers a 402 offering `quote` (gasless: with an EIP-2612 permit
        of Permit2, the payer having approved nothing)."""
        client = x402Client().register(
            NETWORK, UptoEvmClientScheme(EthAccountSignerWithRPC(payer, self.chain.rpc_url)))
        offer = PaymentRequired(accepts=[quote], extensions=(
            declare_eip2612_gas_sponsoring_extension() if gasless else None))
        payload = await client.create_payment_payload(offer)
        assert isinstance(payload, PaymentPayload)
        return payload

    async def settle(self, payload: PaymentPayload, quote: PaymentRequirements,
                     amount: int = USED) -> SettleResponse:
        return await self.facilitator.settle(payload, quote.model_copy(update={"amount": str(amount)}))

    def invalidate(self, owner: LocalAccount, nonce: int, *, bit: int | None = None) -> Any:
        """The owner's own Permit2 invalidateUnorderedNonces of the nonce's bit (or `bit`)."""
        mask = 1 << (nonce & 0xFF if bit is None else bit)
        data = _permit2().encode_abi("invalidateUnorderedNonces", args=[nonce >> 8, mask])
        return self.chain.send(owner, PERMIT2_ADDRESS, data)

    def head(self) -> int:
        return int(self.raw("eth_blockNumber", []), 16)


def _permit2() -> Any:
    return Web3().eth.contract(address=PERMIT2_ADDRESS, abi=PERMIT2_ABI)


def chain_ref(payload: PaymentPayload, quote: PaymentRequirements) -> dict[str, Any]:
    """The row's chain_ref, as the gateway writes it before settling."""
    return identify(Matched(payload, quote, quote)).chain_ref


def nonce_of(payload: PaymentPayload) -> int:
    return int(payload.payload["permit2Authorization"]["nonce"])


def deadline_of(payload: PaymentPayload) -> int:
    return int(payload.payload["permit2Authorization"]["deadline"])


def _answer(chain: X402Chain) -> Callable[[str, list[Any]], Any]:
    def raw(method: str, params: list[Any]) -> Any:
        answer = chain.rpc(method, params)
        assert "result" in answer, answer
        return answer["result"]

    return raw


@asynccontextmanager
async def on(chain: X402Chain, transport: str = "in_process") -> AsyncIterator[Target]:
    """The chain with the SDK's upto facilitator on it, probed in process (py-evm) or over
    loopback HTTP."""
    signer = chain.chain.facilitator_signer()
    facilitator = x402Facilitator().register([NETWORK], UptoEvmFacilitatorScheme(signer))
    address = signer.get_addresses()[0]
    if transport == "in_process":
        assert isinstance(chain.chain, EvmDevnet)
        yield Target(chain, InProcessRpc(chain.chain.rpc), facilitator, address, _answer(chain))
        return
    async with HttpJsonRpc(chain.rpc_url, timeout=10) as rpc:
        yield Target(chain, rpc, facilitator, address, _answer(chain))


@pytest.fixture(params=["devnet-in_process", "devnet-http", "anvil-http"])
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    name, _, transport = request.param.partition("-")
    async with on(request.getfixturevalue(f"{name}_chain"), transport) as target:
        yield target


# ---------------------------------------------------------------------- moved


async def test_a_settled_upto_payment_is_moved_with_its_transaction(target: Target) -> None:
    payer, pay_to = target.payer(), Account.create().address
    quote = target.quote(pay_to)
    first, second = await target.pay(payer, quote), await target.pay(payer, quote)
    settled = [await target.settle(first, quote, USED), await target.settle(second, quote, USED + 1)]
    assert [(s.success, s.amount) for s in settled] == [(True, str(USED)), (True, str(USED + 1))]
    assert target.chain.chain.balance_of(pay_to) == 2 * USED + 1
    for payload, done in zip((first, second), settled, strict=True):
        ref = chain_ref(payload, quote)
        # Through the row's hash, through its chain_ref's, and by the log search (two transfers
        # from this payer to this payee: the transaction that settled this very permit).
        assert await probe(ref, target.rpc, tx_hash=done.transaction) == Moved(done.transaction)
        assert await probe({**ref, "tx_hash": done.transaction}, target.rpc) == Moved(done.transaction)
        assert await probe(ref, target.rpc) == Moved(done.transaction)
    # A hash that is not this permit's settlement is no proof: the search finds the right one.
    assert await probe(chain_ref(first, quote), target.rpc,
                       tx_hash=settled[1].transaction) == Moved(settled[0].transaction)
    # A use older than the searched blocks (here: the head block only) is still a use.
    target.raw("evm_mine", [])
    assert await probe(chain_ref(first, quote), target.rpc, log_lookback_blocks=0) == Moved(None)


async def test_a_gasless_settlement_is_found_through_settle_with_permit(target: Target) -> None:
    """No approval: the facilitator calls the proxy's settleWithPermit (an EIP-2612 permit first,
    so the Permit2 permit sits further in the calldata)."""
    payer, pay_to = target.payer(approve=False), Account.create().address
    quote = target.quote(pay_to)
    payload = await target.pay(payer, quote, gasless=True)
    settled = await target.settle(payload, quote)
    assert settled.success, settled
    sent = target.raw("eth_getTransactionByHash", [settled.transaction])
    assert sent["input"].startswith("0x016c1748")  # settleWithPermit
    assert await probe(chain_ref(payload, quote), target.rpc) == Moved(settled.transaction)


# ---------------------------------------------------------------------- open, expired


async def test_an_unused_permit_is_still_open_until_the_clock_is_well_past_its_deadline(
    target: Target,
) -> None:
    payer = target.payer()
    quote = target.quote(Account.create().address)
    payload = await target.pay(payer, quote)
    ref, deadline = chain_ref(payload, quote), deadline_of(payload)

    verdict = await probe(ref, target.rpc)
    assert isinstance(verdict, StillOpen)
    assert verdict.reason.startswith(f"permit unused and valid through its deadline {deadline} (block ")
    # A quiet chain makes no block past the deadline: this machine's clock decides, once past
    # the deadline's last second by the skew (Permit2 takes a block stamped the deadline itself).
    assert isinstance(await probe(ref, target.rpc, now=deadline + CLOCK_SKEW_SECONDS), StillOpen)
    expired = await probe(ref, target.rpc, now=deadline + 1 + CLOCK_SKEW_SECONDS)
    assert isinstance(expired, CannotMove)
    assert expired.reason.startswith(f"permit expired unused (deadline {deadline}; the clock is ")
    assert target.chain.chain.balance_of(payer.address) == FUNDS


@pytest.mark.parametrize("name", ["devnet", "anvil"])
async def test_an_unused_permit_cannot_move_once_a_block_is_past_its_deadline(name: str) -> None:
    if name == "anvil" and anvil_missing():
        pytest.skip(anvil_missing())
    with x402_chain(name) as chain:
        async with on(chain, "in_process" if name == "devnet" else "http") as target:
            payer, pay_to = target.payer(), Account.create().address
            quote = target.quote(pay_to)
            payload = await target.pay(payer, quote)
            chain.advance(quote.max_timeout_seconds + 60)

            verdict = await probe(chain_ref(payload, quote), target.rpc)
            assert isinstance(verdict, CannotMove), verdict
            assert verdict.reason.startswith(
                f"permit expired unused (deadline {deadline_of(payload)}, block ")
            # The chain agrees: Permit2 refuses it now (the SDK's facilitator, on the wall clock,
            # still sends it).
            assert not (await target.settle(payload, quote)).success
            assert (chain.chain.balance_of(payer.address), chain.chain.balance_of(pay_to)) == (
                FUNDS, 0)


async def test_a_block_stamped_the_deadline_itself_may_still_take_the_permit() -> None:
    """Permit2 reverts only when block.timestamp > deadline (EIP-3009 wants < validBefore): the
    probe says `StillOpen` at a head stamped the deadline, and a settlement in a block stamped
    the deadline does move the money; one second later a permit is `CannotMove`."""
    clock = FakeClock(time.time())
    devnet = EvmDevnet(facilitator_key=new_key(), minter_key=new_key(), clock=clock)
    async with on(X402Chain("devnet", devnet, rpc_url="")) as target:
        await _deadline_boundary(target, clock)


async def _deadline_boundary(target: Target, clock: FakeClock) -> None:
    first, second = target.payer(), target.payer()
    quote = target.quote(Account.create().address)

    def sign(payer: LocalAccount) -> PaymentPayload:
        return PaymentPayload(x402_version=2, accepted=quote, payload=UptoEvmClientScheme(
            EthAccountSigner(payer)).create_payment_payload(quote))

    used, unused = sign(first), sign(second)
    assert deadline_of(unused) >= deadline_of(used)  # signed later
    clock.now = deadline_of(used)
    verdict = await probe(chain_ref(used, quote), target.rpc)  # the devnet seals a block now
    assert isinstance(verdict, StillOpen)
    assert verdict.reason.endswith(f"at {deadline_of(used)})")
    settled = await target.settle(used, quote)
    assert settled.success, settled
    receipt = target.raw("eth_getTransactionReceipt", [settled.transaction])
    block = target.raw("eth_getBlockByNumber", [receipt["blockNumber"], False])
    assert int(block["timestamp"], 16) == deadline_of(used)
    assert await probe(chain_ref(used, quote), target.rpc) == Moved(settled.transaction)

    clock.now = deadline_of(unused) + 1
    target.raw("evm_mine", [])  # a block one second past its deadline
    verdict = await probe(chain_ref(unused, quote), target.rpc)
    assert verdict == CannotMove(f"permit expired unused (deadline {deadline_of(unused)}, block "
                                 f"{target.head()} at {deadline_of(unused) + 1})")


# ---------------------------------------------------------------------- invalidated by its owner


async def test_a_nonce_its_owner_invalidated_cannot_move(target: Target) -> None:
    payer, pay_to = target.payer(), Account.create().address
    quote = target.quote(pay_to)
    payload = await target.pay(payer, quote)
    ref, nonce = chain_ref(payload, quote), nonce_of(payload)

    # Another bit of the same word: not this permit's.
    target.invalidate(payer, nonce, bit=(nonce + 1) & 0xFF)
    assert isinstance(await probe(ref, target.rpc), StillOpen)
    receipt = target.invalidate(payer, nonce)
    assert await probe(ref, target.rpc) == CannotMove(
        "permit nonce invalidated by its owner (Permit2 UnorderedNonceInvalidation, block "
        f"{receipt['blockNumber']}) before it was used")
    assert not (await target.settle(payload, quote)).success  # Permit2: InvalidNonce
    assert (target.chain.chain.balance_of(payer.address), target.chain.chain.balance_of(pay_to)) == (
        FUNDS, 0)


async def test_a_nonce_used_before_its_owner_invalidated_it_is_still_moved(target: Target) -> None:
    """invalidateUnorderedNonces succeeds on a spent bit too: the settlement decides."""
    payer, pay_to = target.payer(), Account.create().address
    quote = target.quote(pay_to)
    payload = await target.pay(payer, quote)
    ref = chain_ref(payload, quote)
    settled = await target.settle(payload, quote)
    assert settled.success, settled
    receipt = target.invalidate(payer, nonce_of(payload))

    assert await probe(ref, target.rpc) == Moved(settled.transaction)
    # The search reaches the invalidation but not the settlement: the bit was already spent the
    # block before the invalidation, so it is a use older than the search, not a cancellation.
    since = target.head() - receipt["blockNumber"]
    assert await probe(ref, target.rpc, log_lookback_blocks=since) == Moved(None)
    assert target.chain.chain.balance_of(pay_to) == USED


@pytest.mark.parametrize("transfer_first", [True, False],
                         ids=["transfer-then-invalidation", "invalidation-then-transfer"])
async def test_a_transfer_to_the_payee_ahead_of_the_invalidation_in_its_block_is_not_ruled_out(
    anvil_chain: X402Chain, transfer_first: bool,
) -> None:
    """In one block, a transfer from the payer to the payee that is not a call of the proxy, then
    the invalidation: the transfer could have been the use, so the probe does not say nothing
    moved. The other way round (the invalidation first), it does."""
    async with on(anvil_chain, "http") as target:
        payer, pay_to = target.payer(), Account.create().address
        quote = target.quote(pay_to)
        payload = await target.pay(payer, quote)
        token = anvil_chain.w3.eth.contract(address=anvil_chain.usdc, abi=TOKEN_ABI)
        transfer = (anvil_chain.usdc, token.encode_abi("transfer", args=[pay_to, 1]))
        nonce = nonce_of(payload)
        invalidate = (PERMIT2_ADDRESS, _permit2().encode_abi(
            "invalidateUnorderedNonces", args=[nonce >> 8, 1 << (nonce & 0xFF)]))
        mined = _in_one_block(anvil_chain, payer,
                              [transfer, invalidate] if transfer_first else [invalidate, transfer])
        cancelled = CannotMove("permit nonce invalidated by its owner (Permit2 "
                               f"UnorderedNonceInvalidation, block {mined}) before it was used")
        found = await probe(chain_ref(payload, quote), target.rpc)
        assert found == (Moved(None) if transfer_first else cancelled)


def _in_one_block(chain: X402Chain, account: LocalAccount, calls: list[tuple[str, Any]]) -> int:
    """Send the calls from `account` in this order, mined together in one block (anvil)."""
    w3, node = chain.w3, chain.chain.node  # type: ignore[union-attr]
    base_fee = int(w3.eth.get_block("latest")["baseFeePerGas"])
    nonce = w3.eth.get_transaction_count(account.address, "pending")
    node.rpc("evm_setAutomine", [False])
    try:
        hashes = [w3.eth.send_raw_transaction(account.sign_transaction({
            "to": to_checksum_address(to), "data": data, "gas": 200_000, "value": 0,
            "nonce": nonce + i, "chainId": EvmDevnet.CHAIN_ID,
            "maxFeePerGas": 2 * base_fee + 10**6, "maxPriorityFeePerGas": 10**6,
        }).raw_transaction) for i, (to, data) in enumerate(calls)]
        node.rpc("evm_mine", [])
    finally:
        node.rpc("evm_setAutomine", [True])
    receipts = [w3.eth.get_transaction_receipt(h) for h in hashes]
    assert [r["status"] for r in receipts] == [1] * len(calls)
    assert len({r["blockNumber"] for r in receipts}) == 1
    return int(receipts[0]["blockNumber"])


# ---------------------------------------------------------------------- what the probe refuses


class Rewriting:
    """The real RPC, with some answers replaced (a lagging node behind a load balancer, or a
    node answering garbage); records each call, and each answer the probe got."""

    def __init__(self, inner: JsonRpc, rewrite: Callable[[str, list[Any], Any], Any]) -> None:
        self.inner, self.rewrite = inner, rewrite
        self.calls: list[tuple[str, list[Any]]] = []
        self.answers: list[Any] = []

    async def call(self, method: str, params: list[Any]) -> Any:
        self.calls.append((method, params))
        answer = self.rewrite(method, params, await self.inner.call(method, params))
        self.answers.append(answer)
        return answer


def _head_ahead(method: str, params: list[Any], answer: Any) -> Any:
    """The head as a node 3 blocks ahead of the one answering the state read."""
    if method == "eth_getBlockByNumber" and params[0] == "latest":
        return {**answer, "number": hex(int(answer["number"], 16) + 3)}
    return answer


def _replace(method_: str, value: Any) -> Callable[[str, list[Any], Any], Any]:
    return lambda method, params, answer: value if method == method_ else answer


async def test_a_lagging_or_garbled_rpc_answer_is_no_verdict(devnet_chain: X402Chain) -> None:
    async with on(devnet_chain) as target:
        await _garbled(target)


async def _garbled(target: Target) -> None:
    payer = target.payer()
    quote = target.quote(Account.create().address)
    unused = await target.pay(payer, quote)
    used = await target.pay(payer, quote)
    assert (await target.settle(used, quote)).success

    # The state is read AT the head block another node reported: one that has not got it yet
    # answers an error, never the state of an older block.
    lagging = Rewriting(target.rpc, _head_ahead)
    with pytest.raises(RpcError):
        await probe(chain_ref(unused, quote), lagging)
    [_, (method, (call, block))] = lagging.calls
    assert (method, call["to"].lower(), block) == ("eth_call", PERMIT2_ADDRESS.lower(),
                                                   lagging.answers[0]["number"])
    cases: list[tuple[PaymentPayload, str, Any, str]] = [
        (unused, "eth_call", "0x", "nonceBitmap"),  # no Permit2 at its address
        (unused, "eth_call", "0x" + "00" * 31, "nonceBitmap"),
        (unused, "eth_getBlockByNumber", None, "eth_getBlockByNumber"),
        (used, "eth_getLogs", {"logs": []}, "eth_getLogs"),
        (used, "eth_getTransactionByHash", None, "eth_getTransactionByHash"),
    ]
    for payload, method, garbage, named in cases:
        with pytest.raises(UnexpectedAnswer, match=named):
            await probe(chain_ref(payload, quote), Rewriting(target.rpc, _replace(method, garbage)))


async def test_a_malformed_permit2_ref_is_refused_before_any_call(devnet_chain: X402Chain) -> None:
    calls = Rewriting(InProcessRpc(devnet_chain.chain.rpc), lambda m, p, a: a)
    ref = {"kind": "permit2", "token": devnet_chain.usdc, "owner": Account.create().address,
           "spender": Account.create().address, "to": Account.create().address,
           "facilitator": Account.create().address, "max": "20000", "nonce": "7",
           "deadline": "1700000000", "valid_after": "0"}
    for field, value, named in [("owner", "", "owner"), ("nonce", "0x07", "nonce"),
                                ("nonce", str(2**256), "nonce"), ("deadline", "-1", "deadline"),
                                ("max", None, "max"), ("facilitator", "0x12", "facilitator")]:
        with pytest.raises(InvalidChainRef, match=named):
            await probe({**ref, field: value}, calls)
    with pytest.raises(InvalidChainRef, match="transaction hash"):
        await probe(ref, calls, tx_hash="0xabc")
    assert calls.calls == []


# ---------------------------------------------------------------------- early, and the reconciler


async def test_only_our_key_can_settle_a_permit_naming_it(target: Target) -> None:
    """With nothing of the facilitator's key waiting, an unsent permit naming that key is proven
    unmoved (the proxy takes its settlement from no one else); one naming another account is
    not provable before its deadline."""
    payer, pay_to = target.payer(), Account.create().address
    ours = target.quote(pay_to)
    theirs = target.quote(pay_to, facilitator=Account.create().address)
    payload, elsewhere = await target.pay(payer, ours), await target.pay(payer, theirs)
    key = target.facilitator_address

    verdict = await probe_our_sends(chain_ref(payload, ours), target.rpc, key)
    assert isinstance(verdict, CannotMove), verdict
    assert verdict.reason.startswith("permit unused at block ")
    other = await probe_our_sends(chain_ref(elsewhere, theirs), target.rpc, key)
    assert isinstance(other, StillOpen)
    named = theirs.extra["facilitatorAddress"].lower()
    assert other.reason.startswith(f"the permit names facilitator {named}, not this key ")
    settled = await target.settle(payload, ours)
    assert await probe_our_sends(chain_ref(payload, ours), target.rpc, key) == Moved(settled.transaction)


async def test_the_reconciler_settles_and_releases_permit2_rows(devnet_chain: X402Chain,
                                                                tmp_path: Path) -> None:
    """A replica died mid-settlement of two upto payments: one whose settlement landed (the row
    pending, its transaction known), one that never sent (the row settling). One pass after
    their leases ran out settles the first and releases the second, well before its deadline."""
    async with on(devnet_chain) as target:
        await _dead_replica(target, tmp_path)


async def _dead_replica(target: Target, tmp_path: Path) -> None:
    rpc = target.rpc
    payer, pay_to = target.payer(), Account.create().address
    quote = target.quote(pay_to)
    landed, unsent = await target.pay(payer, quote), await target.pay(payer, quote)
    settled = await target.settle(landed, quote)
    assert settled.success, settled

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    event.listen(engine.sync_engine, "connect", sqlite_pragmas)
    ledger = Ledger(engine)
    try:
        await ledger.create_tables()
        dead = "dead-replica"
        rows = []
        for payload in (landed, unsent):
            identity = identify(Matched(payload, quote, quote))
            claimed = await ledger.claim(ClaimRequest(
                key=identity.key, amount_atomic=MAX, asset=quote.asset, pay_to=pay_to,
                skill_id="chat", request_digest="d"), owner=dead, lease_seconds=30)
            assert isinstance(claimed, Claimed)
            assert await ledger.begin_settlement(claimed.row_id, owner=dead,
                                                 chain_ref=identity.chain_ref, lease_seconds=30)
            rows.append(claimed.row_id)
        assert await ledger.mark_pending(rows[0], "receipt timeout", tx_hash=settled.transaction,
                                         retry_in_seconds=30)
        async with engine.begin() as conn:  # the replica stopped a minute ago
            await conn.execute(update(payments_table).where(payments_table.c.id.in_(rows)).values(
                updated_at=datetime.now(UTC) - timedelta(seconds=60),
                lease_until=datetime.now(UTC) - timedelta(seconds=1)))

        reconciler = Reconciler(ledger, chain_asker({NETWORK: rpc}.get),
                                SettlementPolicy(owner="survivor", lease_seconds=30))
        reconciler.know_sender(NETWORK, EvmSender(target.facilitator_address, rpc, ProcessSendLock()))
        tally = await reconciler.run_once()
        assert (tally.settled, tally.released, tally.still_open, tally.skipped) == (1, 1, 0, 0)
        first, second = [await ledger.get(row) for row in rows]
        assert (first["state"], first["tx_hash"]) == (PaymentState.SETTLED, settled.transaction)
        assert second["state"] == PaymentState.RELEASED
        assert deadline_of(unsent) > time.time() + 200  # released long before the deadline
        [released] = [e for e in await ledger.events(rows[1]) if e["to_state"] == PaymentState.RELEASED]
        assert released["detail"].startswith("nothing moved: permit unused at block ")
    finally:
        ledger.close()
        await engine.dispose()
