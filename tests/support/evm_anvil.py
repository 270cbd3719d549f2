"""An `anvil` node (npm `@foundry-rs/anvil-linux-amd64`) as a Base Sepolia stand-in.

Exercises the production RPC path: the facilitator is the SDK's plain
`FacilitatorWeb3Signer(private_key, rpc_url)` over HTTP, against a real node implementation.
DevUSDC's runtime code goes in at the USDC address with `anvil_setCode` and its minter slot
with `anvil_setStorageAt`; keys are generated per run and funded with `anvil_setBalance`.
The x402 contracts are the py-evm devnet's set (payments/devnet/x402_contracts.py): paywire's
stand-ins by `anvil_setCode`, Permit2 (when built) by a CREATE2 transaction through anvil's own
predeployed Arachnid proxy.

    with run_anvil() as node:                 # loopback, free port, chain id 84532
        chain = AnvilUsdc(node, facilitator_key=..., minter_key=...)

or, in a test module, `from tests.support.evm_anvil import anvil_usdc` and ask for the
`anvil_usdc` fixture (module scoped; skips when the binary is not installed).
"""

from __future__ import annotations

import collections
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from web3 import Web3
from x402.mechanisms.evm.signers import FacilitatorWeb3Signer

from payments.devnet.evm import EvmDevnet, load_artifact
from payments.devnet.x402_contracts import (
    CREATE2_DEPLOYER,
    CREATE2_DEPLOYER_CODE,
    PERMIT2_ADDRESS,
    devnet_contracts,
)

ROOT = Path(__file__).resolve().parents[2]
ANVIL = ROOT / "node_modules" / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"
STARTUP_TIMEOUT = 20.0
_GAS_ETH = 1_000 * 10**18


def anvil_missing() -> str | None:
    """Why anvil cannot run here (None when it can)."""
    if not ANVIL.is_file():
        return f"anvil not installed at {ANVIL}; run `npm ci`"
    return None


@dataclass
class AnvilNode:
    """A running anvil process and its loopback RPC URL."""

    process: subprocess.Popen[bytes]
    url: str
    output: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=200))

    def web3(self) -> Web3:
        return Web3(Web3.HTTPProvider(self.url, request_kwargs={"timeout": 10}))

    def rpc(self, method: str, params: list[Any]) -> Any:
        """A raw JSON-RPC call (anvil_* cheat codes have no web3 wrappers)."""
        response = self.web3().provider.make_request(method, params)  # type: ignore[arg-type]
        if "error" in response:
            raise RuntimeError(f"{method} failed: {response['error']}")
        return response["result"]


@contextmanager
def run_anvil(*, chain_id: int = EvmDevnet.CHAIN_ID, timeout: float = STARTUP_TIMEOUT) -> Iterator[AnvilNode]:
    """Start anvil on 127.0.0.1 with an OS-chosen port; stop it on exit.

    Port 0 lets the kernel pick a free port (no probe-then-bind race); anvil prints the
    bound address ("Listening on 127.0.0.1:PORT"), which a reader thread waits for.
    """
    reason = anvil_missing()
    if reason:
        raise RuntimeError(reason)
    process = subprocess.Popen(
        [
            str(ANVIL),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--chain-id",
            str(chain_id),
            "--accounts",
            "0",  # no well-known funded keys
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    output: collections.deque[str] = collections.deque(maxlen=200)
    listening: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        # Reads until anvil exits: an unread pipe would fill up and stall the node.
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip()
            output.append(line)
            if not ready.is_set() and line.startswith("Listening on "):
                listening.append(line.removeprefix("Listening on ").strip())
                ready.set()
        ready.set()  # exited: wake the waiter

    reader = threading.Thread(target=drain, name="anvil-output", daemon=True)
    reader.start()
    try:
        if not ready.wait(timeout) or not listening:
            raise RuntimeError(
                f"anvil did not start within {timeout}s (exit code {process.poll()}):\n" + "\n".join(output)
            )
        node = AnvilNode(process=process, url=f"http://{listening[0]}", output=output)
        if int(node.rpc("eth_chainId", []), 16) != chain_id:
            raise RuntimeError("anvil answered with the wrong chain id")
        yield node
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        reader.join(timeout=10)


class AnvilUsdc:
    """DevUSDC installed at Base Sepolia's USDC address on an anvil node (EvmChain surface)."""

    CHAIN_ID = EvmDevnet.CHAIN_ID
    NETWORK = EvmDevnet.NETWORK
    USDC_ADDRESS = EvmDevnet.USDC_ADDRESS

    def __init__(self, node: AnvilNode, *, facilitator_key: str, minter_key: str) -> None:
        self.node = node
        self.w3 = node.web3()
        self._facilitator_key = facilitator_key
        self._minter: LocalAccount = Account.from_key(minter_key)
        self.facilitator_address = Account.from_key(facilitator_key).address
        artifact = load_artifact()
        node.rpc("anvil_setCode", [self.USDC_ADDRESS, artifact["deployedBytecode"]])
        node.rpc(
            "anvil_setStorageAt",
            [
                self.USDC_ADDRESS,
                "0x" + int(artifact["minterSlot"]).to_bytes(32, "big").hex(),
                "0x" + bytes.fromhex(self._minter.address[2:]).rjust(32, b"\0").hex(),
            ],
        )
        for address in (self.facilitator_address, self._minter.address):
            self.fund_gas(address, _GAS_ETH)
        self._token = self.w3.eth.contract(address=self.USDC_ADDRESS, abi=artifact["abi"])
        self._lock = threading.Lock()
        self._install_x402_contracts()

    def facilitator_signer(self) -> FacilitatorWeb3Signer:
        """The SDK's production signer, over HTTP to anvil."""
        return FacilitatorWeb3Signer(self._facilitator_key, self.node.url)

    def fund_gas(self, address: str, wei: int) -> None:
        balance = self.w3.eth.get_balance(to_checksum_address(address))
        self.node.rpc("anvil_setBalance", [to_checksum_address(address), hex(balance + wei)])

    def mint(self, to: str, amount: int) -> str:
        return self._send(self._minter, self._token.functions.mint(to_checksum_address(to), amount))

    def balance_of(self, address: str) -> int:
        return int(self._token.functions.balanceOf(to_checksum_address(address)).call())

    def transfer(self, private_key: str, to: str, amount: int) -> str:
        account: LocalAccount = Account.from_key(private_key)
        self.fund_gas(account.address, 10**17)
        call = self._token.functions.transfer(to_checksum_address(to), amount)
        return self._send(account, call)

    def _install_x402_contracts(self) -> None:
        """The devnet's contract set, checked against its artifacts once installed."""
        contracts = devnet_contracts()
        for address, code in contracts.preset_code().items():
            self.node.rpc("anvil_setCode", [address, "0x" + code.hex()])
        # Once per node: a second AnvilUsdc on it finds Permit2 there (CREATE2 would revert).
        if contracts.permit2 is not None and not self.w3.eth.get_code(PERMIT2_ADDRESS):
            proxy = bytes(self.w3.eth.get_code(CREATE2_DEPLOYER))
            if proxy != CREATE2_DEPLOYER_CODE:
                raise RuntimeError(f"anvil has no Arachnid CREATE2 proxy at {CREATE2_DEPLOYER}")
            deployer: LocalAccount = Account.create()
            self.fund_gas(deployer.address, 10**18)
            self._send_fields(deployer, contracts.permit2.deploy_transaction())
        contracts.check_installed(lambda address: bytes(self.w3.eth.get_code(address)))

    def _send(self, account: LocalAccount, call: Any) -> str:
        with self._lock:
            return self._broadcast(account, call.build_transaction(self._sender(account)))

    def _send_fields(self, account: LocalAccount, fields: dict[str, Any]) -> str:
        """A transaction of the given fields (to, data, gas, value) from `account`."""
        with self._lock:
            return self._broadcast(account, {**fields, **self._sender(account), **self._fees()})

    def _sender(self, account: LocalAccount) -> dict[str, Any]:
        nonce = self.w3.eth.get_transaction_count(account.address, "pending")
        return {"from": account.address, "nonce": nonce, "chainId": self.CHAIN_ID}

    def _broadcast(self, account: LocalAccount, tx: dict[str, Any]) -> str:
        tx_hash = self.w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction)
        receipt = self.w3.eth.wait_for_transaction_receipt(tx_hash, timeout=30)
        if receipt["status"] != 1:
            raise RuntimeError(f"anvil transaction {tx_hash.to_0x_hex()} reverted")
        return tx_hash.to_0x_hex()

    def _fees(self) -> dict[str, int]:
        base_fee = int(self.w3.eth.get_block("latest")["baseFeePerGas"])
        return {"maxFeePerGas": 2 * base_fee + 10**6, "maxPriorityFeePerGas": 10**6}


@pytest.fixture(scope="module")
def anvil_usdc() -> Iterator[AnvilUsdc]:
    """A fresh anvil node with DevUSDC at the USDC address, for one test module."""
    reason = anvil_missing()
    if reason:
        pytest.skip(reason)
    with run_anvil() as node:
        yield AnvilUsdc(
            node,
            facilitator_key=Account.create().key.hex(),
            minter_key=Account.create().key.hex(),
        )
