"""The settlement reconciler's chain probe (payments/chain_probe.py), against real chains.

Payments are signed by the x402 SDK's clients and settled by its facilitators; the probe reads
the ledger's `chain_ref` as `payments.processor.identify` writes it, and asks:
- the EVM devnet (py-evm), in process and over loopback HTTP, and an anvil node over HTTP;
- the Solana devnet (LiteSVM), in process and over loopback HTTP, on a clock the test moves
  (blockhash expiry without waiting).
A few rules no healthy chain shows on demand (a status seen at "processed" only, a history
longer than the search) are checked against a scripted RPC at the end.
"""

from __future__ import annotations

import base64
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from solders.hash import Hash
from solders.instruction import Instruction
from solders.keypair import Keypair
from solders.message import MessageV0, to_bytes_versioned
from solders.pubkey import Pubkey
from solders.token.associated import get_associated_token_address
from solders.transaction import VersionedTransaction
from x402 import x402Client, x402Facilitator
from x402.mechanisms.evm.constants import TRANSFER_WITH_AUTHORIZATION_VRS_ABI
from x402.mechanisms.evm.signer import FacilitatorEvmSigner
from x402.mechanisms.svm.exact import register_exact_svm_facilitator
from x402.mechanisms.svm.exact.client import ExactSvmScheme as ExactSvmClientScheme
from x402.mechanisms.svm.exact.server import ExactSvmScheme as ExactSvmServerScheme
from x402.mechanisms.svm.signers import KeypairSigner
from x402.schemas import PaymentPayload, PaymentRequired, PaymentRequirements

from payments.chain_probe import (
    CLOCK_SKEW_SECONDS,
    CannotMove,
    HttpJsonRpc,
    InProcessRpc,
    InvalidChainRef,
    JsonRpc,
    Moved,
    RpcError,
    RpcUnavailable,
    StillOpen,
    UnexpectedAnswer,
    probe,
    svm_message_hash,
)
from payments.devnet import jsonrpc
from payments.devnet.evm import EvmDevnet
from payments.devnet.solana import BLOCKHASH_LIFETIME_SLOTS, SLOT_SECONDS, TOKEN_PROGRAM, SolanaDevnet
from payments.processor import Matched, identify
from tests.support.evm_anvil import anvil_usdc  # noqa: F401  (fixture)
from tests.support.evm_x402 import EvmChain, new_facilitator, quote, sign_payment
from tests.support.jsonrpc_http import JsonRpcHttpServer

pytestmark = [
    # solana-py 0.39 deprecates its sync Client, which the SDK's SVM code uses.
    pytest.mark.filterwarnings("ignore:Client is deprecated"),
    pytest.mark.filterwarnings("ignore:TxOpts is deprecated"),
]

USDC = EvmDevnet.USDC_ADDRESS
EVM_PRICE = 10_000
EVM_FUNDS = 100_000
SOL_PRICE = 250_000
SOL_FUNDS = 1_000_000
MINT = Pubkey.from_string(SolanaDevnet.USDC_MINT)
TRANSPORTS = ["in_process", "http"]


@asynccontextmanager
async def connect(handler: jsonrpc.Rpc, transport: str) -> AsyncIterator[JsonRpc]:
    """The probe's view of a devnet chain: in process, or over HTTP on a loopback port."""
    if transport == "in_process":
        yield InProcessRpc(handler)
        return
    with JsonRpcHttpServer(handler) as server:
        async with HttpJsonRpc(server.url, timeout=10) as rpc:
            yield rpc


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def chain_ref(payload: PaymentPayload, requirements: PaymentRequirements,
              transaction_id: Callable[[VersionedTransaction], str | None] | None = None) -> dict[str, Any]:
    """The row's chain_ref, as the gateway writes it before settling."""
    return identify(Matched(payload, requirements, requirements), transaction_id).chain_ref


# ---------------------------------------------------------------------- EVM


@dataclass
class EvmTarget:
    """A chain holding DevUSDC, the SDK facilitator settling on it, and the probe's RPC."""

    name: str
    chain: EvmChain
    signer: FacilitatorEvmSigner  # the facilitator's: one nonce cursor for all its sends
    facilitator: x402Facilitator
    rpc: JsonRpc
    raw: Callable[[str, list[Any]], Any]  # mining control, outside the probe

    def funded_payer(self, amount: int = EVM_FUNDS) -> LocalAccount:
        payer: LocalAccount = Account.create()
        self.chain.mint(payer.address, amount)
        return payer

    def receipt(self, tx_hash: str, timeout: float = 10.0) -> dict[str, Any]:
        """The transaction's receipt once mined (anvil mines an automined one just after it
        answers eth_sendRawTransaction)."""
        deadline = time.monotonic() + timeout
        while (receipt := self.raw("eth_getTransactionReceipt", [tx_hash])) is None:
            assert time.monotonic() < deadline, f"{tx_hash} not mined in {timeout}s"
            time.sleep(0.005)
        return receipt

    def submit(self, payload: PaymentPayload, *, value: int | None = None) -> str:
        """Broadcast transferWithAuthorization (the value may be tampered); do not wait for it."""
        auth = payload.payload["authorization"]
        signature = bytes.fromhex(payload.payload["signature"].removeprefix("0x"))
        return self.signer.write_contract(
            USDC, TRANSFER_WITH_AUTHORIZATION_VRS_ABI, "transferWithAuthorization",
            auth["from"], auth["to"], int(auth["value"]) if value is None else value,
            int(auth["validAfter"]), int(auth["validBefore"]), bytes.fromhex(auth["nonce"][2:]),
            signature[64], signature[:32], signature[32:64],
        )


@pytest.fixture(scope="module")
def evm_devnet() -> EvmDevnet:
    return EvmDevnet(facilitator_key=Account.create().key.hex(), minter_key=Account.create().key.hex())


@pytest.fixture(params=["devnet-in_process", "devnet-http", "anvil-http"])
async def evm(request: pytest.FixtureRequest, evm_devnet: EvmDevnet) -> AsyncIterator[EvmTarget]:
    if request.param.startswith("devnet"):
        signer = evm_devnet.facilitator_signer()

        def raw(method: str, params: list[Any]) -> Any:
            answer = evm_devnet.rpc(method, params)
            assert "result" in answer, answer
            return answer["result"]

        async with connect(evm_devnet.rpc, request.param.partition("-")[2]) as rpc:
            yield EvmTarget("devnet", evm_devnet, signer, new_facilitator(signer), rpc, raw)
    else:
        anvil = request.getfixturevalue("anvil_usdc")
        signer = anvil.facilitator_signer()
        async with HttpJsonRpc(anvil.node.url, timeout=10) as rpc:
            yield EvmTarget("anvil", anvil, signer, new_facilitator(signer), rpc, anvil.node.rpc)


async def test_evm_settled_payment_is_moved(evm: EvmTarget) -> None:
    payer, pay_to = evm.funded_payer(), Account.create().address
    requirements = quote(USDC, pay_to, EVM_PRICE)
    payload = await sign_payment(payer, requirements)
    settled = await evm.facilitator.settle(payload, requirements)
    assert settled.success, settled
    assert [evm.chain.balance_of(payer.address), evm.chain.balance_of(pay_to)] == [
        EVM_FUNDS - EVM_PRICE, EVM_PRICE]
    ref = chain_ref(payload, requirements)

    # Through the given hash's receipt, through the token's AuthorizationUsed log without one,
    # and with the hash in chain_ref.
    assert await probe(ref, evm.rpc, tx_hash=settled.transaction) == Moved(settled.transaction)
    assert await probe(ref, evm.rpc) == Moved(settled.transaction)
    assert await probe({**ref, "tx_hash": settled.transaction}, evm.rpc) == Moved(settled.transaction)
    # A use older than the searched blocks (here: the head block only) is still a use.
    evm.raw("evm_mine", [])
    assert await probe(ref, evm.rpc, log_lookback_blocks=0) == Moved(None)


async def test_evm_unused_authorization_is_still_open(evm: EvmTarget) -> None:
    payer = evm.funded_payer()
    requirements = quote(USDC, Account.create().address, EVM_PRICE)
    payload = await sign_payment(payer, requirements)

    verdict = await probe(chain_ref(payload, requirements), evm.rpc)
    valid_before = payload.payload["authorization"]["validBefore"]
    assert isinstance(verdict, StillOpen)
    assert verdict.reason.startswith(f"authorization unused and valid until {valid_before} ")
    assert evm.chain.balance_of(payer.address) == EVM_FUNDS


async def test_evm_expired_unused_authorization_cannot_move(evm: EvmTarget) -> None:
    payer = evm.funded_payer()
    # The SDK client signs validBefore = now + maxTimeoutSeconds: a minute ago here.
    requirements = quote(USDC, Account.create().address, EVM_PRICE, max_timeout_seconds=-60)
    payload = await sign_payment(payer, requirements)
    assert int(payload.payload["authorization"]["validBefore"]) < time.time()

    verdict = await probe(chain_ref(payload, requirements), evm.rpc)
    assert isinstance(verdict, CannotMove)
    assert verdict.reason.startswith("authorization expired unused (validBefore ")


async def test_evm_reverted_transaction_leaves_the_authorization_open(evm: EvmTarget) -> None:
    payer, pay_to = evm.funded_payer(), Account.create().address
    requirements = quote(USDC, pay_to, EVM_PRICE)
    payload = await sign_payment(payer, requirements)
    ref = chain_ref(payload, requirements)

    # The value does not match the signature: mined, reverted, nothing used.
    reverted = evm.submit(payload, value=EVM_PRICE + 1)
    assert int(evm.receipt(reverted)["status"], 16) == 0
    verdict = await probe(ref, evm.rpc, tx_hash=reverted)
    assert isinstance(verdict, StillOpen)
    assert f"transaction {reverted} reverted, but the authorization is unused" in verdict.reason

    # Someone submits the authorization after all: the row's (reverted) hash is no proof, the
    # token's log is.
    settled = await evm.facilitator.settle(payload, requirements)
    assert settled.success, settled
    assert await probe(ref, evm.rpc, tx_hash=reverted) == Moved(settled.transaction)
    assert evm.chain.balance_of(pay_to) == EVM_PRICE


async def test_evm_transaction_waiting_to_be_mined(evm: EvmTarget) -> None:
    payer, pay_to = evm.funded_payer(), Account.create().address
    requirements = quote(USDC, pay_to, EVM_PRICE)
    payload = await sign_payment(payer, requirements)
    ref = chain_ref(payload, requirements)

    evm.raw("evm_setAutomine", [False])
    try:
        tx_hash = evm.submit(payload)
        waiting = await probe(ref, evm.rpc, tx_hash=tx_hash)
        assert isinstance(waiting, StillOpen)
        assert f"transaction {tx_hash} not mined" in waiting.reason
        assert isinstance(await probe(ref, evm.rpc), StillOpen)
        assert evm.chain.balance_of(pay_to) == 0

        evm.raw("evm_mine", [])
        assert await probe(ref, evm.rpc, tx_hash=tx_hash) == Moved(tx_hash)
        assert await probe(ref, evm.rpc) == Moved(tx_hash)
        assert evm.chain.balance_of(pay_to) == EVM_PRICE
    finally:
        evm.raw("evm_setAutomine", [True])


async def test_evm_canceled_authorization_cannot_move(evm: EvmTarget) -> None:
    """authorizationState is true for a cancelled nonce too: only the events tell them apart."""
    payer, pay_to = evm.funded_payer(), Account.create().address
    requirements = quote(USDC, pay_to, EVM_PRICE)
    payload = await sign_payment(payer, requirements)
    nonce = payload.payload["authorization"]["nonce"]
    cancel = Account.sign_typed_data(
        payer.key,
        domain_data={"name": "USDC", "version": "2", "chainId": EvmDevnet.CHAIN_ID,
                     "verifyingContract": USDC},
        message_types={"CancelAuthorization": [{"name": "authorizer", "type": "address"},
                                               {"name": "nonce", "type": "bytes32"}]},
        message_data={"authorizer": payer.address, "nonce": bytes.fromhex(nonce[2:])},
    )
    cancel_abi = [{
        "name": "cancelAuthorization", "type": "function", "stateMutability": "nonpayable",
        "outputs": [],
        "inputs": [{"name": "authorizer", "type": "address"}, {"name": "nonce", "type": "bytes32"},
                   {"name": "v", "type": "uint8"}, {"name": "r", "type": "bytes32"},
                   {"name": "s", "type": "bytes32"}],
    }]
    tx_hash = evm.signer.write_contract(USDC, cancel_abi, "cancelAuthorization", payer.address,
                                        bytes.fromhex(nonce[2:]), cancel.v,
                                        cancel.r.to_bytes(32, "big"), cancel.s.to_bytes(32, "big"))
    assert int(evm.receipt(tx_hash)["status"], 16) == 1

    verdict = await probe(chain_ref(payload, requirements), evm.rpc)
    assert verdict == CannotMove("authorization canceled by its signer before it was used")
    assert not (await evm.facilitator.settle(payload, requirements)).success
    assert evm.chain.balance_of(payer.address) == EVM_FUNDS


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_evm_authorization_expires_with_the_chain_clock(transport: str) -> None:
    clock = FakeClock(time.time())
    devnet = EvmDevnet(facilitator_key=Account.create().key.hex(),
                       minter_key=Account.create().key.hex(), clock=clock)
    payer: LocalAccount = Account.create()
    devnet.mint(payer.address, EVM_FUNDS)
    requirements = quote(USDC, Account.create().address, EVM_PRICE, max_timeout_seconds=300)
    payload = await sign_payment(payer, requirements)
    ref = chain_ref(payload, requirements)
    async with connect(devnet.rpc, transport) as rpc:
        assert isinstance(await probe(ref, rpc), StillOpen)
        clock.now = int(ref["valid_before"]) - 1  # the last second it may be used in
        assert isinstance(await probe(ref, rpc), StillOpen)
        # A block stamped exactly validBefore (the head is a second older, so none is due yet):
        # transferWithAuthorization needs block.timestamp < validBefore, in it and after it.
        clock.now = int(ref["valid_before"])
        assert "result" in devnet.rpc("evm_mine", [])
        verdict = await probe(ref, rpc)
    assert isinstance(verdict, CannotMove)
    assert verdict.reason.startswith(f"authorization expired unused (validBefore {ref['valid_before']}")


async def test_evm_authorization_expires_by_the_clock_on_a_chain_that_makes_no_block(
    evm_devnet: EvmDevnet,
) -> None:
    """No new block reaches validBefore on a quiet chain; the machine's clock, far enough past
    it that no plausible block time could still be earlier, settles it."""
    payer: LocalAccount = Account.create()
    evm_devnet.mint(payer.address, EVM_FUNDS)
    requirements = quote(USDC, Account.create().address, EVM_PRICE, max_timeout_seconds=300)
    ref = chain_ref(await sign_payment(payer, requirements), requirements)
    rpc = InProcessRpc(evm_devnet.rpc)
    valid_before = int(ref["valid_before"])
    assert isinstance(await probe(ref, rpc, now=valid_before + CLOCK_SKEW_SECONDS - 1), StillOpen)
    verdict = await probe(ref, rpc, now=valid_before + CLOCK_SKEW_SECONDS)
    assert isinstance(verdict, CannotMove) and "the clock is" in verdict.reason


async def test_evm_no_token_at_the_address_is_no_answer(evm_devnet: EvmDevnet) -> None:
    payer = Account.create()
    requirements = quote(USDC, Account.create().address, EVM_PRICE)
    ref = {**chain_ref(await sign_payment(payer, requirements), requirements),
           "token": Account.create().address}  # no code: eth_call answers "0x"
    with pytest.raises(UnexpectedAnswer, match="authorizationState"):
        await probe(ref, InProcessRpc(evm_devnet.rpc))


# ---------------------------------------------------------------------- Solana


class SolanaChain:
    """A Solana devnet on a hand-moved clock, its loopback RPC, the SDK facilitator on it."""

    def __init__(self, transport: str) -> None:
        self.clock = FakeClock(1_000.0)
        self.fee_payer = Keypair()
        self.devnet = SolanaDevnet(fee_payer=self.fee_payer, mint_authority=Keypair(), clock=self.clock)
        self.server = JsonRpcHttpServer(self.devnet.rpc).start()  # the SDK client reads over it
        self.signer = self.devnet.facilitator_signer()
        self.facilitator = x402Facilitator()
        register_exact_svm_facilitator(self.facilitator, self.signer, networks=SolanaDevnet.NETWORK)
        self.transport = transport

    def quote(self, pay_to: str) -> PaymentRequirements:
        kind = next(k for k in self.facilitator.get_supported().kinds
                    if k.network == SolanaDevnet.NETWORK and k.x402_version == 2)
        base = PaymentRequirements(scheme="exact", network=SolanaDevnet.NETWORK,
                                   asset=SolanaDevnet.USDC_MINT, amount=str(SOL_PRICE),
                                   pay_to=pay_to, max_timeout_seconds=60)
        return ExactSvmServerScheme().enhance_payment_requirements(base, kind, [])

    async def pay(self, payer: Keypair, requirements: PaymentRequirements) -> PaymentPayload:
        client = x402Client()
        client.register("solana:*", ExactSvmClientScheme(KeypairSigner(payer), rpc_url=self.server.url))
        payload = await client.create_payment_payload(PaymentRequired(accepts=[requirements]))
        assert isinstance(payload, PaymentPayload)
        return payload

    def funded_payer(self, amount: int = SOL_FUNDS) -> Keypair:
        payer = Keypair()
        self.devnet.mint_to(str(payer.pubkey()), amount)
        return payer

    def payee(self) -> str:
        address = str(Keypair().pubkey())
        self.devnet.mint_to(address, 0)  # its token account
        return address

    def sign_as_fee_payer(self, payload: PaymentPayload) -> str:
        """The complete transaction a facilitator would send (base64), not sent."""
        return self.signer.sign_transaction(payload.payload["transaction"], str(self.fee_payer.pubkey()),
                                            SolanaDevnet.NETWORK)

    def transaction_id(self, tx: VersionedTransaction) -> str:
        """What an in-process facilitator knows before sending: the fee payer's signature."""
        return str(self.fee_payer.sign_message(to_bytes_versioned(tx.message)))

    def expire_blockhashes(self) -> None:
        self.clock.now += (BLOCKHASH_LIFETIME_SLOTS + 2) * SLOT_SECONDS

    def balance(self, owner: Keypair | str) -> int:
        return self.devnet.token_balance(owner if isinstance(owner, str) else str(owner.pubkey()))

    def rpc(self) -> Any:
        return connect(self.devnet.rpc, self.transport)


@pytest.fixture(params=TRANSPORTS)
def sol(request: pytest.FixtureRequest) -> Iterator[SolanaChain]:
    chain = SolanaChain(request.param)
    yield chain
    chain.server.close()


async def test_svm_settled_payment_is_moved(sol: SolanaChain) -> None:
    payer, pay_to = sol.funded_payer(), sol.payee()
    requirements = sol.quote(pay_to)
    payload = await sol.pay(payer, requirements)
    with_id = chain_ref(payload, requirements, sol.transaction_id)
    without_id = chain_ref(payload, requirements)
    assert without_id["signature"] is None
    assert without_id["source_ata"] == str(get_associated_token_address(payer.pubkey(), MINT, TOKEN_PROGRAM))

    settled = await sol.facilitator.settle(payload, requirements)
    assert settled.success, settled.error_message
    assert settled.transaction == with_id["signature"]
    assert (sol.balance(payer), sol.balance(pay_to)) == (SOL_FUNDS - SOL_PRICE, SOL_PRICE)
    async with sol.rpc() as rpc:
        assert await probe(with_id, rpc) == Moved(settled.transaction)
        assert await probe(without_id, rpc, tx_hash=settled.transaction) == Moved(settled.transaction)
        # No id and a valid blockhash: it could still land (it has, but no search is conclusive yet).
        assert isinstance(await probe(without_id, rpc), StillOpen)

        sol.expire_blockhashes()
        # The status cache has forgotten it; the history has not.
        assert await probe(with_id, rpc) == Moved(settled.transaction)
        # The search: the payer's token account also holds the faucet's mint to it.
        assert await probe(without_id, rpc) == Moved(settled.transaction)


async def test_svm_landed_and_failed_cannot_move(sol: SolanaChain) -> None:
    payer, pay_to = sol.funded_payer(SOL_PRICE - 1), sol.payee()
    requirements = sol.quote(pay_to)
    payload = await sol.pay(payer, requirements)
    signed = sol.sign_as_fee_payer(payload)
    # Sent without preflight: it lands, pays its fee, and its transfer fails.
    answer = sol.devnet.rpc("sendTransaction", [signed, {"encoding": "base64", "skipPreflight": True}])
    signature = answer["result"]
    with_id = chain_ref(payload, requirements, sol.transaction_id)
    assert with_id["signature"] == signature
    failure = 'transaction landed and failed: {"InstructionError": [2, {"Custom": 1}]}'  # InsufficientFunds
    async with sol.rpc() as rpc:
        assert await probe(with_id, rpc) == CannotMove(failure)
        sol.expire_blockhashes()
        assert await probe(with_id, rpc) == CannotMove(failure)
        assert await probe(chain_ref(payload, requirements), rpc) == CannotMove(failure)
    assert (sol.balance(payer), sol.balance(pay_to)) == (SOL_PRICE - 1, 0)


async def test_svm_unsent_transaction_cannot_move_once_its_blockhash_expires(sol: SolanaChain) -> None:
    payer, pay_to = sol.funded_payer(), sol.payee()
    requirements = sol.quote(pay_to)
    payload = await sol.pay(payer, requirements)
    sol.sign_as_fee_payer(payload)  # signed, never sent
    with_id = chain_ref(payload, requirements, sol.transaction_id)
    without_id = chain_ref(payload, requirements)
    async with sol.rpc() as rpc:
        assert await probe(with_id, rpc) == StillOpen(
            "transaction not found; its blockhash is still valid, it may still land")
        assert await probe(without_id, rpc) == StillOpen(
            "transaction id unknown; its blockhash is still valid, it may still land")

        sol.expire_blockhashes()
        assert await probe(with_id, rpc) == CannotMove("blockhash expired, transaction never landed")
        assert await probe(without_id, rpc) == CannotMove(
            "blockhash expired and no transaction with this message landed")
    assert sol.balance(payer) == SOL_FUNDS


async def test_svm_message_hash_is_the_ledgers(sol: SolanaChain) -> None:
    requirements = sol.quote(sol.payee())
    payload = await sol.pay(sol.funded_payer(), requirements)
    identity = identify(Matched(payload, requirements, requirements))
    raw = base64.b64decode(payload.payload["transaction"])
    assert svm_message_hash(raw) == identity.key.nonce == identity.chain_ref["message_hash"]
    # The fee payer's signature does not change it (a replayer may fill that slot).
    assert svm_message_hash(base64.b64decode(sol.sign_as_fee_payer(payload))) == identity.key.nonce


async def test_svm_devnet_history_methods(sol: SolanaChain) -> None:
    """The devnet methods the probe needs, as Solana answers them."""
    owner = Keypair()
    first = sol.devnet.mint_to(str(owner.pubkey()), 5)
    second = sol.devnet.transfer(owner, str(Keypair().pubkey()), 2)
    rpc = sol.devnet.rpc
    listed = rpc("getSignaturesForAddress", [str(owner.pubkey())])["result"]
    assert [e["signature"] for e in listed] == [second, first]  # newest first
    assert listed[0]["err"] is None and listed[0]["confirmationStatus"] == "finalized"
    assert listed[0]["memo"].startswith("[") and "paywire devnet #" in listed[0]["memo"]
    assert rpc("getSignaturesForAddress", [str(owner.pubkey()), {"limit": 1}])["result"] == listed[:1]
    assert rpc("getSignaturesForAddress", [str(owner.pubkey()), {"before": second}])["result"] == listed[1:]
    assert rpc("getSignaturesForAddress", [str(owner.pubkey()), {"until": first}])["result"] == listed[:1]
    assert rpc("getSignaturesForAddress", [str(owner.pubkey()), {"limit": 1001}])["error"]["code"] == -32602

    # v0 transactions need maxSupportedTransactionVersion, as on Solana.
    assert rpc("getTransaction", [second, {"encoding": "base64"}])["error"]["code"] == -32015
    found = rpc("getTransaction", [second, {"encoding": "base64", "maxSupportedTransactionVersion": 0}])
    tx = VersionedTransaction.from_bytes(base64.b64decode(found["result"]["transaction"][0]))
    assert str(tx.signatures[0]) == second and found["result"]["version"] == 0
    assert found["result"]["meta"]["err"] is None and found["result"]["meta"]["fee"] == 10_000

    sol.expire_blockhashes()
    assert rpc("getSignatureStatuses", [[second]])["result"]["value"] == [None]  # the cache forgot it
    status = rpc("getSignatureStatuses", [[second], {"searchTransactionHistory": True}])["result"]["value"]
    assert status[0]["err"] is None and status[0]["confirmationStatus"] == "finalized"


# ---------------------------------------------------------------------- transports, refs


async def test_http_transport_errors_are_no_answer() -> None:
    devnet = SolanaDevnet(fee_payer=Keypair(), mint_authority=Keypair())
    with JsonRpcHttpServer(devnet.rpc) as server:
        async with HttpJsonRpc(server.url + "/secret-key-path", timeout=5) as rpc:
            assert "secret" not in repr(rpc)
            with pytest.raises(RpcError) as error:
                await rpc.call("noSuchMethod", [])
            assert error.value.code == jsonrpc.METHOD_NOT_FOUND
            assert await rpc.call("getHealth", []) == "ok"
    # A bound port nobody listens on refuses the connection.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        async with HttpJsonRpc(f"http://127.0.0.1:{closed.getsockname()[1]}/k", timeout=5) as rpc:
            with pytest.raises(RpcUnavailable, match="getHealth: ConnectError"):
                await rpc.call("getHealth", [])


async def test_malformed_refs_are_refused() -> None:
    unused = ScriptedRpc({})
    with pytest.raises(InvalidChainRef, match="kind"):
        await probe({"kind": "lightning"}, unused)
    evm = {"kind": "eip3009", "token": USDC, "from": "0x" + "11" * 20, "to": "0x" + "22" * 20,
           "value": "1", "valid_after": "0", "valid_before": "10", "nonce": "0x" + "ab" * 32}
    with pytest.raises(InvalidChainRef, match="nonce"):
        await probe({**evm, "nonce": "0x12"}, unused)
    with pytest.raises(InvalidChainRef, match="valid_before"):
        await probe({**evm, "valid_before": "-1"}, unused)
    with pytest.raises(InvalidChainRef, match="transaction hash"):
        await probe(evm, unused, tx_hash="0xabc")
    svm = _svm_ref(signature=str(Keypair().sign_message(b"a")))
    with pytest.raises(InvalidChainRef, match="not chain_ref's signature"):
        await probe(svm, unused, tx_hash=str(Keypair().sign_message(b"b")))
    with pytest.raises(InvalidChainRef, match="blockhash"):
        await probe({**svm, "blockhash": "not-base58!"}, unused)
    assert unused.calls == []


# ---------------------------------------------------------------------- scripted rules


class ScriptedRpc:
    """Answers by method from a script (a value, or a function of the params); records calls."""

    def __init__(self, script: dict[str, Any]) -> None:
        self.script = script
        self.calls: list[str] = []

    async def call(self, method: str, params: list[Any]) -> Any:
        self.calls.append(method)
        answer = self.script[method]
        return answer(params) if callable(answer) else answer


def _svm_ref(**fields: Any) -> dict[str, Any]:
    return {"kind": "svm", "message_hash": "ab" * 32, "signature": None,
            "blockhash": str(Keypair().pubkey()), "fee_payer": str(Keypair().pubkey()),
            "source_ata": str(Keypair().pubkey()), **fields}


async def test_a_status_seen_at_processed_only_is_still_open() -> None:
    signature = str(Keypair().sign_message(b"x"))
    rpc = ScriptedRpc({
        "isBlockhashValid": {"context": {"slot": 9}, "value": False},
        "getSignatureStatuses": {"context": {"slot": 9}, "value": [
            {"slot": 9, "confirmations": 0, "err": None, "status": {"Ok": None},
             "confirmationStatus": "processed"}]},
    })
    verdict = await probe(_svm_ref(signature=signature), rpc)
    assert verdict == StillOpen("transaction seen at processed commitment only; it may still be dropped")
    assert rpc.calls == ["isBlockhashValid", "getSignatureStatuses"]  # the blockhash first


async def test_a_history_longer_than_the_search_is_still_open() -> None:
    pages: list[dict[str, Any]] = []

    def signatures(params: list[Any]) -> list[dict[str, Any]]:
        pages.append(params[1])
        return [{"signature": str(Keypair().sign_message(bytes([i % 256, i // 256]))), "slot": 1,
                 "err": None} for i in range(1_000)]

    other = Keypair()
    noop = Instruction(Pubkey.default(), b"", [])
    message = MessageV0.try_compile(other.pubkey(), [noop], [], Hash.default())
    unrelated = base64.b64encode(bytes(VersionedTransaction(message, [other]))).decode()
    rpc = ScriptedRpc({
        "isBlockhashValid": {"context": {"slot": 9}, "value": False},
        "getSignaturesForAddress": signatures,
        "getTransaction": {"slot": 1, "transaction": [unrelated, "base64"], "meta": {"err": None}},
    })
    ref = _svm_ref()
    verdict = await probe(ref, rpc, max_history_pages=2)
    assert verdict == StillOpen(f"blockhash expired; the newest 2000 transactions of {ref['source_ata']} "
                                "hold none with this message, and its history goes further back")
    assert [p.get("before") is None for p in pages] == [True, False]
    assert rpc.calls.count("getTransaction") == 2_000
