"""payments/channels/wire.py and requirements.py against the x402 SDK's own parts: the fast channel
ids, voucher digests and signer recovery agree with the SDK's typed-data functions on every vector
(and refuse what the contract refuses); malformed payloads are refused naming the field; the
requirement the hookless server scheme builds is one the SDK's client pays, and the receipts and
the corrective requirement are ones it reads, resyncing its running total from them (on the py-evm
devnet, whose chain its recovery reads). The local check's cost is measured
(test-artifacts/channel-voucher-check.txt)."""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils import keccak, to_checksum_address
from x402 import x402Client, x402Facilitator, x402ResourceServer
from x402.hook_adapters import collect_scheme_server_hook_handles
from x402.interfaces import SchemePaymentRequiredContext
from x402.mechanisms.evm.batch_settlement import errors as bs
from x402.mechanisms.evm.batch_settlement.authorizer_signer import LocalAuthorizerSigner
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme as ClientScheme
from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher
from x402.mechanisms.evm.batch_settlement.constants import VOUCHER_TYPES
from x402.mechanisms.evm.batch_settlement.facilitator.scheme import BatchSettlementEvmFacilitator
from x402.mechanisms.evm.batch_settlement.facilitator.utils import (
    validate_channel_config,
    verify_batch_settlement_voucher_typed_data,
)
from x402.mechanisms.evm.batch_settlement.server import (
    BatchSettlementEvmScheme as SdkServerScheme,
)
from x402.mechanisms.evm.batch_settlement.server.scheme import BatchSettlementRequestContext
from x402.mechanisms.evm.batch_settlement.server.settle import handle_before_settle
from x402.mechanisms.evm.batch_settlement.server.storage import Channel as SdkChannel
from x402.mechanisms.evm.batch_settlement.server.storage import PendingRequest
from x402.mechanisms.evm.batch_settlement.server.verify import handle_enrich_payment_required_response
from x402.mechanisms.evm.batch_settlement.types import ChannelConfig as SdkConfig
from x402.mechanisms.evm.batch_settlement.utils import (
    compute_channel_id,
    get_batch_settlement_eip712_domain,
)
from x402.mechanisms.evm.signers import EthAccountSigner, EthAccountSignerWithRPC
from x402.schemas import (
    AssetAmount,
    PaymentPayload,
    PaymentRequired,
    PaymentRequirements,
    ResourceConfig,
    SettleResponse,
)
from x402.schemas.hooks import PaymentResponseContext, SettleContext

from payments.channels import wire
from payments.channels.requirements import ChannelScheme, channel_scheme, priced
from payments.devnet.evm import EvmDevnet
from tests.support import reports
from tests.support.x402_devnet import X402Chain, x402_chain

NETWORK = EvmDevnet.NETWORK
CHAIN_ID = EvmDevnet.CHAIN_ID
PRICE = 1_000
N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141  # secp256k1's order


def sdk_config(payer: Any, *, receiver: str | None = None, authorizer: str | None = None,
               token: str = EvmDevnet.USDC_ADDRESS, delay: int = 3600, salt: int = 0) -> SdkConfig:
    return SdkConfig(payer.address, payer.address, receiver or Account.create().address,
                     authorizer or Account.create().address, token, delay,
                     "0x" + salt.to_bytes(32, "big").hex())


def payload_of(config: SdkConfig, signer: Any, ceiling: int, kind: str = "voucher") -> dict[str, Any]:
    channel_id = compute_channel_id(config, NETWORK)
    voucher = sign_voucher(EthAccountSigner(signer), channel_id, ceiling, NETWORK)
    raw: dict[str, Any] = {"type": kind, "channelConfig": config.to_dict(), "voucher": voucher.to_dict()}
    if kind == "deposit":
        raw["deposit"] = {"amount": str(10 * PRICE), "authorization": {"erc3009Authorization": {
            "validAfter": "0", "validBefore": str(int(time.time()) + 300), "salt": "0x" + "07" * 32,
            "signature": "0x" + "11" * 65}}}
    return raw


def requirement_for(config: SdkConfig, amount: int = PRICE, **extra: Any) -> PaymentRequirements:
    return PaymentRequirements(
        scheme="batch-settlement", network=NETWORK, asset=config.token, amount=str(amount),
        pay_to=config.receiver, max_timeout_seconds=300,
        extra={"receiverAuthorizer": config.receiver_authorizer, "withdrawDelay": config.withdraw_delay,
               "name": "USDC", "version": "2", "minDeposit": str(10 * amount), **extra})


def sdk_digest(channel_id: str, ceiling: int) -> bytes:
    typed = encode_typed_data(domain_data=get_batch_settlement_eip712_domain(CHAIN_ID),
                              message_types=VOUCHER_TYPES,
                              message_data={"channelId": bytes.fromhex(channel_id[2:]),
                                            "maxClaimableAmount": ceiling})
    return keccak(b"\x19" + typed.version + typed.header + typed.body)


# ---- digests and signatures ---------------------------------------------------------------------

def test_ids_digests_and_signers_agree_with_the_sdk() -> None:
    rng = random.Random(23)
    ceilings = [0, 1, 2**32, 2**63 - 1] + [rng.randrange(2**63) for _ in range(26)]
    for i, ceiling in enumerate(ceilings):
        payer = Account.create()
        config = sdk_config(payer, delay=rng.choice([900, 3600, 2_592_000]), salt=rng.randrange(2**256))
        ours = wire.read_payload(payload_of(config, payer, ceiling))
        channel_id = compute_channel_id(config, NETWORK)
        assert wire.channel_id_of(ours.config, CHAIN_ID) == channel_id.lower(), i
        digest = sdk_digest(channel_id, ceiling)
        assert wire.voucher_digest(CHAIN_ID, ours.voucher.channel_id, ceiling) == digest
        assert wire.recover_signer(digest, ours.voucher.signature) == payer.address.lower()
        assert verify_batch_settlement_voucher_typed_data(
            None, channel_id, str(ceiling), payer.address, payer.address,  # type: ignore[arg-type]
            ours.voucher.signature, CHAIN_ID)
        assert wire.check_payload(ours, requirement_for(config), CHAIN_ID) is None
        # signed by someone else: both refuse
        forged = wire.read_payload(payload_of(config, Account.create(), ceiling))
        refusal = wire.check_payload(forged, requirement_for(config), CHAIN_ID)
        assert refusal is not None and refusal.reason == bs.ERR_INVALID_VOUCHER_SIGNATURE
        assert "payload.voucher.signature" in refusal.message
        assert not verify_batch_settlement_voucher_typed_data(
            None, channel_id, str(ceiling), payer.address, payer.address,  # type: ignore[arg-type]
            forged.voucher.signature, CHAIN_ID)
    assert wire.domain_separator(CHAIN_ID).hex() == (
        "fdef80764086b1e0fc6ba99f0cb9aa1d59109fda7c23d60334c89d2de44dffce")  # contracts note §2a


def test_signatures_the_contract_refuses_are_refused() -> None:
    """The contract's rule (SignatureCheck.sol): 65 bytes, v 27/28, s <= n/2. The SDK's recovery
    takes v 0/1 and a high s too: a voucher it accepted could never be claimed."""
    payer = Account.create()
    config = sdk_config(payer)
    channel_id = compute_channel_id(config, NETWORK)
    digest = sdk_digest(channel_id, 5_000)
    good = payload_of(config, payer, 5_000)["voucher"]["signature"]
    raw = bytes.fromhex(good[2:])
    r, s, v = raw[:32], int.from_bytes(raw[32:64], "big"), raw[64]
    high_s = "0x" + (r + (N - s).to_bytes(32, "big") + bytes([55 - v])).hex()  # the same key's twin
    zero_one = "0x" + (raw[:64] + bytes([v - 27])).hex()
    assert wire.recover_signer(digest, good) == payer.address.lower()
    for bad in (high_s, zero_one, good + "00", good[:-2], "0x" + "00" * 64 + "1b",
                "0x" + (N.to_bytes(32, "big") + raw[32:]).hex()):
        assert wire.recover_signer(digest, bad) is None, bad
    # what the SDK would have taken, and the contract would refuse
    assert verify_batch_settlement_voucher_typed_data(
        None, channel_id, "5000", payer.address, payer.address, high_s, CHAIN_ID)  # type: ignore[arg-type]
    assert verify_batch_settlement_voucher_typed_data(
        None, channel_id, "5000", payer.address, payer.address, zero_one, CHAIN_ID)  # type: ignore[arg-type]


def test_an_erc1271_payers_voucher_is_left_to_the_facilitator() -> None:
    payer = Account.create()
    config = sdk_config(payer)
    config.payer_authorizer = "0x" + "00" * 20
    read = wire.read_payload(payload_of(config, payer, 5_000))
    assert not read.config.signs_by_ecdsa
    assert wire.check_payload(read, requirement_for(config), CHAIN_ID) is None  # no signature check
    with pytest.raises(ValueError, match="facilitator"):
        wire.signature_refusal(read, CHAIN_ID)


def test_the_local_voucher_check_is_fast() -> None:
    """read + bind + config + signature: what a voucher call costs before the ledger; the SDK's
    own local verify takes ~0.9 ms (docs/notes/issue-23-channels.md §1.4)."""
    payer = Account.create()
    config = sdk_config(payer)
    raw, requirement = payload_of(config, payer, 5_000), requirement_for(config)
    runs = 2_000
    start = time.perf_counter()
    for _ in range(runs):
        assert wire.check_payload(wire.read_payload(raw), requirement, CHAIN_ID) is None
    ours = (time.perf_counter() - start) / runs
    start = time.perf_counter()
    for _ in range(200):
        sdk = SdkConfig.from_dict(raw["channelConfig"])
        assert validate_channel_config(sdk, raw["voucher"]["channelId"], requirement) is None
        assert verify_batch_settlement_voucher_typed_data(
            None, raw["voucher"]["channelId"], "5000", payer.address, payer.address,  # type: ignore[arg-type]
            raw["voucher"]["signature"], CHAIN_ID)
    theirs = (time.perf_counter() - start) / 200
    reports.report("channel-voucher-check", f"local voucher check: {ours * 1e6:.0f} µs per call "
                                            f"(the SDK's config check + recovery: {theirs * 1e6:.0f} µs)")
    assert ours < theirs / 3


# ---- shapes ---------------------------------------------------------------------------------------

def _set(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    *parents, name = path.split(".")
    target = out
    for step in parents:
        target = target[step]
    if value is _DELETE:
        del target[name]
    else:
        target[name] = value
    return out


_DELETE = object()
MALFORMED = [
    ("type", "settle", "payload.type must be one of deposit, voucher, refund"),
    ("channelConfig", _DELETE, "payload.channelConfig must be an object"),
    ("channelConfig.payer", "0x123", "payload.channelConfig.payer must be an address"),
    ("channelConfig.receiverAuthorizer", None, "payload.channelConfig.receiverAuthorizer must be an address"),
    ("channelConfig.withdrawDelay", "soon", "payload.channelConfig.withdrawDelay must be a whole number"),
    ("channelConfig.withdrawDelay", 2**40, "payload.channelConfig.withdrawDelay must be a whole number"),
    ("channelConfig.salt", "0x00", "payload.channelConfig.salt must be 32 bytes"),
    ("voucher.channelId", 7, "payload.voucher.channelId must be 32 bytes"),
    ("voucher.maxClaimableAmount", "1.5", "payload.voucher.maxClaimableAmount must be a whole number"),
    ("voucher.maxClaimableAmount", -1, "payload.voucher.maxClaimableAmount must be a whole number"),
    ("voucher.maxClaimableAmount", str(2**63), "at most 9223372036854775807"),
    ("voucher.maxClaimableAmount", True, "payload.voucher.maxClaimableAmount must be a whole number"),
    ("voucher.signature", "0x1234", "payload.voucher.signature must be a hex signature"),
    ("deposit", _DELETE, "payload.deposit must be an object"),
    ("deposit.amount", "0", "payload.deposit.amount must be a whole number"),
    ("deposit.amount", 2**63, "at most 9223372036854775807"),
    ("deposit.authorization", {}, "exactly one of erc3009Authorization, permit2Authorization"),
    ("deposit.authorization.erc3009Authorization.validBefore", "tomorrow",
     "payload.deposit.authorization.erc3009Authorization.validBefore must be a whole number below 2**256"),
    ("deposit.authorization.erc3009Authorization.signature", None,
     "payload.deposit.authorization.erc3009Authorization.signature must be a hex signature"),
]


@pytest.mark.parametrize(("path", "value", "says"), MALFORMED,
                         ids=[(f"{p} absent" if v is _DELETE else f"{p}={v!r}")[:60]
                              for p, v, _ in MALFORMED])
def test_malformed_payloads_are_refused_naming_the_field(path: str, value: Any, says: str) -> None:
    payer = Account.create()
    good = payload_of(sdk_config(payer), payer, 5_000, kind="deposit")
    assert wire.payload_problem(good) is None
    bad = _set(good, path, value)
    with pytest.raises(wire.MalformedPayload) as refused:
        wire.read_payload(bad)
    assert says in str(refused.value)


def test_permit2_deposits_and_refunds_are_read() -> None:
    payer = Account.create()
    config = sdk_config(payer)
    deposit = payload_of(config, payer, 5_000, kind="deposit")
    deposit["deposit"]["authorization"] = {"permit2Authorization": {
        "from": payer.address, "permitted": {"token": config.token, "amount": "10000"},
        "spender": "0x4020425FAf3B746C082C2f942b4E5159887B0005", "nonce": "5", "deadline": "99",
        "witness": {"channelId": compute_channel_id(config, NETWORK)}, "signature": "0x" + "22" * 65}}
    read = wire.read_payload(deposit)
    assert (read.kind, read.deposit_amount, read.transfer_method) == ("deposit", 10_000, "permit2")
    refused = wire.check_payload(read, requirement_for(config), CHAIN_ID)  # the requirement says eip3009
    assert refused is not None and refused.reason == bs.ERR_ERC3009_AUTHORIZATION_REQUIRED
    assert wire.check_payload(read, requirement_for(config, assetTransferMethod="permit2"), CHAIN_ID) is None
    bad = _set(deposit, "deposit.authorization.permit2Authorization.witness.channelId", "0x1")
    assert "payload.deposit.authorization.permit2Authorization.witness.channelId must be 32 bytes" in str(
        wire.payload_problem(bad))

    refund = payload_of(config, payer, 5_000, kind="refund")
    assert wire.read_payload(refund).refund_amount is None
    assert wire.read_payload({**refund, "amount": "300"}).refund_amount == 300
    assert "payload.amount" in str(wire.payload_problem({**refund, "amount": "0"}))


def test_configs_that_do_not_pay_the_requirement_are_refused_as_the_sdk_does() -> None:
    payer = Account.create()
    config = sdk_config(payer)
    requirement = requirement_for(config)
    cases = [
        ("receiver", {"receiver": Account.create().address}, bs.ERR_RECEIVER_MISMATCH),
        ("receiverAuthorizer", {"receiver_authorizer": Account.create().address},
         bs.ERR_RECEIVER_AUTHORIZER_MISMATCH),
        ("token", {"token": Account.create().address}, bs.ERR_TOKEN_MISMATCH),
        ("withdrawDelay", {"withdraw_delay": 7200}, bs.ERR_WITHDRAW_DELAY_MISMATCH),
    ]
    for field, change, reason in cases:
        other = SdkConfig(**{**config.__dict__, **change})
        read = wire.read_payload(payload_of(other, payer, 5_000))
        refusal = wire.check_payload(read, requirement, CHAIN_ID)
        assert refusal is not None and refusal.reason == reason, field
        assert f"payload.channelConfig.{field}" in refusal.message
        assert validate_channel_config(other, read.voucher.channel_id, requirement) == reason
    short = SdkConfig(**{**config.__dict__, "withdraw_delay": 60})
    read = wire.read_payload(payload_of(short, payer, 5_000))
    refusal = wire.check_payload(read, requirement_for(short), CHAIN_ID)
    assert refusal is not None and refusal.reason == bs.ERR_WITHDRAW_DELAY_OUT_OF_RANGE
    assert validate_channel_config(short, read.voucher.channel_id, requirement_for(short)) == refusal.reason
    # a voucher naming another channel than its config's
    raw = payload_of(config, payer, 5_000)
    raw["voucher"]["channelId"] = compute_channel_id(sdk_config(payer, salt=1), NETWORK)
    refusal = wire.check_payload(wire.read_payload(raw), requirement, CHAIN_ID)
    assert refusal is not None and refusal.reason == bs.ERR_CHANNEL_ID_MISMATCH
    assert "payload.voucher.channelId" in refusal.message
    # a deposit below the requirement's minDeposit
    deposit = wire.read_payload(payload_of(config, payer, 5_000, kind="deposit"))
    refusal = wire.check_payload(deposit, requirement_for(config, minDeposit="20000"), CHAIN_ID)
    assert refusal is not None and refusal.reason == bs.ERR_DEPOSIT_BELOW_MIN_DEPOSIT
    assert "payload.deposit.amount" in refusal.message and "20000" in refusal.message
    with pytest.raises(ValueError, match="total_claimed"):
        wire.Onchain(0, -1)


# ---- what goes back, as the SDK's server writes it ------------------------------------------------

def test_the_receipt_and_the_corrective_requirement_are_the_sdks() -> None:
    payer = Account.create()
    config = sdk_config(payer)
    channel_id = compute_channel_id(config, NETWORK).lower()
    requirement = requirement_for(config)
    raw = payload_of(config, payer, 1_300)
    payload = PaymentPayload(x402_version=2, payload=raw, accepted=requirement)
    onchain = wire.Onchain(balance=10_000, total_claimed=200, withdraw_requested_at=0, refund_nonce=3)
    scheme = SdkServerScheme(config.receiver)
    scheme.get_storage().update_channel(channel_id, lambda _: SdkChannel(
        channel_id, config, charged_cumulative_amount="300", signed_max_claimable="1300",
        signature=raw["voucher"]["signature"], balance="10000", total_claimed="200",
        refund_nonce=3, pending_request=PendingRequest("p1", "1300", 2**62)))

    # the corrective requirement (a mismatch on a 402)
    context = SchemePaymentRequiredContext(
        requirements=[requirement.model_copy(deep=True)], resource_info=None,
        error=bs.ERR_CUMULATIVE_AMOUNT_MISMATCH,
        payment_required_response=PaymentRequired(accepts=[requirement]), payment_payload=payload)
    theirs = handle_enrich_payment_required_response(scheme, context)
    assert theirs is not None
    ours = wire.corrective_requirement(requirement, channel_id=channel_id, onchain=onchain, charged=300,
                                       signed_max=1_300, signature=raw["voucher"]["signature"])
    assert ours.model_dump() == theirs[0].model_dump()
    assert requirement.extra is not None and "channelState" not in requirement.extra  # a copy

    # a voucher's receipt (the SDK charges the settle requirement's amount: the actual cost)
    scheme.merge_request_context(payload, BatchSettlementRequestContext(pending_id="p1"))
    actual = requirement.model_copy(update={"amount": "700"})
    skipped = handle_before_settle(scheme, SettleContext(payment_payload=payload, requirements=actual))
    mine = wire.voucher_receipt(network=NETWORK, payer=payer.address, channel_id=channel_id,
                                onchain=onchain, charged_before=300, actual=700)
    assert mine.model_dump() == skipped.result.model_dump()  # type: ignore[union-attr]


# ---- the SDK's client pays, reads the receipts, resyncs (on the devnet) --------------------------

@pytest.fixture(scope="module")
def chain() -> Iterator[X402Chain]:
    with x402_chain("devnet") as chain:
        yield chain


async def test_the_sdks_client_pays_reads_receipts_and_resyncs(chain: X402Chain) -> None:
    authorizer = LocalAuthorizerSigner(Account.create())
    facilitator = x402Facilitator().register(
        [NETWORK], BatchSettlementEvmFacilitator(chain.chain.facilitator_signer(), authorizer))
    receiver = Account.create().address
    scheme = channel_scheme(receiver)
    assert all(getattr(collect_scheme_server_hook_handles(scheme), phase, None) is None for phase in (
        "before_verify", "after_verify", "on_verify_failure", "before_settle", "after_settle",
        "on_settle_failure", "on_verified_payment_canceled"))
    server = x402ResourceServer(facilitator).register(NETWORK, scheme)
    server.initialize()  # validate_facilitator_support: the facilitator advertises an authorizer
    template, = server.build_payment_requirements(ResourceConfig(
        scheme="batch-settlement", pay_to=receiver, network=NETWORK,
        price=AssetAmount(amount="1", asset=chain.usdc)))
    requirement = priced(scheme, template, PRICE, min_deposit=250_000)
    extra = requirement.extra or {}
    assert (extra["receiverAuthorizer"], extra["withdrawDelay"], extra["minDeposit"]) == (
        authorizer.address, 3600, "250000")
    assert (extra["name"], extra["version"], requirement.amount) == ("USDC", "2", "1000")
    assert priced(scheme, template, 300_000, min_deposit=250_000).extra["minDeposit"] == "300000"  # type: ignore[index]
    assert priced(scheme, template, 7).extra["minDeposit"] == "70"  # type: ignore[index]
    assert template.extra is not None and template.extra["minDeposit"] == "10"  # untouched

    payer = chain.funded(1_000_000)
    client_scheme = ClientScheme(EthAccountSignerWithRPC(payer, chain.rpc_url))
    client = x402Client().register(NETWORK, client_scheme)
    offer = PaymentRequired(accepts=[requirement])

    async def pay() -> PaymentPayload:
        payload = await client.create_payment_payload(offer)
        assert isinstance(payload, PaymentPayload)
        assert server.find_matching_requirements([requirement], payload) is not None
        read = wire.read_payload(payload.payload)
        assert wire.check_payload(read, requirement, CHAIN_ID) is None
        return payload

    async def receive(payload: PaymentPayload, receipt: SettleResponse | None = None,
                      corrective: PaymentRequired | None = None) -> None:
        await client.handle_payment_response(PaymentResponseContext(
            payload, requirement, settle_response=receipt, payment_required=corrective or offer))

    deposit = await pay()
    read = wire.read_payload(deposit.payload)
    assert (read.kind, read.voucher.ceiling) == ("deposit", PRICE)
    assert read.deposit_amount is not None and read.deposit_amount >= 250_000
    channel_id, onchain = read.voucher.channel_id, wire.Onchain(read.deposit_amount, 0)
    # the deposit call charged 300 of its 1,000: the receipt paywire's commit gives
    await receive(deposit, SettleResponse(
        success=True, transaction="0x" + "ab" * 32, network=NETWORK, payer=payer.address,
        amount=str(read.deposit_amount),
        extra=wire.charge_extra(channel_id, onchain, charged_before=0, actual=300)))
    voucher = await pay()
    read = wire.read_payload(voucher.payload)
    assert (read.kind, read.voucher.ceiling) == ("voucher", 300 + PRICE)
    await receive(voucher, wire.voucher_receipt(network=NETWORK, payer=payer.address,
                                                channel_id=channel_id, onchain=onchain,
                                                charged_before=300, actual=1_000))
    latest = wire.read_payload((await pay()).payload).voucher
    assert latest.ceiling == 1_300 + PRICE

    # a client that lost its state signs on the chain's total (0): the corrective 402 resyncs it
    client_scheme._storage.delete(channel_id)  # noqa: SLF001 - the state a crash loses
    stale = await pay()
    assert wire.read_payload(stale.payload).voucher.ceiling == PRICE
    corrective = PaymentRequired(error=bs.ERR_CUMULATIVE_AMOUNT_MISMATCH, accepts=[
        wire.corrective_requirement(requirement, channel_id=channel_id, onchain=onchain,
                                    charged=1_300, signed_max=latest.ceiling,
                                    signature=latest.signature)])
    await receive(stale, corrective=corrective)
    resynced = wire.read_payload((await pay()).payload)
    assert resynced.voucher.ceiling == 1_300 + PRICE
    assert wire.check_payload(resynced, requirement, CHAIN_ID) is None
    assert isinstance(scheme, ChannelScheme) and to_checksum_address(receiver) == requirement.pay_to
