"""paywire's own x402 contracts (payments/devnet/contracts/X402Contracts.json) on the devnets,
for the tests that drive them: the artifact, a chain that holds them with an RPC URL for the SDK's
client signers, and the name of the custom error a reverted call answered with.

Chains (`X402Chain`): the py-evm devnet (its JSON-RPC served over loopback HTTP, its clock
movable), the same devnet with Circle's FiatTokenV2_2 as USDC, and an anvil node. The contracts
are installed by payments/devnet/x402_contracts.py on every chain.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak, to_checksum_address
from web3 import Web3

from payments.devnet import jsonrpc
from payments.devnet.contracts.build import X402_ARTIFACT
from payments.devnet.evm import EvmDevnet
from tests.support.evm_anvil import AnvilUsdc, run_anvil
from tests.support.evm_circle import deploy_circle_usdc
from tests.support.jsonrpc_http import JsonRpcHttpServer

_RECEIPT_TIMEOUT = 30.0


@cache
def x402_artifact() -> dict[str, Any]:
    return json.loads(X402_ARTIFACT.read_text())


def contract(name: str) -> dict[str, Any]:
    """One contract's entry: address, source, sourceSha256, abi, deployedBytecode."""
    return x402_artifact()["contracts"][name]


def new_key() -> str:
    return Account.create().key.hex()


def error_selectors(abi: list[dict[str, Any]]) -> dict[bytes, str]:
    """4-byte selector -> name of each custom error in `abi`."""
    return {
        keccak(text=f"{item['name']}({','.join(_type(i) for i in item['inputs'])})")[:4]: item["name"]
        for item in abi
        if item["type"] == "error"
    }


def _type(param: dict[str, Any]) -> str:
    kind = param["type"]
    if kind.startswith("tuple"):
        return "(" + ",".join(_type(c) for c in param["components"]) + ")" + kind[len("tuple") :]
    return kind


def revert_name(answer: jsonrpc.Answer, abi: list[dict[str, Any]]) -> str:
    """The custom error (by name) a JSON-RPC answer reverted with; fails if it did not revert."""
    assert "error" in answer, f"expected a revert, got {answer}"
    data = bytes.fromhex(answer["error"].get("data", "0x").removeprefix("0x"))
    return error_selectors(abi).get(data[:4], f"unknown revert 0x{data.hex()}")


class MovableClock:
    """The wall clock plus an offset a test moves forward (the py-evm devnet's `clock`)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@dataclass
class X402Chain:
    """A chain with the x402 contracts, DevUSDC (or Circle's USDC) and an RPC URL for clients."""

    name: str
    chain: EvmDevnet | AnvilUsdc
    rpc_url: str
    clock: MovableClock | None = None  # the py-evm devnet's; anvil moves its own
    _node_rpc: Any = field(default=None, repr=False)

    @property
    def w3(self) -> Web3:
        return self.chain.w3

    @property
    def usdc(self) -> str:
        return self.chain.USDC_ADDRESS

    def rpc(self, method: str, params: list[Any]) -> jsonrpc.Answer:
        """A raw JSON-RPC call, its error answered as data (the chain's own reply)."""
        response = self.w3.provider.make_request(method, params)  # type: ignore[arg-type]
        return {k: v for k, v in response.items() if k in ("result", "error")}

    def now(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])

    def advance(self, seconds: int) -> None:
        """Move the chain's time forward and seal a block at the new time."""
        if self.clock is not None:
            self.clock.offset += seconds
            self.w3.eth.get_block("latest")  # any request stamps an empty block at the clock
        else:
            self._node_rpc("evm_increaseTime", [seconds])
            self._node_rpc("evm_mine", [])

    def funded(self, usdc: int, *, gas: bool = False) -> LocalAccount:
        account: LocalAccount = Account.create()
        if usdc:
            self.chain.mint(account.address, usdc)
        if gas:
            self.chain.fund_gas(account.address, 10**17)
        return account

    def send(self, account: LocalAccount, to: str, data: Any, *, gas: int = 300_000) -> Any:
        """A transaction from `account` (which pays its gas); its receipt, which must be a success."""
        return self._transact(account, {"to": to_checksum_address(to), "data": data, "gas": gas})

    def deploy(self, runtime: bytes) -> str:
        """Install `runtime` by a CREATE transaction (any chain, no cheat code); its address."""
        # PUSH1 len, DUP1, PUSH1 11, PUSH1 0, CODECOPY, PUSH1 0, RETURN: return the code after it.
        init = bytes([0x60, len(runtime), 0x80, 0x60, 0x0B, 0x60, 0x00, 0x39, 0x60, 0x00, 0xF3]) + runtime
        receipt = self._transact(self.funded(0, gas=True), {"data": init, "gas": 100_000})
        assert bytes(self.w3.eth.get_code(receipt["contractAddress"])) == runtime
        return str(receipt["contractAddress"])

    def _transact(self, account: LocalAccount, fields: dict[str, Any]) -> Any:
        w3 = self.w3
        base_fee = int(w3.eth.get_block("latest")["baseFeePerGas"])
        tx = {
            **fields,
            "value": 0,
            "nonce": w3.eth.get_transaction_count(account.address, "pending"),
            "chainId": EvmDevnet.CHAIN_ID,
            "maxFeePerGas": 2 * base_fee + 10**6,
            "maxPriorityFeePerGas": 10**6,
        }
        tx_hash = w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction)
        receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=_RECEIPT_TIMEOUT)
        assert receipt["status"] == 1, f"{tx_hash.to_0x_hex()} reverted"
        return receipt


@contextmanager
def x402_chain(name: str) -> Iterator[X402Chain]:
    """A fresh chain: "devnet" (py-evm + DevUSDC), "circle" (py-evm + FiatTokenV2_2) or "anvil"."""
    if name == "anvil":
        with run_anvil() as node:
            chain = AnvilUsdc(node, facilitator_key=new_key(), minter_key=new_key())
            yield X402Chain(name, chain, node.url, _node_rpc=node.rpc)
        return
    clock = MovableClock()
    if name == "circle":
        devnet = deploy_circle_usdc(facilitator_key=new_key(), minter_key=new_key(), clock=clock)
    else:
        devnet = EvmDevnet(facilitator_key=new_key(), minter_key=new_key(), clock=clock)
    with JsonRpcHttpServer(devnet.rpc) as server:
        yield X402Chain(name, devnet, server.url, clock=clock)
