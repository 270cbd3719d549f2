"""paywire's own x402 batch-settlement contracts (X402BatchSettlement and its two deposit
collectors, payments/devnet/contracts), driven by the x402 SDK's own unchanged parts on the py-evm
devnet and on anvil: the client scheme (`batch_settlement.client.BatchSettlementEvmScheme`), the
server scheme with its channel manager, and the facilitator (`BatchSettlementEvmFacilitator`).

A market here is one receiver selling a call at $0.001 (1,000 atomic USDC; the SDK's server asks
for a 10,000 deposit) through the SDK's x402ResourceServer, whose facilitator is the SDK's, in
process. Gas is measured on the receipts and reported (test-artifacts/batch-settlement-gas.txt).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from web3 import Web3
from web3.logs import DISCARD
from x402 import x402Client, x402Facilitator, x402ResourceServer
from x402.extensions.eip2612_gas_sponsoring import declare_eip2612_gas_sponsoring_extension
from x402.mechanisms.evm.batch_settlement import compute_channel_id
from x402.mechanisms.evm.batch_settlement.abi import BATCH_SETTLEMENT_ABI
from x402.mechanisms.evm.batch_settlement.authorizer_signer import LocalAuthorizerSigner, sign_claim_batch
from x402.mechanisms.evm.batch_settlement.client import BatchSettlementEvmScheme as ClientScheme
from x402.mechanisms.evm.batch_settlement.client.voucher import sign_voucher
from x402.mechanisms.evm.batch_settlement.constants import (
    BATCH_SETTLEMENT_ADDRESS,
    ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
)
from x402.mechanisms.evm.batch_settlement.encoding import build_erc3009_collector_data
from x402.mechanisms.evm.batch_settlement.errors import ERR_CLAIM_SIMULATION_FAILED
from x402.mechanisms.evm.batch_settlement.facilitator.claim import build_voucher_claim_args
from x402.mechanisms.evm.batch_settlement.facilitator.scheme import BatchSettlementEvmFacilitator
from x402.mechanisms.evm.batch_settlement.facilitator.utils import to_contract_channel_config
from x402.mechanisms.evm.batch_settlement.server import (
    BatchSettlementEvmScheme as ServerScheme,
)
from x402.mechanisms.evm.batch_settlement.server import BatchSettlementEvmSchemeServerConfig
from x402.mechanisms.evm.batch_settlement.server.channel_manager_common import (
    build_claim_payment_payload,
    build_payment_requirements,
)
from x402.mechanisms.evm.batch_settlement.types import ChannelConfig, VoucherClaim
from x402.mechanisms.evm.signers import EthAccountSigner, EthAccountSignerWithRPC
from x402.schemas import PaymentPayload, PaymentRequired, PaymentRequirements, ResourceConfig, SettleResponse
from x402.schemas.hooks import PaymentResponseContext

from payments.devnet.evm import EvmDevnet
from tests.support import reports
from tests.support.evm_anvil import anvil_missing
from tests.support.x402_devnet import X402Chain, contract, revert_name, x402_chain

NETWORK = EvmDevnet.NETWORK
PRICE = 1_000  # $0.001
DEPOSIT = 10_000  # the SDK server's minDeposit for that price (10 calls)
FUNDS = 1_000_000
WITHDRAW_DELAY = 900  # the contract's minimum
ABI = contract("X402BatchSettlement")["abi"]
GAS_REPORT = "batch-settlement-gas"
# EIP-1271 wallets as bare runtime code: one answers every isValidSignature with the magic value,
# the other with zero (a contract that refuses).
YES_WALLET = bytes.fromhex("631626ba7e60e01b60005260206000f3")
NO_WALLET = bytes.fromhex("60206000f3")


@pytest.fixture(scope="module", params=["devnet", "anvil"])
def chain(request: pytest.FixtureRequest) -> Iterator[X402Chain]:
    """One chain per module: tests that do not move its clock share it."""
    with _chain(request.param) as chain:
        yield chain


@pytest.fixture(params=["devnet", "anvil"])
def own_chain(request: pytest.FixtureRequest) -> Iterator[X402Chain]:
    """A chain of the test's own, whose clock it may move forward."""
    with _chain(request.param) as chain:
        yield chain


def _chain(name: str) -> Any:
    if name == "anvil" and anvil_missing():
        pytest.skip(anvil_missing())
    return x402_chain(name)


@dataclass
class Payer:
    account: LocalAccount
    scheme: ClientScheme
    client: x402Client
    payloads: list[PaymentPayload] = field(default_factory=list)  # what it sent, in order

    @property
    def address(self) -> str:
        return self.account.address


@dataclass
class Market:
    """One receiver selling one call through the SDK's server, facilitator and channel manager."""

    chain: X402Chain
    method: str = "eip3009"
    receiver: str = field(default_factory=lambda: Account.create().address)
    authorizer: LocalAuthorizerSigner = field(default_factory=lambda: LocalAuthorizerSigner(Account.create()))

    def __post_init__(self) -> None:
        facilitator_scheme = BatchSettlementEvmFacilitator(
            self.chain.chain.facilitator_signer(), self.authorizer
        )
        self.facilitator = x402Facilitator().register([NETWORK], facilitator_scheme)
        self.scheme = ServerScheme(
            self.receiver, BatchSettlementEvmSchemeServerConfig(withdraw_delay=WITHDRAW_DELAY)
        )
        self.server = x402ResourceServer(self.facilitator).register(NETWORK, self.scheme)
        self.server.initialize()
        extra = {"assetTransferMethod": self.method} if self.method != "eip3009" else None
        config = ResourceConfig(
            scheme="batch-settlement", pay_to=self.receiver, price="$0.001", network=NETWORK, extra=extra
        )
        self.quote: PaymentRequirements = self.server.build_payment_requirements(config)[0]
        self.manager = self.scheme.create_channel_manager(self.facilitator, NETWORK)
        self.contract = self.chain.w3.eth.contract(address=BATCH_SETTLEMENT_ADDRESS, abi=ABI)

    def payer(self, funds: int = FUNDS) -> Payer:
        account = self.chain.funded(funds)
        scheme = ClientScheme(EthAccountSignerWithRPC(account, self.chain.rpc_url))
        return Payer(account, scheme, x402Client().register(NETWORK, scheme))

    async def call(self, payer: Payer) -> SettleResponse:
        """One paid call as a resource server makes it: the 402, verify, (run), settle, response."""
        offer = PaymentRequired(
            accepts=[self.quote],
            extensions=declare_eip2612_gas_sponsoring_extension() if self.method == "permit2" else None,
        )
        payload = await payer.client.create_payment_payload(offer)
        assert isinstance(payload, PaymentPayload)
        payer.payloads.append(payload)
        verified = await self.server.verify_payment(payload, self.quote, declared_extensions=offer.extensions)
        assert verified.verify.is_valid, verified.verify.invalid_reason
        settled = await self.server.settle_payment(payload, self.quote, declared_extensions=offer.extensions)
        context = PaymentResponseContext(payload, self.quote, settle_response=settled, payment_required=offer)
        await payer.client.handle_payment_response(context)
        return settled

    async def calls(self, payer: Payer, count: int) -> list[SettleResponse]:
        return [await self.call(payer) for _ in range(count)]

    def config(self, payer: Payer) -> ChannelConfig:
        return payer.scheme.build_channel_config(self.quote)

    def channel_id(self, payer: Payer) -> str:
        return compute_channel_id(self.config(payer), NETWORK)

    def channel(self, payer: Payer) -> tuple[int, int]:
        """(balance, totalClaimed) on chain."""
        balance, claimed = self.contract.functions.channels(bytes.fromhex(self.channel_id(payer)[2:])).call()
        return int(balance), int(claimed)

    def usdc(self, *addresses: str) -> list[int]:
        return [self.chain.chain.balance_of(a) for a in addresses]

    def receipt(self, tx: str) -> Any:
        return self.chain.w3.eth.get_transaction_receipt(tx)

    def events(self, tx: str, name: str) -> list[Any]:
        """`name` events of our contract in a transaction's receipt, decoded with its ABI."""
        return list(getattr(self.contract.events, name)().process_receipt(self.receipt(tx), errors=DISCARD))


def _gas(market: Market, label: str, tx: str) -> int:
    """A transaction's gas, reported with its parts: 21,000 intrinsic, calldata, execution."""
    used = int(market.receipt(tx)["gasUsed"])
    data = bytes(market.chain.w3.eth.get_transaction(tx)["input"])
    calldata = sum(4 if byte == 0 else 16 for byte in data)
    reports.report(
        GAS_REPORT,
        f"{market.chain.name}: {label}: {used:,} gas "
        f"(21,000 intrinsic + {calldata:,} calldata + {used - 21_000 - calldata:,} execution)",
    )
    return used


def _voucher_claim(
    market: Market, payer: Payer, ceiling: int, total: int, signer: LocalAccount | None = None
) -> VoucherClaim:
    """A claim row the payer (or `signer`) signed for `ceiling`, claiming `total`."""
    voucher = sign_voucher(
        EthAccountSigner(signer or payer.account), market.channel_id(payer), ceiling, NETWORK
    )
    return VoucherClaim(market.config(payer), str(ceiling), voucher.signature, str(total))


def _claim_call(market: Market, claims: list[VoucherClaim], authorizer: Any = None) -> dict[str, Any]:
    """eth_call of claimWithSignature (encoded with the SDK's ABI), as any relayer would send it."""
    signature = sign_claim_batch(authorizer or market.authorizer, claims, NETWORK)
    data = (
        Web3()
        .eth.contract(abi=BATCH_SETTLEMENT_ABI)
        .encode_abi(
            "claimWithSignature", args=[build_voucher_claim_args(claims), bytes.fromhex(signature[2:])]
        )
    )
    relayer = Account.create().address
    return market.chain.rpc(
        "eth_call", [{"from": relayer, "to": BATCH_SETTLEMENT_ADDRESS, "data": data}, "latest"]
    )


# ---- the whole life of a channel ----


@pytest.mark.parametrize("method", ["eip3009", "permit2"])
async def test_a_channel_pays_exactly_what_was_used(chain: X402Chain, method: str) -> None:
    """Deposit (ERC-3009, or Permit2 with a gasless EIP-2612 approval), vouchers, claim, settle,
    refund: the payer's money moves at the deposit and the refund only, and the receiver gets
    exactly the calls' total."""
    market = Market(chain, method=method)
    payer = market.payer()
    escrow_before = market.usdc(BATCH_SETTLEMENT_ADDRESS)[0]

    first = await market.call(payer)
    assert (first.success, first.amount, first.extra["chargedAmount"]) == (True, str(DEPOSIT), str(PRICE))
    assert market.usdc(payer.address, BATCH_SETTLEMENT_ADDRESS) == [FUNDS - DEPOSIT, escrow_before + DEPOSIT]
    assert [e["args"]["amount"] for e in market.events(first.transaction, "Deposited")] == [DEPOSIT]
    assert len(market.events(first.transaction, "ChannelCreated")) == 1

    for response in await market.calls(payer, 4):
        assert (response.success, response.transaction) == (True, "")  # no chain on a voucher
    assert market.usdc(payer.address) == [FUNDS - DEPOSIT]
    assert market.channel(payer) == (DEPOSIT, 0)

    claimed = await market.manager.claim()
    assert [c.vouchers for c in claimed] == [1]
    assert market.channel(payer) == (DEPOSIT, 5 * PRICE)
    assert market.usdc(market.receiver) == [0]  # a claim is accounting only

    swept = await market.manager.settle()
    assert market.usdc(market.receiver) == [5 * PRICE]
    sdk_contract = chain.w3.eth.contract(address=BATCH_SETTLEMENT_ADDRESS, abi=BATCH_SETTLEMENT_ABI)
    settled = sdk_contract.events.Settled().process_receipt(market.receipt(swept.transaction), errors=DISCARD)
    assert [(e["args"]["receiver"], e["args"]["token"], e["args"]["amount"]) for e in settled] == [
        (market.receiver, chain.usdc, 5 * PRICE)
    ]

    refunded = await market.manager.refund([market.channel_id(payer)])
    assert len(refunded) == 1
    assert market.events(refunded[0].transaction, "Refunded")[0]["args"]["amount"] == DEPOSIT - 5 * PRICE
    assert market.usdc(payer.address, market.receiver) == [FUNDS - 5 * PRICE, 5 * PRICE]
    assert market.usdc(BATCH_SETTLEMENT_ADDRESS) == [escrow_before]
    assert market.channel(payer) == (5 * PRICE, 5 * PRICE)  # nothing left in escrow


async def test_one_claim_transaction_covers_ten_channels(chain: X402Chain) -> None:
    """claimWithSignature of 10 channels in one transaction; gas of each operation reported."""
    market = Market(chain)
    payers = [market.payer() for _ in range(10)]
    deposits = [(await market.calls(payer, 3))[0] for payer in payers]
    deposit_gas = _gas(market, "ERC-3009 deposit (first of a channel)", deposits[0].transaction)

    claims = await market.manager.claim()
    assert [c.vouchers for c in claims] == [10]
    claimed = market.events(claims[0].transaction, "Claimed")
    assert sorted(e["args"]["newTotalClaimed"] for e in claimed) == [3 * PRICE] * 10
    claim_10 = _gas(
        market, "claimWithSignature of 10 channels (published figure: 192,043)", claims[0].transaction
    )

    swept = await market.manager.settle()
    assert market.usdc(market.receiver) == [30 * PRICE]
    _gas(market, "settle (one transfer for all claims)", swept.transaction)
    refunds = await market.manager.refund([market.channel_id(payers[0])])
    _gas(market, "refundWithSignature (nothing left to claim)", refunds[0].transaction)
    assert market.usdc(payers[0].address) == [FUNDS - 3 * PRICE]

    single = Market(chain)
    await single.calls(single.payer(), 3)
    claim_1 = _gas(single, "claimWithSignature of 1 channel", (await single.manager.claim())[0].transaction)
    # Batching amortizes: ten channels in one claim cost far less than ten claims.
    assert claim_10 < 10 * claim_1 / 2
    assert deposit_gas < 200_000


# ---- the payer's timed withdrawal ----


def _payer_tx(market: Market, payer: Payer, function: str, *args: Any) -> Any:
    """A transaction the payer sends itself (the escape hatch needs no one else)."""
    market.chain.chain.fund_gas(payer.address, 10**17)
    data = Web3().eth.contract(abi=BATCH_SETTLEMENT_ABI).encode_abi(function, args=list(args))
    return market.chain.send(payer.account, BATCH_SETTLEMENT_ADDRESS, data)


def _payer_call(market: Market, payer: Payer, function: str, *args: Any) -> dict[str, Any]:
    data = Web3().eth.contract(abi=BATCH_SETTLEMENT_ABI).encode_abi(function, args=list(args))
    return market.chain.rpc(
        "eth_call", [{"from": payer.address, "to": BATCH_SETTLEMENT_ADDRESS, "data": data}, "latest"]
    )


async def test_a_withdrawal_returns_the_unclaimed_escrow_after_the_delay(own_chain: X402Chain) -> None:
    market = Market(own_chain)
    payer = market.payer()
    await market.calls(payer, 2)  # the receiver never claims these vouchers
    config = to_contract_channel_config(market.config(payer))

    _payer_tx(market, payer, "initiateWithdraw", config, DEPOSIT)
    assert revert_name(_payer_call(market, payer, "initiateWithdraw", config, 1), ABI) == "WithdrawalPending"
    assert revert_name(_payer_call(market, payer, "finalizeWithdraw", config), ABI) == "WithdrawalTooEarly"
    stranger = market.payer(0)
    assert revert_name(_payer_call(market, stranger, "finalizeWithdraw", config), ABI) == "NotPayerSide"

    own_chain.advance(WITHDRAW_DELAY)
    receipt = _payer_tx(market, payer, "finalizeWithdraw", config)
    assert market.usdc(payer.address) == [FUNDS]
    assert market.channel(payer) == (0, 0)
    closed = market.contract.events.ChannelClosed().process_receipt(receipt, errors=DISCARD)
    assert [e["args"]["channelId"].hex() for e in closed] == [market.channel_id(payer)[2:]]


async def test_a_claim_racing_a_withdrawal_wins_up_to_its_voucher(own_chain: X402Chain) -> None:
    """x402 issue #3464: the payer starts withdrawing everything while vouchers are unclaimed; the
    receiver claims during the delay; the withdrawal then pays only what is still unclaimed."""
    market = Market(own_chain)
    payer = market.payer()
    await market.calls(payer, 3)
    config = to_contract_channel_config(market.config(payer))
    _payer_tx(market, payer, "initiateWithdraw", config, DEPOSIT)
    pending = market.contract.functions.pendingWithdrawals(bytes.fromhex(market.channel_id(payer)[2:])).call()
    assert pending[0] == DEPOSIT

    await market.manager.claim()  # during the delay
    own_chain.advance(WITHDRAW_DELAY)
    receipt = _payer_tx(market, payer, "finalizeWithdraw", config)
    finalized = market.contract.events.WithdrawFinalized().process_receipt(receipt, errors=DISCARD)
    assert [e["args"]["amount"] for e in finalized] == [DEPOSIT - 3 * PRICE]
    await market.manager.settle()
    assert market.usdc(payer.address, market.receiver) == [FUNDS - 3 * PRICE, 3 * PRICE]
    assert market.channel(payer) == (3 * PRICE, 3 * PRICE)


# ---- refusals ----


async def test_an_overdraw_is_refused_and_the_facilitator_says_so_first(chain: X402Chain) -> None:
    market = Market(chain)
    payer = market.payer()
    await market.call(payer)
    over = _voucher_claim(market, payer, DEPOSIT + 1, DEPOSIT + 1)
    assert revert_name(_claim_call(market, [over]), ABI) == "ClaimExceedsBalance"
    beyond_voucher = _voucher_claim(market, payer, PRICE, 2 * PRICE)
    assert revert_name(_claim_call(market, [beyond_voucher]), ABI) == "ClaimExceedsVoucher"

    payload = build_claim_payment_payload(
        [over], build_payment_requirements(market.receiver, chain.usdc, NETWORK), None
    )
    answer = await market.facilitator.settle(payload, payload.accepted)
    assert (answer.success, answer.error_reason, answer.transaction) == (
        False,
        ERR_CLAIM_SIMULATION_FAILED,
        "",
    )
    assert market.channel(payer) == (DEPOSIT, 0)


async def test_a_replayed_voucher_or_deposit_counts_once(chain: X402Chain) -> None:
    market = Market(chain)
    payer = market.payer()
    first = await market.call(payer)
    claim = _voucher_claim(market, payer, PRICE, PRICE)
    payload = build_claim_payment_payload(
        [claim], build_payment_requirements(market.receiver, chain.usdc, NETWORK), None
    )
    once = await market.facilitator.settle(payload, payload.accepted)
    again = await market.facilitator.settle(payload, payload.accepted)
    assert once.success and again.success  # a replayed claim is a no-op, not an error (spec)
    assert len(market.events(once.transaction, "Claimed")) == 1
    assert market.events(again.transaction, "Claimed") == []
    assert market.channel(payer) == (DEPOSIT, PRICE)
    totals = market.contract.functions.receivers(market.receiver, chain.usdc).call()
    assert list(totals) == [PRICE, 0]

    # The deposit's ERC-3009 authorization cannot fund the channel twice.
    replayed = await market.facilitator.settle(payer.payloads[0], market.quote)
    assert (replayed.success, first.success) == (False, True)
    assert market.usdc(payer.address) == [FUNDS - DEPOSIT]
    assert market.channel(payer) == (DEPOSIT, PRICE)


async def test_bad_signatures_are_refused(chain: X402Chain) -> None:
    market = Market(chain)
    payer = market.payer()
    await market.call(payer)
    stranger = Account.create()
    forged = _voucher_claim(market, payer, PRICE, PRICE, signer=stranger)
    assert revert_name(_claim_call(market, [forged]), ABI) == "InvalidVoucherSignature"
    honest = _voucher_claim(market, payer, PRICE, PRICE)
    assert (
        revert_name(_claim_call(market, [honest], LocalAuthorizerSigner(stranger)), ABI)
        == "InvalidAuthorizerSignature"
    )
    other = Market(chain)  # a row of another receiverAuthorizer cannot ride on this signature
    other_payer = other.payer()
    await other.call(other_payer)
    mixed = [honest, _voucher_claim(other, other_payer, PRICE, PRICE)]
    assert revert_name(_claim_call(market, mixed), ABI) == "AuthorizerMismatch"
    assert market.channel(payer) == (DEPOSIT, 0)

    config = to_contract_channel_config(market.config(payer))
    data = (
        Web3()
        .eth.contract(abi=BATCH_SETTLEMENT_ABI)
        .encode_abi("refundWithSignature", args=[config, 1, 5, b"\x00" * 65])
    )
    wrong_nonce = chain.rpc("eth_call", [{"to": BATCH_SETTLEMENT_ADDRESS, "data": data}, "latest"])
    assert revert_name(wrong_nonce, ABI) == "InvalidRefundNonce"


async def test_deposits_are_checked(chain: X402Chain) -> None:
    market = Market(chain)
    payer = market.payer()
    config = list(to_contract_channel_config(market.config(payer)))
    encode = Web3().eth.contract(abi=BATCH_SETTLEMENT_ABI).encode_abi

    def deposit(
        config: list[Any], amount: int = DEPOSIT, collector: str = ERC3009_DEPOSIT_COLLECTOR_ADDRESS
    ) -> str:
        data = encode("deposit", args=[tuple(config), amount, collector, b""])
        return revert_name(
            chain.rpc("eth_call", [{"to": BATCH_SETTLEMENT_ADDRESS, "data": data}, "latest"]), ABI
        )

    too_short = [*config[:5], WITHDRAW_DELAY - 1, config[6]]
    assert deposit(too_short) == "InvalidWithdrawDelay"
    assert deposit([*config[:3], "0x" + "00" * 20, *config[4:]]) == "InvalidReceiverAuthorizer"
    assert deposit(config, amount=0) == "ZeroAmount"
    assert deposit(config, collector="0x" + "00" * 20) == "InvalidCollector"

    # The collectors take calls from the settlement contract only: nobody else may pull a signed
    # deposit into their own address.
    collector = chain.w3.eth.contract(
        address=ERC3009_DEPOSIT_COLLECTOR_ADDRESS, abi=contract("X402Erc3009DepositCollector")["abi"]
    )
    data = collector.encode_abi("collect", args=[payer.address, chain.usdc, DEPOSIT, b"\x00" * 32, b""])
    direct = chain.rpc(
        "eth_call", [{"from": payer.address, "to": ERC3009_DEPOSIT_COLLECTOR_ADDRESS, "data": data}, "latest"]
    )
    assert revert_name(direct, contract("X402Erc3009DepositCollector")["abi"]) == "OnlyBatchSettlement"


async def test_contract_wallets_sign_through_erc1271(chain: X402Chain) -> None:
    """A smart-wallet payer deposits and its vouchers are claimed (EIP-1271, no ECDSA key); a
    receiverAuthorizer contract that refuses makes the batch invalid."""
    market = Market(chain)
    wallet, refusing = chain.deploy(YES_WALLET), chain.deploy(NO_WALLET)
    chain.chain.mint(wallet, DEPOSIT)
    config = ChannelConfig(
        wallet,
        "0x" + "00" * 20,
        market.receiver,
        market.authorizer.address,
        chain.usdc,
        WITHDRAW_DELAY,
        "0x" + "00" * 32,
    )
    channel_id = compute_channel_id(config, NETWORK)
    valid_before = chain.now() + 600
    collector_data = build_erc3009_collector_data("0", str(valid_before), "0x01", "0x" + "00" * 65)
    data = market.contract.encode_abi(
        "deposit",
        args=[to_contract_channel_config(config), DEPOSIT, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, collector_data],
    )
    chain.send(chain.funded(0, gas=True), BATCH_SETTLEMENT_ADDRESS, data)
    assert market.contract.functions.channels(bytes.fromhex(channel_id[2:])).call() == [DEPOSIT, 0]

    row = VoucherClaim(config, str(PRICE), "0x" + "00" * 65, str(PRICE))  # the wallet accepts any bytes
    payload = build_claim_payment_payload(
        [row], build_payment_requirements(market.receiver, chain.usdc, NETWORK), None
    )
    claimed = await market.facilitator.settle(payload, payload.accepted)
    assert claimed.success, claimed.error_message
    assert market.contract.functions.channels(bytes.fromhex(channel_id[2:])).call() == [DEPOSIT, PRICE]

    refused_config = ChannelConfig(
        wallet,
        "0x" + "00" * 20,
        market.receiver,
        to_checksum_address(refusing),
        chain.usdc,
        WITHDRAW_DELAY,
        "0x" + "00" * 32,
    )
    refused_row = VoucherClaim(refused_config, str(PRICE), "0x" + "00" * 65, str(PRICE))
    data = market.contract.encode_abi(
        "claimWithSignature", args=[build_voucher_claim_args([refused_row]), b"\x00" * 65]
    )
    answer = chain.rpc("eth_call", [{"to": BATCH_SETTLEMENT_ADDRESS, "data": data}, "latest"])
    assert revert_name(answer, ABI) == "InvalidAuthorizerSignature"


def test_views_agree_with_the_sdks_digests(chain: X402Chain) -> None:
    market = Market(chain)
    payer = market.payer(0)
    config = market.config(payer)
    functions = market.contract.functions
    channel_id = market.channel_id(payer)
    assert "0x" + functions.getChannelId(to_contract_channel_config(config)).call().hex() == channel_id
    row = _voucher_claim(market, payer, 5 * PRICE, 3 * PRICE)
    batch_digest = functions.getClaimBatchDigest(build_voucher_claim_args([row])).call()
    signature = bytes.fromhex(sign_claim_batch(market.authorizer, [row], NETWORK)[2:])
    assert Account._recover_hash(batch_digest, signature=signature) == market.authorizer.address
    voucher_digest = functions.getVoucherDigest(bytes.fromhex(channel_id[2:]), 5 * PRICE).call()
    assert Account._recover_hash(voucher_digest, signature=bytes.fromhex(row.signature[2:])) == payer.address
