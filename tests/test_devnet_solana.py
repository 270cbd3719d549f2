"""The in-process Solana devnet, driven end to end by the real x402 SDK.

Client: the SDK's `ExactSvmScheme` client with a `KeypairSigner`, reading the mint and a recent
blockhash over JSON-RPC from the devnet (served on loopback). Facilitator: the SDK's
`x402Facilitator` with `register_exact_svm_facilitator`, once over the devnet's in-process signer
and once over the SDK's own `FacilitatorKeypairSigner` talking JSON-RPC (the production path).

What the SDK expects of the payee: its client builds exactly ComputeLimit, ComputePrice,
TransferChecked and Memo (no create-account instruction), and its verifier rejects any other
extra instruction, so the payTo's USDC token account must exist before anyone pays. Operators
create it once (here `mint_to(payee, 0)`, as `Devnet` does for the merchant); a payment to a
payee without one fails simulation.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from solana.rpc.api import Client
from solana.rpc.core import RPCException
from solders.keypair import Keypair
from solders.message import MessageV0, to_bytes_versioned
from solders.pubkey import Pubkey
from solders.signature import Signature
from solders.token.associated import get_associated_token_address
from solders.transaction import VersionedTransaction
from x402 import x402Client, x402Facilitator
from x402.extensions.sign_in_with_x.solana import decode_base58, encode_base58
from x402.mechanisms.svm import (
    ERR_AMOUNT_INSUFFICIENT,
    ERR_NETWORK_MISMATCH,
    ERR_RECIPIENT_MISMATCH,
    ERR_SIMULATION_FAILED,
    SOLANA_MAINNET_CAIP2,
)
from x402.mechanisms.svm.exact import register_exact_svm_client, register_exact_svm_facilitator
from x402.mechanisms.svm.exact.client import ExactSvmScheme as ExactSvmClientScheme
from x402.mechanisms.svm.exact.server import ExactSvmScheme as ExactSvmServerScheme
from x402.mechanisms.svm.signers import FacilitatorKeypairSigner, KeypairSigner
from x402.schemas import PaymentPayload, PaymentRequired, PaymentRequirements
from x402.schemas.v1 import PaymentPayloadV1, PaymentRequiredV1, PaymentRequirementsV1

from payments.devnet.solana import (
    BLOCKHASH_LIFETIME_SLOTS,
    MEMO_PROGRAM,
    SLOT_SECONDS,
    TOKEN_PROGRAM,
    SolanaDevnet,
)
from tests.support.jsonrpc_http import JsonRpcHttpServer
from tests.support.reports import report

# solana-py 0.39 deprecates its sync Client, which the SDK's SVM code uses.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Client is deprecated"),
    pytest.mark.filterwarnings("ignore:TxOpts is deprecated"),
]

PRICE = 250_000  # 0.25 USDC
FUNDS = 1_000_000


class FakeClock:
    """A monotonic clock the test moves by hand (blockhash expiry without sleeping)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Chain:
    """One devnet, its loopback RPC and the facilitator under test."""

    def __init__(self, mode: str, clock: FakeClock | None = None) -> None:
        self.fee_payer = Keypair()
        kwargs: dict[str, Any] = {"clock": clock} if clock else {}
        self.devnet = SolanaDevnet(fee_payer=self.fee_payer, mint_authority=Keypair(), **kwargs)
        self.server = JsonRpcHttpServer(self.devnet.rpc).start()
        self.rpc_url = self.server.url
        self.mode = mode
        self.facilitator = self.new_facilitator()

    def new_facilitator(self) -> x402Facilitator:
        if self.mode == "in_process":
            signer: Any = self.devnet.facilitator_signer()
        else:
            signer = FacilitatorKeypairSigner([self.fee_payer], rpc_url=self.rpc_url)
        facilitator = x402Facilitator()
        register_exact_svm_facilitator(facilitator, signer, networks=SolanaDevnet.NETWORK)
        return facilitator

    def quote(self, pay_to: str, amount: int = PRICE) -> PaymentRequirements:
        """Requirements as a resource server builds them, feePayer from the supported kinds."""
        kind = next(
            k
            for k in self.facilitator.get_supported().kinds
            if k.network == SolanaDevnet.NETWORK and k.x402_version == 2
        )
        base = PaymentRequirements(
            scheme="exact",
            network=SolanaDevnet.NETWORK,
            asset=SolanaDevnet.USDC_MINT,
            amount=str(amount),
            pay_to=pay_to,
            max_timeout_seconds=60,
        )
        return ExactSvmServerScheme().enhance_payment_requirements(base, kind, [])

    async def pay(self, signer: Any, requirements: PaymentRequirements) -> PaymentPayload:
        client = x402Client()
        client.register("solana:*", ExactSvmClientScheme(signer, rpc_url=self.rpc_url))
        payload = await client.create_payment_payload(PaymentRequired(accepts=[requirements]))
        assert isinstance(payload, PaymentPayload)
        return payload

    def funded_payer(self, amount: int = FUNDS) -> Keypair:
        payer = Keypair()
        self.devnet.mint_to(str(payer.pubkey()), amount)
        return payer

    def payee(self) -> str:
        address = str(Keypair().pubkey())
        self.devnet.mint_to(address, 0)  # creates the token account
        return address

    def balance(self, owner: Keypair | str) -> int:
        return self.devnet.token_balance(owner if isinstance(owner, str) else str(owner.pubkey()))

    def close(self) -> None:
        self.server.close()


@pytest.fixture(params=["in_process", "rpc"])
def chain(request: pytest.FixtureRequest) -> Iterator[Chain]:
    c = Chain(request.param)
    yield c
    c.close()


def _tx(payload: PaymentPayload) -> VersionedTransaction:
    return VersionedTransaction.from_bytes(base64.b64decode(payload.payload["transaction"]))


def _with_tx(payload: PaymentPayload, tx: VersionedTransaction) -> PaymentPayload:
    encoded = base64.b64encode(bytes(tx)).decode()
    return payload.model_copy(update={"payload": {"transaction": encoded}})


def _lamports(devnet: SolanaDevnet, owner: Keypair) -> int:
    return devnet.rpc("getBalance", [str(owner.pubkey())])["result"]["value"]


def _raw_rpc(url: str, method: str, params: list) -> dict:
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": method, "params": params})
    request = urllib.request.Request(url, body.encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return json.loads(response.read())


class ImpostorSigner:
    """Claims the payer's address but signs with another key."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.keypair = Keypair()

    def sign_transaction(self, tx: VersionedTransaction) -> VersionedTransaction:
        raise NotImplementedError  # the SDK client signs through .keypair


# ---------------------------------------------------------------------- settlement


async def test_settlement_moves_exactly_the_amount(chain: Chain) -> None:
    payer, pay_to = chain.funded_payer(), chain.payee()
    requirements = chain.quote(pay_to)
    assert requirements.extra["feePayer"] == str(chain.fee_payer.pubkey())
    payload = await chain.pay(KeypairSigner(payer), requirements)
    fee_sol_before = _lamports(chain.devnet, chain.fee_payer)

    verified = await chain.facilitator.verify(payload, requirements)
    assert verified.is_valid, verified.invalid_message
    assert verified.payer == str(payer.pubkey())
    assert chain.balance(payer) == FUNDS  # verify moves nothing

    settled = await chain.facilitator.settle(payload, requirements)
    assert settled.success, settled.error_message
    assert settled.network == SolanaDevnet.NETWORK
    assert (chain.balance(payer), chain.balance(pay_to)) == (FUNDS - PRICE, PRICE)

    # The facilitator paid the fee (two signatures plus the SDK's 1-microlamport priority fee).
    assert fee_sol_before - _lamports(chain.devnet, chain.fee_payer) == 10_001
    status = (
        Client(chain.rpc_url).get_signature_statuses([Signature.from_string(settled.transaction)]).value[0]
    )
    assert status is not None and status.err is None
    assert str(status.confirmation_status) == "TransactionConfirmationStatus.Finalized"


async def test_client_transaction_shape_and_payee_account(chain: Chain) -> None:
    """The SDK never creates the payee's token account: it must exist before payment."""
    payer = chain.funded_payer()
    pay_to = str(Keypair().pubkey())  # no token account yet
    requirements = chain.quote(pay_to)
    payload = await chain.pay(KeypairSigner(payer), requirements)

    message = _tx(payload).message
    keys = list(message.account_keys)
    programs = [str(keys[ix.program_id_index]) for ix in message.instructions]
    assert programs == [
        "ComputeBudget111111111111111111111111111111",
        "ComputeBudget111111111111111111111111111111",
        str(TOKEN_PROGRAM),
        str(MEMO_PROGRAM),
    ]
    assert keys[0] == chain.fee_payer.pubkey()  # the facilitator pays the fees

    rejected = await chain.facilitator.verify(payload, requirements)
    assert (rejected.is_valid, rejected.invalid_reason) == (False, ERR_SIMULATION_FAILED)

    chain.devnet.mint_to(pay_to, 0)  # creates the token account
    settled = await chain.facilitator.settle(payload, requirements)
    assert settled.success, settled.error_message
    assert chain.balance(pay_to) == PRICE


async def test_v1_payment_settles(chain: Chain) -> None:
    """Legacy v1 clients (network name `solana-devnet`) pay through the same facilitator."""
    payer, pay_to = chain.funded_payer(), chain.payee()
    requirements = PaymentRequirementsV1(
        scheme="exact",
        network=SolanaDevnet.V1_NETWORK,
        max_amount_required=str(PRICE),
        resource="http://127.0.0.1/resource",
        pay_to=pay_to,
        max_timeout_seconds=60,
        asset=SolanaDevnet.USDC_MINT,
        extra={"feePayer": str(chain.fee_payer.pubkey())},
    )
    client = register_exact_svm_client(x402Client(), KeypairSigner(payer), rpc_url=chain.rpc_url)
    payload = await client.create_payment_payload(PaymentRequiredV1(accepts=[requirements]))
    assert isinstance(payload, PaymentPayloadV1)
    assert (await chain.facilitator.verify(payload, requirements)).is_valid
    assert (await chain.facilitator.settle(payload, requirements)).success
    assert (chain.balance(payer), chain.balance(pay_to)) == (FUNDS - PRICE, PRICE)


# ---------------------------------------------------------------------- verify rejects


async def _expect_rejected(
    chain: Chain, payload: PaymentPayload, requirements: PaymentRequirements, reason: str
) -> str:
    verified = await chain.facilitator.verify(payload, requirements)
    assert (verified.is_valid, verified.invalid_reason) == (False, reason)
    settled = await chain.facilitator.settle(payload, requirements)
    assert (settled.success, settled.error_reason) == (False, reason)
    return verified.invalid_message or ""


async def test_rejects_requirements_asking_more_than_paid(chain: Chain) -> None:
    payer, pay_to = chain.funded_payer(), chain.payee()
    payload = await chain.pay(KeypairSigner(payer), chain.quote(pay_to))
    await _expect_rejected(chain, payload, chain.quote(pay_to, PRICE + 1), ERR_AMOUNT_INSUFFICIENT)
    assert chain.balance(payer) == FUNDS


async def test_rejects_amount_tampered_after_signing(chain: Chain) -> None:
    payer, pay_to = chain.funded_payer(), chain.payee()
    requirements = chain.quote(pay_to, 1)
    payload = await chain.pay(KeypairSigner(payer), requirements)
    tx = _tx(payload)
    raw = bytearray(bytes(tx))
    paid = (1).to_bytes(8, "little") + bytes([6])
    raw[raw.index(bytes([12]) + paid) + 1] = 0xFF  # TransferChecked amount 1 -> 255
    message = await _expect_rejected(
        chain,
        _with_tx(payload, VersionedTransaction.from_bytes(bytes(raw))),
        requirements,
        ERR_SIMULATION_FAILED,
    )
    assert "signature" in message.lower()
    assert chain.balance(payer) == FUNDS


async def test_rejects_wrong_pay_to(chain: Chain) -> None:
    payer = chain.funded_payer()
    payload = await chain.pay(KeypairSigner(payer), chain.quote(chain.payee()))
    await _expect_rejected(chain, payload, chain.quote(chain.payee()), ERR_RECIPIENT_MISMATCH)


async def test_rejects_wrong_network(chain: Chain) -> None:
    payer, pay_to = chain.funded_payer(), chain.payee()
    payload = await chain.pay(KeypairSigner(payer), chain.quote(pay_to))
    mainnet = chain.quote(pay_to).model_copy(update={"network": SOLANA_MAINNET_CAIP2})
    await _expect_rejected(chain, payload, mainnet, ERR_NETWORK_MISMATCH)


async def test_rejects_insufficient_balance(chain: Chain) -> None:
    payer, pay_to = chain.funded_payer(PRICE - 1), chain.payee()
    requirements = chain.quote(pay_to)
    payload = await chain.pay(KeypairSigner(payer), requirements)
    message = await _expect_rejected(chain, payload, requirements, ERR_SIMULATION_FAILED)
    assert "0x1" in message or "Custom" in message  # SPL Token InsufficientFunds
    assert chain.balance(payer) == PRICE - 1


async def test_rejects_transaction_not_signed_by_payer(chain: Chain) -> None:
    payer, pay_to = chain.funded_payer(), chain.payee()
    requirements = chain.quote(pay_to)
    forged = await chain.pay(ImpostorSigner(str(payer.pubkey())), requirements)
    message = await _expect_rejected(chain, forged, requirements, ERR_SIMULATION_FAILED)
    assert "signature" in message.lower()

    unsigned = _tx(await chain.pay(KeypairSigner(payer), requirements))
    blank = VersionedTransaction.populate(unsigned.message, [Signature.default()] * 2)
    await _expect_rejected(chain, _with_tx(forged, blank), requirements, ERR_SIMULATION_FAILED)
    assert chain.balance(payer) == FUNDS


# ---------------------------------------------------------------------- replays, races


async def test_settling_twice_fails_the_second_time(chain: Chain) -> None:
    payer, pay_to = chain.funded_payer(), chain.payee()
    requirements = chain.quote(pay_to)
    payload = await chain.pay(KeypairSigner(payer), requirements)
    first = await chain.facilitator.settle(payload, requirements)
    assert first.success, first.error_message

    again = await chain.facilitator.settle(payload, requirements)
    assert (again.success, again.error_reason) == (False, ERR_SIMULATION_FAILED)
    # A second facilitator (no shared duplicate cache) is refused by the chain itself.
    other = await chain.new_facilitator().settle(payload, requirements)
    assert (other.success, other.error_reason) == (False, ERR_SIMULATION_FAILED)
    verified = await chain.new_facilitator().verify(payload, requirements)
    assert "AlreadyProcessed" in (verified.invalid_message or "")
    assert (chain.balance(payer), chain.balance(pay_to)) == (FUNDS - PRICE, PRICE)


async def test_payer_drained_after_verify_fails_settlement(chain: Chain) -> None:
    payer, pay_to = chain.funded_payer(), chain.payee()
    requirements = chain.quote(pay_to)
    payload = await chain.pay(KeypairSigner(payer), requirements)
    assert (await chain.facilitator.verify(payload, requirements)).is_valid

    chain.devnet.transfer(payer, str(Keypair().pubkey()), FUNDS)
    settled = await chain.facilitator.settle(payload, requirements)
    assert (settled.success, settled.error_reason) == (False, ERR_SIMULATION_FAILED)
    assert (chain.balance(payer), chain.balance(pay_to)) == (0, 0)


async def test_replay_refused_even_after_many_transactions() -> None:
    """LiteSVM forgets old signatures; the devnet keeps them while the blockhash lives."""
    chain = Chain("rpc")
    try:
        payer, pay_to = chain.funded_payer(), chain.payee()
        requirements = chain.quote(pay_to)
        payload = await chain.pay(KeypairSigner(payer), requirements)
        signed = chain.devnet.facilitator_signer().sign_transaction(
            payload.payload["transaction"], str(chain.fee_payer.pubkey()), SolanaDevnet.NETWORK
        )
        rpc = Client(chain.rpc_url)
        rpc.send_raw_transaction(base64.b64decode(signed))
        for _ in range(100):  # LiteSVM's own signature history holds the last 32
            chain.devnet.airdrop(str(chain.fee_payer.pubkey()), 1)
        with pytest.raises(RPCException, match="already been processed"):
            rpc.send_raw_transaction(base64.b64decode(signed))
        assert (chain.balance(payer), chain.balance(pay_to)) == (FUNDS - PRICE, PRICE)
    finally:
        chain.close()


async def test_concurrent_settlements_from_threads(chain: Chain) -> None:
    pay_to = chain.payee()
    requirements = chain.quote(pay_to)
    payers = [chain.funded_payer(PRICE) for _ in range(8)]
    payloads = [await chain.pay(KeypairSigner(p), requirements) for p in payers]
    results: list[bool] = []
    lock = threading.Lock()

    def settle(payload: PaymentPayload) -> None:
        response = asyncio.run(chain.facilitator.settle(payload, requirements))
        with lock:
            results.append(response.success)

    threads = [threading.Thread(target=settle, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    # Meanwhile the chain also serves reads from this thread.
    for _ in range(20):
        chain.devnet.rpc("getLatestBlockhash", [])
        chain.devnet.token_balance(pay_to)
    for t in threads:
        t.join()
    assert results == [True] * len(payers)
    assert chain.balance(pay_to) == PRICE * len(payers)
    assert all(chain.balance(p) == 0 for p in payers)


# ---------------------------------------------------------------------- blockhash lifetime


async def test_blockhash_lives_its_window_then_expires() -> None:
    clock = FakeClock()
    chain = Chain("in_process", clock)
    try:
        payer, pay_to = chain.funded_payer(), chain.payee()
        requirements = chain.quote(pay_to)
        payload = await chain.pay(KeypairSigner(payer), requirements)
        blockhash = str(_tx(payload).message.recent_blockhash)
        rpc = Client(chain.rpc_url)
        assert _raw_rpc(chain.rpc_url, "isBlockhashValid", [blockhash])["result"]["value"]

        clock.now += BLOCKHASH_LIFETIME_SLOTS * SLOT_SECONDS  # the last valid slot
        assert (await chain.facilitator.verify(payload, requirements)).is_valid
        assert rpc.get_slot().value == BLOCKHASH_LIFETIME_SLOTS
        assert rpc.get_latest_blockhash().value.blockhash != blockhash

        clock.now += SLOT_SECONDS
        verified = await chain.facilitator.verify(payload, requirements)
        assert verified.invalid_reason == ERR_SIMULATION_FAILED
        assert "BlockhashNotFound" in (verified.invalid_message or "")
        assert not _raw_rpc(chain.rpc_url, "isBlockhashValid", [blockhash])["result"]["value"]
    finally:
        chain.close()


# ---------------------------------------------------------------------- the signer and the RPC


async def test_landed_failure_is_reported_as_failed() -> None:
    """A transaction that lands but fails (fee charged) shows its error, as on a cluster."""
    chain = Chain("rpc")
    try:
        payer, pay_to = chain.funded_payer(PRICE - 1), chain.payee()
        payload = await chain.pay(KeypairSigner(payer), chain.quote(pay_to))
        signer = chain.devnet.facilitator_signer()
        signed = signer.sign_transaction(
            payload.payload["transaction"], str(chain.fee_payer.pubkey()), SolanaDevnet.NETWORK
        )
        sig = FacilitatorKeypairSigner([chain.fee_payer], rpc_url=chain.rpc_url).send_transaction(
            signed, SolanaDevnet.NETWORK
        )  # skip_preflight: the node takes it and the chain runs it
        status = Client(chain.rpc_url).get_signature_statuses([Signature.from_string(sig)]).value[0]
        assert status is not None and status.err is not None
        with pytest.raises(RuntimeError, match="Transaction failed"):
            signer.confirm_transaction(sig, SolanaDevnet.NETWORK)
    finally:
        chain.close()


@pytest.mark.xfail(
    strict=True,
    raises=pytest.fail.Exception,
    reason="x402 2.25 FacilitatorKeypairSigner.confirm_transaction checks confirmationStatus "
    "before err, so a landed-but-failed transaction confirms as settled",
)
async def test_sdk_rpc_signer_confirms_a_failed_transaction() -> None:
    chain = Chain("rpc")
    try:
        payer, pay_to = chain.funded_payer(PRICE - 1), chain.payee()
        payload = await chain.pay(KeypairSigner(payer), chain.quote(pay_to))
        sdk_signer = FacilitatorKeypairSigner([chain.fee_payer], rpc_url=chain.rpc_url)
        signed = sdk_signer.sign_transaction(
            payload.payload["transaction"], str(chain.fee_payer.pubkey()), SolanaDevnet.NETWORK
        )
        sig = sdk_signer.send_transaction(signed, SolanaDevnet.NETWORK)
        with pytest.raises(RuntimeError):
            sdk_signer.confirm_transaction(sig, SolanaDevnet.NETWORK)
    finally:
        chain.close()


def test_signer_refuses_other_networks() -> None:
    fee_payer = Keypair()
    devnet = SolanaDevnet(fee_payer=fee_payer, mint_authority=Keypair())
    signer = devnet.facilitator_signer()
    assert signer.get_addresses() == [str(fee_payer.pubkey())]
    with pytest.raises(ValueError, match="only runs"):
        signer.simulate_transaction("", SOLANA_MAINNET_CAIP2)
    with pytest.raises(ValueError, match="only runs"):
        signer.send_transaction("", "solana")


def test_rpc_answers_solana_py_shapes() -> None:
    payer = Keypair()
    devnet = SolanaDevnet(fee_payer=Keypair(), mint_authority=Keypair())
    devnet.mint_to(str(payer.pubkey()), 1_500_000)
    with JsonRpcHttpServer(devnet.rpc) as server:
        rpc = Client(server.url)
        mint = Pubkey.from_string(SolanaDevnet.USDC_MINT)

        info = rpc.get_account_info(mint).value
        assert info is not None and info.owner == TOKEN_PROGRAM and len(info.data) == 82
        assert info.data[44] == 6  # where the SDK reads the decimals
        parsed = rpc.get_account_info_json_parsed(mint).value
        assert parsed is not None and parsed.data.parsed["info"]["supply"] == "1500000"
        assert rpc.get_account_info(Keypair().pubkey()).value is None
        many = rpc.get_multiple_accounts([mint, Keypair().pubkey()]).value
        assert many[0] is not None and many[1] is None

        ata = get_associated_token_address(payer.pubkey(), mint, TOKEN_PROGRAM)
        balance = rpc.get_token_account_balance(ata).value
        assert (balance.amount, balance.decimals, balance.ui_amount_string) == ("1500000", 6, "1.5")
        assert rpc.get_token_supply(mint).value.amount == "1500000"
        assert rpc.get_minimum_balance_for_rent_exemption(165).value == 2_039_280

        latest = rpc.get_latest_blockhash().value
        assert latest.last_valid_block_height == rpc.get_block_height().value + BLOCKHASH_LIFETIME_SLOTS
        valid = _raw_rpc(server.url, "isBlockhashValid", [str(latest.blockhash)])
        assert valid["result"]["value"] is True
        assert rpc.get_slot().value >= 0
        assert rpc.is_connected()
        assert rpc.get_version().value.solana_core
        assert str(rpc.get_genesis_hash().value).startswith(SolanaDevnet.NETWORK.split(":")[1])
        assert rpc.get_epoch_info().value.slots_in_epoch == 432_000

        someone = Keypair().pubkey()
        airdrop = rpc.request_airdrop(someone, 5_000_000).value
        assert rpc.get_balance(someone).value == 5_000_000
        statuses = rpc.get_signature_statuses([airdrop, Signature.default()]).value
        assert statuses[0] is not None and statuses[0].err is None and statuses[1] is None

        # A plain SOL transfer through simulate and send, as any wallet would do it.
        from solders.system_program import TransferParams, transfer

        sender = Keypair()
        rpc.request_airdrop(sender.pubkey(), 1_000_000)
        message = MessageV0.try_compile(
            sender.pubkey(),
            [transfer(TransferParams(from_pubkey=sender.pubkey(), to_pubkey=someone, lamports=7))],
            [],
            latest.blockhash,
        )
        tx = VersionedTransaction(message, [sender])
        sim = rpc.simulate_transaction(tx, sig_verify=True).value
        assert sim.err is None and sim.units_consumed and sim.logs
        sig = rpc.send_transaction(tx).value
        assert rpc.get_signature_statuses([sig]).value[0] is not None
        assert rpc.get_balance(someone).value == 5_000_007
        with pytest.raises(RPCException, match="already been processed"):
            rpc.send_transaction(tx)
        bad = VersionedTransaction.populate(message, [Keypair().sign_message(to_bytes_versioned(message))])
        with pytest.raises(RPCException, match="SignatureVerificationFailure"):
            rpc.send_raw_transaction(bytes(bad))

        assert _raw_rpc(server.url, "getFoo", [])["error"]["code"] == -32601
        assert _raw_rpc(server.url, "getFoo", [])["id"] == 7
        assert _raw_rpc(server.url, "getBalance", ["not-an-address"])["error"]["code"] == -32602
        account = _raw_rpc(server.url, "getAccountInfo", [SolanaDevnet.USDC_MINT, {"encoding": "base64"}])
        assert set(account["result"]) == {"context", "value"}
        assert set(account["result"]["value"]) == {
            "data",
            "executable",
            "lamports",
            "owner",
            "rentEpoch",
            "space",
        }
        assert account["result"]["value"]["data"][1] == "base64"


def test_base58_account_data_and_transactions() -> None:
    """Solana's legacy encodings: account data as base58 ("binary" unwrapped), base58 transactions."""
    devnet = SolanaDevnet(fee_payer=Keypair(), mint_authority=Keypair())
    mint = SolanaDevnet.USDC_MINT

    def data(config: dict[str, Any]) -> Any:
        return devnet.rpc("getAccountInfo", [mint, config])["result"]["value"]["data"]

    raw = base64.b64decode(data({"encoding": "base64"})[0])
    assert len(raw) == 82
    encoded, encoding = data({"encoding": "base58"})
    assert encoding == "base58" and decode_base58(encoded) == raw
    assert data({"encoding": "binary"}) == encoded
    # A mint without a freeze authority ends in 36 zero bytes: one "1" each.
    assert data({"encoding": "base58", "dataSlice": {"offset": 46, "length": 36}}) == ["1" * 36, "base58"]
    assert data({"encoding": "base58", "dataSlice": {"offset": 0, "length": 0}}) == ["", "base58"]

    sender, someone = Keypair(), Keypair().pubkey()
    devnet.airdrop(str(sender.pubkey()), 1_000_000)
    blockhash = devnet.rpc("getLatestBlockhash", [])["result"]["value"]["blockhash"]
    from solders.hash import Hash
    from solders.system_program import TransferParams, transfer

    message = MessageV0.try_compile(
        sender.pubkey(),
        [transfer(TransferParams(from_pubkey=sender.pubkey(), to_pubkey=someone, lamports=9))],
        [],
        Hash.from_string(blockhash),
    )
    tx = VersionedTransaction(message, [sender])
    sent = devnet.rpc("sendTransaction", [encode_base58(bytes(tx))])  # base58: Solana's default
    assert sent == {"result": str(tx.signatures[0])}
    assert devnet.rpc("getBalance", [str(someone)])["result"]["value"] == 9
    garbled = devnet.rpc("sendTransaction", [encode_base58(bytes(tx)) + "0"])["error"]  # 0 is not base58
    assert garbled["code"] == -32602


async def test_timings_are_recorded() -> None:
    """Not a speed assertion: one warm verify and one settle per path, kept for the record in
    test-artifacts/devnet-solana-timings.txt (tests/support/reports.py)."""
    for mode in ("in_process", "rpc"):
        chain = Chain(mode)
        try:
            pay_to = chain.payee()
            requirements = chain.quote(pay_to)
            warm = await chain.pay(KeypairSigner(chain.funded_payer()), requirements)
            assert (await chain.facilitator.settle(warm, requirements)).success  # warm HTTP pools
            payload = await chain.pay(KeypairSigner(chain.funded_payer()), requirements)
            t0 = time.perf_counter()
            assert (await chain.facilitator.verify(payload, requirements)).is_valid
            t1 = time.perf_counter()
            assert (await chain.facilitator.settle(payload, requirements)).success
            t2 = time.perf_counter()
        finally:
            chain.close()
        report("devnet-solana-timings",
               f"{mode}: verify {(t1 - t0) * 1000:.2f} ms, settle {(t2 - t1) * 1000:.2f} ms")


async def test_strict_rpc_signer_refuses_a_landed_but_failed_transaction() -> None:
    """paywire's production Solana signer checks the error before the confirmation status."""
    from payments.signers import StrictFacilitatorKeypairSigner

    chain = Chain("rpc")
    try:
        payer, pay_to = chain.funded_payer(PRICE - 1), chain.payee()
        payload = await chain.pay(KeypairSigner(payer), chain.quote(pay_to))
        signer = StrictFacilitatorKeypairSigner([chain.fee_payer], rpc_url=chain.rpc_url)
        signed = signer.sign_transaction(
            payload.payload["transaction"], str(chain.fee_payer.pubkey()), SolanaDevnet.NETWORK
        )
        sig = signer.send_transaction(signed, SolanaDevnet.NETWORK)
        with pytest.raises(RuntimeError, match="Transaction failed"):
            signer.confirm_transaction(sig, SolanaDevnet.NETWORK, timeout_seconds=5)
    finally:
        chain.close()
