"""The x402 contracts on both EVM devnets, paid through by the SDK's own clients and facilitators.

Chains: "devnet" (py-evm, payments/devnet/evm.py: what `paywire serve` runs) and "anvil"
(tests/support/evm_anvil.py), each holding payments/devnet/x402_contracts.py's set: Permit2
(Uniswap's bytecode, built from the npm package, deployed by CREATE2 through Arachnid's proxy)
and paywire's stand-ins (the upto and exact Permit2 proxies, Multicall3, ...).

Client: the SDK's `UptoEvmClientScheme` and exact client, unchanged, over an `EthAccountSigner`
(`EthAccountSignerWithRPC` for the gasless EIP-2612 path). Facilitator: the SDK's
`x402Facilitator` with `UptoEvmFacilitatorScheme` and the exact scheme, over each chain's signer.
Every answer asserted is the first one the SDK gives; balances are read on chain.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3
from x402 import x402Client, x402Facilitator
from x402.extensions.eip2612_gas_sponsoring import EIP2612_GAS_SPONSORING_KEY
from x402.extensions.eip2612_gas_sponsoring.server import declare_eip2612_gas_sponsoring_extension
from x402.mechanisms.evm.constants import (
    ERR_UPTO_FACILITATOR_MISMATCH,
    ERR_UPTO_SETTLEMENT_EXCEEDS_AMOUNT,
    PERMIT2_ADDRESS,
    X402_UPTO_PERMIT2_PROXY_ABI,
    X402_UPTO_PERMIT2_PROXY_ADDRESS,
)
from x402.mechanisms.evm.signers import EthAccountSigner, EthAccountSignerWithRPC
from x402.mechanisms.evm.types import UptoPermit2Payload
from x402.mechanisms.evm.upto import UptoEvmClientScheme, UptoEvmFacilitatorScheme
from x402.mechanisms.evm.upto.permit2_utils import _build_upto_permit2_settle_args
from x402.schemas import PaymentPayload, PaymentRequired, PaymentRequirements, SettleResponse

from payments.devnet import x402_contracts
from payments.devnet.evm import EvmDevnet, load_artifact
from payments.devnet.x402_contracts import (
    CANONICAL_ADDRESSES,
    DevnetContractError,
    check_permit2_init_code,
    devnet_contracts,
)
from tests.support.evm_anvil import AnvilUsdc, anvil_usdc  # noqa: F401  (fixture)
from tests.support.evm_x402 import NETWORK, USDC_EXTRA, EvmChain, new_client, new_facilitator
from tests.support.x402_devnet import revert_name

USDC = EvmDevnet.USDC_ADDRESS
MAX = 20_000  # what the payer authorizes (0.02 USDC)
FUNDS = 100_000
# Permit2's EIP-712 domain separator on chain 84532 (name "Permit2", verifyingContract Permit2):
# what the SDK's clients sign against.
PERMIT2_DOMAIN_SEPARATOR = bytes.fromhex("010f27a92fb9a32622f44f001dc4d15706a85b33499cfc2ce9033113ab26592c")
_DOMAIN_SEPARATOR_SELECTOR = "0x3644e515"  # DOMAIN_SEPARATOR()


class Chain(EvmChain, Protocol):
    """Both chains also offer their Web3 and a gas faucet."""

    w3: Web3

    def fund_gas(self, address: str, wei: int) -> None: ...


@dataclass
class World:
    """A chain with the contract set, the SDK facilitator on it, and a way to make payers."""

    name: str
    chain: Chain
    facilitator: x402Facilitator
    facilitator_address: str

    def payer(self, *, approve: bool = True) -> LocalAccount:
        """A fresh payer holding FUNDS; `approve`: its one-time approve(Permit2), gas funded."""
        payer: LocalAccount = Account.create()
        self.chain.mint(payer.address, FUNDS)
        if approve:
            self.chain.fund_gas(payer.address, 10**17)
            _send(self.chain.w3, payer, _token(self.chain.w3).functions.approve(PERMIT2_ADDRESS, 2**256 - 1))
        return payer

    def balances(self, *addresses: str) -> list[int]:
        return [self.chain.balance_of(a) for a in addresses]

    def facilitator_nonce(self) -> int:
        return self.chain.w3.eth.get_transaction_count(Web3.to_checksum_address(self.facilitator_address))

    def simulate_upto_settle(self, payload: PaymentPayload, amount: int, sender: str) -> Any:
        """The raw eth_call answer of the upto proxy's settle from `sender`, encoded by the SDK."""
        args = _build_upto_permit2_settle_args(UptoPermit2Payload.from_dict(payload.payload), amount)
        proxy = self.chain.w3.eth.contract(
            address=X402_UPTO_PERMIT2_PROXY_ADDRESS, abi=X402_UPTO_PERMIT2_PROXY_ABI
        )
        call = {"from": sender, "to": proxy.address, "data": proxy.encode_abi("settle", list(args))}
        return self.chain.w3.provider.make_request("eth_call", [call, "latest"])  # type: ignore[arg-type]

    def permit2_nonce_spent(self, payload: PaymentPayload) -> bool:
        """Whether Permit2 has used the signature's nonce (its unordered nonce bitmap)."""
        authorization = payload.payload["permit2Authorization"]
        nonce, owner = int(authorization["nonce"]), Web3.to_checksum_address(authorization["from"])
        permit2 = devnet_contracts().permit2
        assert permit2 is not None
        contract = self.chain.w3.eth.contract(address=PERMIT2_ADDRESS, abi=permit2.abi)
        word = contract.functions.nonceBitmap(owner, nonce >> 8).call()
        return bool(word >> (nonce & 0xFF) & 1)

    async def settle_upto(
        self, payload: PaymentPayload, requirements: PaymentRequirements, amount: int
    ) -> SettleResponse:
        """The facilitator settles `amount` (the resource server's actual cost) of `payload`."""
        used = requirements.model_copy(update={"amount": str(amount)})
        return await self.facilitator.settle(payload, used)


def _token(w3: Web3) -> Any:
    return w3.eth.contract(address=USDC, abi=load_artifact()["abi"])


def _send(w3: Web3, account: LocalAccount, call: Any) -> None:
    base_fee = int(w3.eth.get_block("latest")["baseFeePerGas"])
    tx = call.build_transaction(
        {
            "from": account.address,
            "nonce": w3.eth.get_transaction_count(account.address, "pending"),
            "chainId": EvmDevnet.CHAIN_ID,
            "maxFeePerGas": 2 * base_fee + 10**6,
            "maxPriorityFeePerGas": 10**6,
        }
    )
    tx_hash = w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction)
    assert w3.eth.wait_for_transaction_receipt(tx_hash, timeout=30)["status"] == 1


def _errors_abi() -> list[dict[str, Any]]:
    """The custom errors a settle may revert with: the proxies' and Permit2's own."""
    contracts = devnet_contracts()
    assert contracts.permit2 is not None
    return [item for c in contracts.preset for item in c.abi] + contracts.permit2.abi


def upto_quote(pay_to: str, facilitator: str, amount: int = MAX) -> PaymentRequirements:
    """`upto` requirements as a resource server builds them: the maximum, our facilitator."""
    return PaymentRequirements(
        scheme="upto",
        network=NETWORK,
        asset=USDC,
        amount=str(amount),
        pay_to=pay_to,
        max_timeout_seconds=300,
        extra={**USDC_EXTRA, "facilitatorAddress": facilitator},
    )


def permit2_exact_quote(pay_to: str, amount: int) -> PaymentRequirements:
    return PaymentRequirements(
        scheme="exact",
        network=NETWORK,
        asset=USDC,
        amount=str(amount),
        pay_to=pay_to,
        max_timeout_seconds=300,
        extra={**USDC_EXTRA, "assetTransferMethod": "permit2"},
    )


def upto_client(signer: Any) -> x402Client:
    return x402Client().register(NETWORK, UptoEvmClientScheme(signer))


async def sign(client: x402Client, requirements: PaymentRequirements, **required: Any) -> PaymentPayload:
    payload = await client.create_payment_payload(PaymentRequired(accepts=[requirements], **required))
    assert isinstance(payload, PaymentPayload)
    return payload


def new_devnet() -> EvmDevnet:
    return EvmDevnet(facilitator_key=Account.create().key.hex(), minter_key=Account.create().key.hex())


@pytest.fixture(scope="module")
def devnet_chain() -> EvmDevnet:
    return new_devnet()


@pytest.fixture(scope="module", params=["devnet", "anvil"])
def world(request: pytest.FixtureRequest, devnet_chain: EvmDevnet) -> Iterator[World]:
    chain = devnet_chain if request.param == "devnet" else request.getfixturevalue("anvil_usdc")
    signer = chain.facilitator_signer()
    facilitator = new_facilitator(signer).register([NETWORK], UptoEvmFacilitatorScheme(signer))
    yield World(request.param, chain, facilitator, signer.get_addresses()[0])


# ---- the contract set ----


def test_permit2_is_uniswaps_code_with_this_chains_domain(world: World) -> None:
    w3 = world.chain.w3
    permit2 = devnet_contracts().permit2
    assert permit2 is not None, "Permit2 is not built: run `make serve` or the test setup"
    separator = bytes(w3.eth.call({"to": PERMIT2_ADDRESS, "data": _DOMAIN_SEPARATOR_SELECTOR}))
    assert separator == PERMIT2_DOMAIN_SEPARATOR
    # Byte for byte the compiled runtime with the constructor's immutables for chain 84532.
    expected = bytearray(permit2.runtime)
    filled = {
        "_CACHED_CHAIN_ID": EvmDevnet.CHAIN_ID.to_bytes(32, "big"),
        "_CACHED_DOMAIN_SEPARATOR": PERMIT2_DOMAIN_SEPARATOR,
    }
    assert set(permit2.immutables) == set(filled)
    for name, offsets in permit2.immutables.items():
        for start in offsets:
            expected[start : start + 32] = filled[name]
    assert bytes(w3.eth.get_code(PERMIT2_ADDRESS)) == bytes(expected)


def test_both_chains_hold_the_same_contracts_at_the_sdks_addresses(
    devnet_chain: EvmDevnet, anvil_usdc: AnvilUsdc  # noqa: F811
) -> None:
    contracts = devnet_contracts()
    assert contracts.addresses == CANONICAL_ADDRESSES  # every contract the SDK calls
    assert contracts.unavailable_schemes() == []
    for address in sorted(contracts.addresses):
        on_devnet = bytes(devnet_chain.w3.eth.get_code(address))
        assert on_devnet, f"no code at {address} on the py-evm devnet"
        assert bytes(anvil_usdc.w3.eth.get_code(address)) == on_devnet, address
    for contract in contracts.preset:
        assert bytes(devnet_chain.w3.eth.get_code(contract.address)) == contract.code, contract.name


def test_a_devnet_without_permit2_runs_and_says_once_what_it_cannot_settle(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(x402_contracts, "PERMIT2_ARTIFACT", tmp_path / "Permit2.json")
    devnet_contracts.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=x402_contracts.__name__):
            first = new_devnet()
            new_devnet()
    finally:
        devnet_contracts.cache_clear()
    warnings = [r.getMessage() for r in caplog.records if r.name == x402_contracts.__name__]
    assert len(warnings) == 1, warnings
    assert "Permit2 is not built" in warnings[0]
    assert "npm ci && .venv/bin/python -m payments.devnet.contracts.build_permit2" in warnings[0]
    assert "upto, exact through Permit2" in warnings[0]
    assert first.w3.eth.get_code(PERMIT2_ADDRESS) == b""
    holder = Account.create().address
    first.mint(holder, 5)  # the chain itself still serves
    assert first.balance_of(holder) == 5


def test_a_permit2_build_that_is_not_the_published_one_is_refused(tmp_path: Any) -> None:
    permit2 = devnet_contracts().permit2
    assert permit2 is not None
    check_permit2_init_code(permit2.init_code)  # the real one passes
    tampered = permit2.init_code[:-1] + bytes([permit2.init_code[-1] ^ 1])
    with pytest.raises(DevnetContractError, match="not the published 0xe2be1e05") as refused:
        check_permit2_init_code(tampered)
    assert "build_permit2" in str(refused.value)


# ---- upto: the SDK's client and facilitator, unchanged ----


async def test_upto_verifies_at_the_max_and_settles_exactly_what_was_used(world: World) -> None:
    payer, pay_to = world.payer(), Account.create().address
    requirements = upto_quote(pay_to, world.facilitator_address)
    payload = await sign(upto_client(EthAccountSigner(payer)), requirements)

    verified = await world.facilitator.verify(payload, requirements)
    assert verified.is_valid, verified.invalid_reason
    settled = await world.settle_upto(payload, requirements, 1858)

    assert settled.success, settled.error_reason
    assert settled.transaction and settled.amount == "1858"
    assert world.balances(pay_to, payer.address) == [1858, FUNDS - 1858]


async def test_upto_settling_zero_moves_nothing_and_sends_nothing(world: World) -> None:
    payer, pay_to = world.payer(), Account.create().address
    requirements = upto_quote(pay_to, world.facilitator_address)
    payload = await sign(upto_client(EthAccountSigner(payer)), requirements)
    verified = await world.facilitator.verify(payload, requirements)  # before the call runs
    assert verified.is_valid, verified.invalid_reason
    nonce = world.facilitator_nonce()

    settled = await world.settle_upto(payload, requirements, 0)  # the call failed: nothing used

    assert settled.success and settled.transaction == "" and settled.amount == "0"
    assert world.facilitator_nonce() == nonce  # no transaction sent
    assert world.balances(pay_to, payer.address) == [0, FUNDS]
    assert not world.permit2_nonce_spent(payload)


async def test_upto_refuses_an_amount_above_the_max(world: World) -> None:
    payer, pay_to = world.payer(), Account.create().address
    requirements = upto_quote(pay_to, world.facilitator_address)
    payload = await sign(upto_client(EthAccountSigner(payer)), requirements)
    nonce = world.facilitator_nonce()

    settled = await world.settle_upto(payload, requirements, MAX + 1)

    assert not settled.success and settled.error_reason == ERR_UPTO_SETTLEMENT_EXCEEDS_AMOUNT
    assert world.facilitator_nonce() == nonce
    assert world.balances(pay_to, payer.address) == [0, FUNDS]
    # The proxy refuses it too, whoever asks.
    answer = world.simulate_upto_settle(payload, MAX + 1, world.facilitator_address)
    assert revert_name(answer, _errors_abi()) == "AmountExceedsPermitted"


async def test_upto_refuses_a_facilitator_that_is_not_the_witnesss(world: World) -> None:
    payer, pay_to = world.payer(), Account.create().address
    other = Account.create().address  # the facilitator the payer bound its signature to
    requirements = upto_quote(pay_to, other)
    payload = await sign(upto_client(EthAccountSigner(payer)), requirements)

    verified = await world.facilitator.verify(payload, requirements)
    settled = await world.settle_upto(payload, requirements, 100)

    assert not verified.is_valid and verified.invalid_reason == ERR_UPTO_FACILITATOR_MISMATCH
    assert not settled.success and settled.error_reason == ERR_UPTO_FACILITATOR_MISMATCH
    assert world.balances(pay_to, payer.address) == [0, FUNDS]
    answer = world.simulate_upto_settle(payload, 100, world.facilitator_address)
    assert revert_name(answer, _errors_abi()) == "UnauthorizedFacilitator"


async def test_upto_refuses_a_replayed_authorization(world: World) -> None:
    payer, pay_to = world.payer(), Account.create().address
    requirements = upto_quote(pay_to, world.facilitator_address)
    payload = await sign(upto_client(EthAccountSigner(payer)), requirements)
    assert (await world.settle_upto(payload, requirements, 777)).success
    assert world.permit2_nonce_spent(payload)

    replayed = await world.settle_upto(payload, requirements, 777)

    assert not replayed.success
    assert world.balances(pay_to, payer.address) == [777, FUNDS - 777]
    # Permit2 spent the signature's nonce: the chain refuses it, not only the SDK.
    answer = world.simulate_upto_settle(payload, 777, world.facilitator_address)
    assert revert_name(answer, _errors_abi()) == "InvalidNonce"
    assert not (await world.facilitator.verify(payload, requirements)).is_valid


async def test_upto_without_gas_through_an_eip2612_permit(world: World) -> None:
    """DevUSDC's EIP-2612 permit lets a payer with no ETH and no approval pay (gas sponsored)."""
    payer, pay_to = world.payer(approve=False), Account.create().address
    signer = EthAccountSignerWithRPC(payer, "http://127.0.0.1:0/unused")
    signer._w3 = world.chain.w3  # reads (the payer's Permit2 allowance) on the chain under test
    requirements = upto_quote(pay_to, world.facilitator_address)
    payload = await sign(
        upto_client(signer), requirements, extensions=declare_eip2612_gas_sponsoring_extension()
    )
    assert EIP2612_GAS_SPONSORING_KEY in (payload.extensions or {})

    verified = await world.facilitator.verify(payload, requirements)
    assert verified.is_valid, verified.invalid_reason
    settled = await world.settle_upto(payload, requirements, 4321)

    assert settled.success, settled.error_reason
    assert world.balances(pay_to, payer.address) == [4321, FUNDS - 4321]
    assert world.chain.w3.eth.get_balance(payer.address) == 0


# ---- exact through Permit2 ----


async def test_exact_through_permit2_moves_exactly_the_price(world: World) -> None:
    payer, pay_to = world.payer(), Account.create().address
    requirements = permit2_exact_quote(pay_to, 5_000)
    payload = await sign(new_client(payer), requirements)
    assert "permit2Authorization" in payload.payload

    verified = await world.facilitator.verify(payload, requirements)
    assert verified.is_valid, verified.invalid_reason
    settled = await world.facilitator.settle(payload, requirements)

    assert settled.success and settled.transaction, settled.error_reason
    assert world.balances(pay_to, payer.address) == [5_000, FUNDS - 5_000]
    replayed = await world.facilitator.settle(payload, requirements)
    assert not replayed.success
    assert world.balances(pay_to, payer.address) == [5_000, FUNDS - 5_000]
