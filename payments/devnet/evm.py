"""In-process EVM devnet that mirrors Base Sepolia: payments really settle, with no network.

py-evm through eth-tester, chain id 84532, and DevUSDC (payments/devnet/contracts) installed in
the genesis state AT Base Sepolia's USDC address, so x402 requirements built for Base Sepolia
verify and settle here unchanged (EIP-712 domain "USDC"/"2" bound to chain 84532 and that
address). A devnet signature is therefore also valid on Base Sepolia for that payer: only ever
fund throwaway keys here.

The x402 contracts (x402_contracts.py) are installed too, so the SDK's `upto`, `exact` through
Permit2 and `batch-settlement` settle here unchanged: paywire's stand-ins and Multicall3 in the
genesis state at their canonical addresses, beside Arachnid's CREATE2 proxy, and Permit2 (when
built) deployed through that proxy by a real CREATE2 transaction from the faucet at startup.

Shape of the chain:
- Every access goes through `EvmDevnet.rpc`, one JSON-RPC call answered in wire format, under
  one re-entrant lock (eth-tester is not thread-safe). The in-process `w3`, the facilitator
  signer and the HTTP route (through `jsonrpc.answer`) all use it: a single code path.
- Blocks carry the wall clock's second, never a later one. Every transaction is mined at once
  in a block of its own (settlement is final when `eth_sendRawTransaction` returns), so several
  blocks may share a second: py-evm's "strictly later than the parent" rule is relaxed to "not
  earlier" (Hardhat's `allowBlocksWithSameTimestamp`). With the strict rule each block took the
  next second and above one transaction per second the chain ran ahead of the wall clock,
  until every new EIP-3009 authorization (validBefore = now + 300) was already expired.
- Idle time passes too: before serving a request the devnet mines an empty block if the head is
  older than Base's block time. eth-tester would otherwise keep the timestamp of the last mined
  block (or the moment the pending block was opened), and after any idle period EIP-3009
  windows would be checked against a stale clock.
- `eth_call`/`eth_estimateGas` without fee fields run with a zero base fee, as geth does, so
  read-only calls from unfunded accounts (payers, the zero address) work.
- Mining control for fault-injection tests, with anvil's names: `evm_setAutomine [false]` stops
  mining (eth-tester's own auto-mine switch); a sent transaction then waits in the pending block
  (its hash is returned, `eth_getTransactionReceipt` answers null, the "pending" nonce counts it,
  no empty blocks are mined meanwhile) until `evm_mine` mines everything waiting in one block;
  `evm_setAutomine [true]` mines what waits and goes back to a block per transaction.
  eth-tester's own pool is not used: it checks each transaction against the mined state, so a
  sender's second waiting transaction (the facilitator's next settlement) was refused.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from eth.abc import BlockHeaderAPI, VirtualMachineAPI
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_tester import EthereumTester, PyEVMBackend
from eth_tester.exceptions import TransactionFailed
from eth_utils import to_canonical_address, to_checksum_address
from web3 import Web3
from web3.exceptions import TransactionNotFound
from web3.middleware import ExtraDataToPOAMiddleware
from web3.providers import BaseProvider
from web3.providers.eth_tester.defaults import API_ENDPOINTS, static_return
from web3.providers.eth_tester.middleware import request_formatters, result_formatters
from web3.types import RPCEndpoint, RPCResponse
from x402.mechanisms.evm.signer import FacilitatorEvmSigner

from ..signers import ResilientFacilitatorWeb3Signer
from . import jsonrpc
from .x402_contracts import (
    CREATE2_DEPLOYER,
    CREATE2_DEPLOYER_CODE,
    PERMIT2_ADDRESS,
    DevnetContracts,
    devnet_contracts,
)

ARTIFACT_PATH = Path(__file__).resolve().parent / "contracts" / "DevUSDC.json"

# Base produces a block every 2 s; the devnet's head is never older than that when read.
BLOCK_TIME_SECONDS = 2
_GAS_ETH = 1_000 * 10**18  # genesis ETH for the facilitator and the minter
_FAUCET_ETH = 10**9 * 10**18  # the faucet pays fund_gas() and transfer() top-ups
_TOP_UP_WEI = 10**18
_MAX_QUEUED_PER_SENDER = 64

# Only the read/broadcast surface of a public node is served; eth-tester's evm_*/testing_*
# (snapshots, time travel) would let any HTTP caller rewrite settled history.
_SERVED_NAMESPACES = frozenset({"eth", "net", "web3"})
_UNSERVED_METHODS = frozenset({"eth_sendTransaction", "eth_sign", "eth_signTransaction"})
# Mining control (anvil's names): it pauses and resumes the chain, never rewrites what was mined.
_MINING_METHODS = frozenset({"evm_setAutomine", "evm_mine"})
_ZERO_ADDRESS = "0x" + "00" * 20
_ERROR_STRING_SELECTOR = bytes.fromhex("08c379a0")


def load_artifact() -> dict[str, Any]:
    """The committed DevUSDC build (abi, bytecode, deployedBytecode, minterSlot, ...)."""
    return json.loads(ARTIFACT_PATH.read_text())


class _InvalidParams(ValueError):
    """A call's parameters are not what the method takes (-32602)."""


class _RevertError(Exception):
    """A call that reverted, with the raw revert payload geth would return as `error.data`."""

    def __init__(self, data: bytes, message: str) -> None:
        super().__init__(message)
        self.data = data


def _revert_message(data: bytes) -> str:
    """geth's message for revert data: the Error(string) reason when there is one.

    Decoded leniently (offset, length, bytes), as geth does: contracts built with old solc,
    Circle's FiatToken among them, leave dirty padding after the reason, which strict ABI
    decoding rejects, and the SDK classifies failures by this message.
    """
    if data[:4] == _ERROR_STRING_SELECTOR and len(data) >= 4 + 64:
        body = data[4:]
        offset = int.from_bytes(body[:32], "big")
        if offset + 32 <= len(body):
            length = int.from_bytes(body[offset : offset + 32], "big")
            reason = body[offset + 32 : offset + 32 + length]
            if len(reason) == length:
                return "execution reverted: " + reason.decode("utf-8", errors="replace")
    return "execution reverted"


class _DevnetBackend(PyEVMBackend):
    """PyEVMBackend with a chosen chain id and geth-like fee handling for calls."""

    def __init__(
        self,
        *,
        chain_id: int,
        genesis_state: dict[bytes, dict[str, Any]],
        genesis_timestamp: int,
    ) -> None:
        self._chain_id = chain_id
        super().__init__(
            genesis_parameters=PyEVMBackend.generate_genesis_params({"timestamp": genesis_timestamp}),
            genesis_state=genesis_state,
        )
        # eth-tester derives well-known keys (1, 2, ...) as unlocked accounts; a devnet served
        # over HTTP must not offer them.
        self.account_keys = ()

    def reset_to_genesis(self, *args: Any, **kwargs: Any) -> None:
        super().reset_to_genesis(*args, **kwargs)
        # setup_tester_chain defines a fresh chain class per call, so this touches only ours.
        chain_class = type(self.chain)
        chain_class.chain_id = self._chain_id
        chain_class.vm_configuration = tuple(
            (block, _same_second_blocks(vm)) for block, vm in chain_class.vm_configuration
        )

    def call(self, transaction: dict[str, Any], block_number: Any = "latest") -> bytes:
        # eth-tester's call() reduces revert data to a message; keep the raw bytes.
        from eth.vm.spoof import SpoofTransaction
        from eth_tester.backends.pyevm.main import _get_block_by_number

        tx = dict(transaction)
        tx.setdefault("gas", self._max_available_gas())
        header = _get_block_by_number(self.chain, block_number).header
        if _without_fees(tx):
            tx.update(max_fee_per_gas=0, max_priority_fee_per_gas=0)
            header = header.copy(base_fee_per_gas=0)
        unsigned = self._get_normalized_and_unsigned_evm_transaction(tx, block_number)
        state = self.chain.get_vm(at_header=header).state
        snapshot = state.snapshot()
        try:
            computation = state.apply_transaction(SpoofTransaction(unsigned, from_=tx["from"]))
        finally:
            state.revert(snapshot)
        if computation.is_error:
            error = computation.error
            data = error.args[0] if error.args and isinstance(error.args[0], bytes) else b""
            raise _RevertError(data, _revert_message(data) if data else str(error))
        return computation.output

    def estimate_gas(self, transaction: dict[str, Any], block_number: Any = "latest") -> int:
        tx = dict(transaction)
        if _without_fees(tx):
            # py-evm estimates in a zero-base-fee block already; zero fees skip the balance check.
            tx.update(max_fee_per_gas=0, max_priority_fee_per_gas=0)
        return super().estimate_gas(tx, block_number)


def _same_second_blocks(vm_class: type[VirtualMachineAPI]) -> type[VirtualMachineAPI]:
    """`vm_class` with blocks allowed in their parent's second (never in an earlier one)."""

    class SameSecondVM(vm_class):  # type: ignore[valid-type, misc]
        @classmethod
        def validate_header(cls, header: BlockHeaderAPI, parent_header: BlockHeaderAPI) -> None:
            if parent_header is not None and header.timestamp == parent_header.timestamp:
                # Every other rule still applies: check against a parent one second older.
                parent_header = parent_header.copy(timestamp=parent_header.timestamp - 1)
            super().validate_header(header, parent_header)

    SameSecondVM.__name__ = SameSecondVM.__qualname__ = f"SameSecond{vm_class.__name__}"
    return SameSecondVM


def _without_fees(tx: dict[str, Any]) -> bool:
    return not any(k in tx for k in ("gas_price", "max_fee_per_gas", "max_priority_fee_per_gas"))


def _to_wire(value: Any) -> Any:
    """eth-tester's Python values -> JSON-RPC wire values (hex quantities and data)."""
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return value
    if isinstance(value, int):
        return hex(value)
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    if isinstance(value, dict):
        return {k: _to_wire(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_wire(v) for v in value]
    return value


def _from_wire_tx(tx: dict[str, Any]) -> dict[str, Any]:
    tx = dict(tx)
    if "input" in tx and "data" not in tx:  # newer clients name calldata "input"
        tx["data"] = tx.pop("input")
    tx.pop("input", None)
    tx.setdefault("from", _ZERO_ADDRESS)
    return {k: v for k, v in tx.items() if v is not None}


class _DevnetProvider(BaseProvider):
    """web3 provider that answers from `EvmDevnet.rpc`, exactly as an HTTP client would see."""

    def __init__(self, devnet: EvmDevnet) -> None:
        super().__init__()
        self._devnet = devnet

    def make_request(self, method: RPCEndpoint, params: Any) -> RPCResponse:
        # Round-trip through JSON so in-process callers send what an HTTP client would.
        wire_params = json.loads(Web3.to_json(list(params)))
        return jsonrpc.response(self._devnet.rpc(str(method), wire_params), 1)  # type: ignore[return-value]

    def is_connected(self, show_traceback: bool = False) -> bool:
        return True


class _DevnetFacilitatorSigner(ResilientFacilitatorWeb3Signer):
    """paywire's production signer (the SDK's, nonce-reset fix), on the in-process chain.

    FacilitatorWeb3Signer only takes an RPC URL; constructing it with an unused URL and then
    swapping its `_w3` keeps every signer method (nonce reservation, fixed gas limit, receipt
    checks) the production code, untouched.
    """

    def __init__(self, private_key: str, devnet: EvmDevnet) -> None:
        super().__init__(private_key, rpc_url="http://127.0.0.1:0/unused")
        self._w3 = Web3(_DevnetProvider(devnet))
        self._w3.middleware_onion.inject(ExtraDataToPOAMiddleware, layer=0)


class EvmDevnet:
    """An in-process Base Sepolia look-alike with DevUSDC at the Base Sepolia USDC address."""

    CHAIN_ID = 84532
    NETWORK = "eip155:84532"
    USDC_ADDRESS = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"

    def __init__(
        self,
        *,
        facilitator_key: str,
        minter_key: str,
        genesis_accounts: Mapping[str, Mapping[str, Any]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Build the chain. Keys are hex private keys; both accounts get ETH for gas.

        `genesis_accounts` adds genesis accounts by address (fields `balance`, `nonce`, `code`
        bytes, `storage` {slot: value}), replacing a default one at the same address: e.g.
        another token's runtime code at USDC_ADDRESS. `clock` (unix seconds) stamps blocks;
        tests move it by hand instead of sleeping.
        """
        self._clock = clock
        self._facilitator: LocalAccount = Account.from_key(facilitator_key)
        self._minter: LocalAccount = Account.from_key(minter_key)
        # Fresh per devnet and never exposed: pays for fund_gas() and transfer() top-ups.
        self._faucet: LocalAccount = Account.create()
        self._lock = threading.RLock()
        self._artifact = load_artifact()

        def eoa(balance: int) -> dict[str, Any]:
            return {"balance": balance, "nonce": 0, "code": b"", "storage": {}}

        def contract(code: bytes, storage: dict[int, int] | None = None) -> dict[str, Any]:
            # Runtime code set without running a constructor (nonce 1, as CREATE leaves it).
            return {"balance": 0, "nonce": 1, "code": code, "storage": storage or {}}

        contracts = devnet_contracts()
        genesis_state = {
            to_canonical_address(self._facilitator.address): eoa(_GAS_ETH),
            to_canonical_address(self._minter.address): eoa(_GAS_ETH),
            to_canonical_address(self._faucet.address): eoa(_FAUCET_ETH),
            # Runtime code + the minter slot: a deployed token without running a constructor.
            to_canonical_address(self.USDC_ADDRESS): contract(
                bytes.fromhex(self._artifact["deployedBytecode"][2:]),
                {int(self._artifact["minterSlot"]): int(self._minter.address, 16)},
            ),
            to_canonical_address(CREATE2_DEPLOYER): contract(CREATE2_DEPLOYER_CODE),
        }
        for address, code in contracts.preset_code().items():
            genesis_state[to_canonical_address(address)] = contract(code)
        for address, account in (genesis_accounts or {}).items():
            genesis_state[to_canonical_address(address)] = {**eoa(0), **account}
        backend = _DevnetBackend(
            chain_id=self.CHAIN_ID,
            genesis_state=genesis_state,
            genesis_timestamp=int(clock()),
        )
        self._tester = EthereumTester(backend)
        self._backend = backend
        # sender -> nonce -> raw tx: a node's "queued" pool for transactions sent ahead of a
        # nonce gap (the SDK signer reserves nonces under a lock but broadcasts outside it).
        self._queued: dict[bytes, dict[int, bytes]] = {}
        self._endpoints = self._build_endpoints()
        self._w3 = Web3(_DevnetProvider(self))
        self._token = self._w3.eth.contract(address=self.USDC_ADDRESS, abi=self._artifact["abi"])
        self._signer: ResilientFacilitatorWeb3Signer | None = None
        replaced = frozenset(to_checksum_address(a) for a in genesis_accounts or {})
        self._install_permit2(contracts, replaced)
        contracts.check_installed(lambda address: bytes(self._w3.eth.get_code(address)), skip=replaced)

    # ---- public API ----

    @property
    def w3(self) -> Web3:
        """In-process Web3 over the chain (every request goes through `rpc`, under the lock)."""
        return self._w3

    @property
    def minter_address(self) -> str:
        return self._minter.address

    def rpc(self, method: str, params: list[Any]) -> jsonrpc.Answer:
        """Answer one JSON-RPC call: `{"result": ...}` or `{"error": ...}`, in wire format."""
        namespace, _, _ = method.partition("_")
        handler = self._endpoints.get(method)
        served = namespace in _SERVED_NAMESPACES or method in _MINING_METHODS
        if not served or method in _UNSERVED_METHODS or handler is None:
            return jsonrpc.error(
                jsonrpc.METHOD_NOT_FOUND, f"the method {method} does not exist/is not available"
            )
        try:
            with self._lock:
                self._keep_clock()
                return jsonrpc.result(handler(list(params or [])))
        except (_RevertError, TransactionFailed) as exc:
            data = exc.data if isinstance(exc, _RevertError) else _failed_data(exc)
            message = _revert_message(data) if data else f"execution reverted: {exc}"
            return jsonrpc.error(3, message, "0x" + data.hex())
        except NotImplementedError:
            return jsonrpc.error(jsonrpc.METHOD_NOT_FOUND, f"the method {method} is not implemented")
        except _InvalidParams as exc:
            return jsonrpc.error(jsonrpc.INVALID_PARAMS, str(exc))
        except Exception as exc:  # validation errors: bad nonce, no funds, malformed params
            return jsonrpc.error(-32000, str(exc) or type(exc).__name__)

    def facilitator_signer(self) -> FacilitatorEvmSigner:
        """The SDK's FacilitatorWeb3Signer for the facilitator key, talking to this chain."""
        with self._lock:
            if self._signer is None:
                self._signer = _DevnetFacilitatorSigner(self._facilitator.key.hex(), self)
            return self._signer

    def mint(self, to: str, amount: int) -> str:
        """Mint `amount` atomic USDC to `to` (a real minter transaction); returns its hash."""
        call = self._token.functions.mint(to_checksum_address(to), int(amount))
        return self._send(self._minter, call)

    def balance_of(self, address: str) -> int:
        """USDC balance (atomic units) of `address`."""
        return int(self._token.functions.balanceOf(to_checksum_address(address)).call())

    def eth_balance(self, address: str) -> int:
        return int(self._w3.eth.get_balance(to_checksum_address(address)))

    def fund_gas(self, address: str, wei: int) -> str:
        """Send `wei` of ETH from the devnet faucet to `address`; returns the transaction hash."""
        with self._lock:
            tx: dict[str, Any] = {
                "from": self._faucet.address,
                "to": to_checksum_address(address),
                "value": int(wei),
                "nonce": self._w3.eth.get_transaction_count(self._faucet.address, "pending"),
                "chainId": self.CHAIN_ID,
                **self._fees(),
            }
            tx["gas"] = self._w3.eth.estimate_gas(tx)  # 21k for an EOA, more for a contract
            return self._broadcast(self._faucet, tx)

    def transfer(self, private_key: str, to: str, amount: int) -> str:
        """Plain ERC-20 transfer signed by `private_key`; tops up its gas from the faucet."""
        account: LocalAccount = Account.from_key(private_key)
        call = self._token.functions.transfer(to_checksum_address(to), int(amount))
        with self._lock:
            if self.eth_balance(account.address) < _TOP_UP_WEI // 10:
                self.fund_gas(account.address, _TOP_UP_WEI)
            return self._send(account, call)

    # ---- internals ----

    def _install_permit2(self, contracts: DevnetContracts, replaced: frozenset[str]) -> None:
        """Deploy Permit2 as every real network did: CREATE2 through Arachnid's proxy.

        A transaction (2 M gas, milliseconds here) rather than runtime code in the genesis state:
        Permit2's own constructor fills its immutables (chain id, EIP-712 domain separator), so
        no copy of that logic lives here and the code is what any chain 84532 would hold.
        """
        if contracts.permit2 is None or replaced & {PERMIT2_ADDRESS, CREATE2_DEPLOYER}:
            return
        with self._lock:
            tx: dict[str, Any] = {
                **contracts.permit2.deploy_transaction(),
                "from": self._faucet.address,
                "nonce": self._w3.eth.get_transaction_count(self._faucet.address, "pending"),
                "chainId": self.CHAIN_ID,
                **self._fees(),
            }
            self._broadcast(self._faucet, tx)

    def _send(self, account: LocalAccount, call: Any) -> str:
        # Held across nonce lookup and broadcast so concurrent helpers never share a nonce.
        with self._lock:
            tx = call.build_transaction(
                {
                    "from": account.address,
                    "nonce": self._w3.eth.get_transaction_count(account.address, "pending"),
                    "chainId": self.CHAIN_ID,
                    **self._fees(),
                }
            )
            return self._broadcast(account, tx)

    def _fees(self) -> dict[str, int]:
        base_fee = int(self._w3.eth.get_block("latest")["baseFeePerGas"])
        tip = 10**6
        return {"maxFeePerGas": 2 * base_fee + tip, "maxPriorityFeePerGas": tip}

    def _broadcast(self, account: LocalAccount, tx: dict[str, Any]) -> str:
        signed = account.sign_transaction(tx)
        tx_hash = self._w3.eth.send_raw_transaction(signed.raw_transaction)
        try:
            receipt = self._w3.eth.get_transaction_receipt(tx_hash)
        except TransactionNotFound:  # mining is paused: it waits for evm_mine like any other
            return tx_hash.to_0x_hex()
        if receipt["status"] != 1:
            raise RuntimeError(f"devnet transaction {tx_hash.to_0x_hex()} reverted")
        return tx_hash.to_0x_hex()

    def _keep_clock(self) -> None:
        """Keep block timestamps on the devnet clock, as a live chain's are.

        eth-tester only stamps a block when it opens it (right after the previous one was
        mined), and calls run against the last mined block: after an idle spell both are stale
        and EIP-3009 windows (validAfter = now - 600 in most clients) would fail.
        """
        if not self._tester.auto_mine_transactions:
            # Mining is paused: nothing is mined until evm_mine, not even an empty block; an
            # empty pending block still follows the clock.
            if not self._waiting():
                self._stamp_pending_block()
            return
        now = int(self._clock())
        chain = self._backend.chain
        head = chain.get_canonical_head()
        if now - head.timestamp >= BLOCK_TIME_SECONDS:
            # An empty block stamped now, like the ones Base seals every 2 s while we idled.
            chain.header = chain.header.copy(timestamp=now)
            self._tester.mine_blocks(1)
        self._stamp_pending_block()

    def _stamp_pending_block(self) -> None:
        """Stamp the block about to take a transaction with the clock's second.

        eth-tester opens it at max(now, head + 1): one second ahead whenever the head was mined
        this second. Blocks may share a second here (see `_same_second_blocks`), so the head's
        own second is as early as it may go, and a clock behind the head (a test's) never
        stamps a block before its parent.
        """
        chain = self._backend.chain
        stamp = max(chain.get_canonical_head().timestamp, int(self._clock()))
        if chain.header.timestamp != stamp:
            chain.header = chain.header.copy(timestamp=stamp)

    def _send_raw_transaction(self, raw_hex: str) -> str:
        """Mine a transaction now if its nonce is next, else hold it until the gap fills.

        eth-tester refuses any nonce but the next one, while real nodes queue future nonces:
        concurrent settlements reserve nonces in order but may broadcast out of order.
        """
        raw = bytes.fromhex(raw_hex.removeprefix("0x"))
        tx = self._backend.chain.get_vm().get_transaction_builder().decode(raw)
        sender, tx_hash = tx.sender, "0x" + tx.hash.hex()
        expected = self._backend.chain.get_vm().state.get_nonce(sender)
        if tx.nonce < expected:
            raise ValueError(f"nonce too low: next nonce {expected}, tx nonce {tx.nonce}")
        if tx.nonce > expected:
            queue = self._queued.setdefault(sender, {})
            if tx.nonce not in queue and len(queue) >= _MAX_QUEUED_PER_SENDER:
                raise ValueError("txpool is full for this sender")
            queue[tx.nonce] = raw
            return tx_hash
        self._admit(raw)
        queue = self._queued.get(sender, {})
        nonce = tx.nonce + 1
        while nonce in queue:
            self._stamp_pending_block()  # each is mined in a block of its own
            try:
                self._admit(queue.pop(nonce))
            except Exception:
                break  # invalid now (e.g. out of gas money): dropped, as a node would
            nonce += 1
        if not queue:
            self._queued.pop(sender, None)
        return tx_hash

    def _admit(self, raw: bytes) -> None:
        """Mine a transaction whose nonce is next (automine), or add it to the pending block."""
        if self._tester.auto_mine_transactions:
            self._tester.send_raw_transaction("0x" + raw.hex())
        else:
            # Straight into the pending block, where the "pending" nonce and the next
            # transaction's checks see it (eth-tester's pool would snapshot and revert it).
            self._backend.send_raw_transaction(raw)

    def _waiting(self) -> set[bytes]:
        """Hashes of the transactions in the pending block (waiting for evm_mine)."""
        return {tx.hash for tx in self._backend.chain.get_block().transactions}

    def _set_automine(self, params: list[Any]) -> None:
        if len(params) != 1 or not isinstance(params[0], bool):
            raise _InvalidParams("evm_setAutomine takes one boolean")
        if params[0] and not self._tester.auto_mine_transactions:
            self._tester.enable_auto_mine_transactions()  # mines what waits, in one block
        elif not params[0]:
            self._tester.disable_auto_mine_transactions()

    def _mine(self, params: list[Any]) -> str:
        if any(p is not None for p in params):
            raise _InvalidParams("evm_mine takes no parameters here: blocks carry the clock's second")
        self._tester.mine_blocks(1)
        return "0x0"

    def _receipt(self, params: list[Any], formatted: Callable[[list[Any]], Any]) -> Any:
        """No receipt for a transaction that waits in the pending block, as a node answers."""
        if params and isinstance(params[0], str):
            try:
                waiting = bytes.fromhex(params[0].removeprefix("0x")) in self._waiting()
            except ValueError:
                waiting = False
            if waiting:
                return None
        return formatted(params)

    def _build_endpoints(self) -> dict[str, Callable[[list[Any]], Any]]:
        tester = self._tester
        overrides: dict[str, Callable[..., Any]] = {
            "eth_chainId": static_return(self.CHAIN_ID),
            "net_version": static_return(str(self.CHAIN_ID)),
            "web3_clientVersion": static_return("paywire-devnet/py-evm"),
            "eth_sendRawTransaction": lambda _, params: self._send_raw_transaction(params[0]),
        }
        endpoints: dict[str, Callable[[list[Any]], Any]] = {}
        for namespace, methods in API_ENDPOINTS.items():
            if namespace not in _SERVED_NAMESPACES:
                continue
            for name, delegator in methods.items():
                method = f"{namespace}_{name}"
                endpoints[method] = _endpoint(method, overrides.get(method, delegator), tester)
        receipt = endpoints["eth_getTransactionReceipt"]
        endpoints["eth_getTransactionReceipt"] = lambda params: self._receipt(params, receipt)
        endpoints["evm_setAutomine"] = self._set_automine
        endpoints["evm_mine"] = self._mine
        return endpoints


def _endpoint(
    method: str, delegator: Callable[..., Any], tester: EthereumTester
) -> Callable[[list[Any]], Any]:
    """Wire params -> eth-tester call -> wire result, with web3's own eth-tester formatters."""
    request_formatter = request_formatters.get(RPCEndpoint(method))
    result_formatter = (result_formatters or {}).get(RPCEndpoint(method))
    takes_tx = method in ("eth_call", "eth_estimateGas")

    def run(params: list[Any]) -> Any:
        if takes_tx and params and isinstance(params[0], dict):
            params = [_from_wire_tx(params[0]), *params[1:]]
            if len(params) > 2:  # state overrides are not supported; ignore like a light node
                params = params[:2]
        if request_formatter is not None:
            params = request_formatter(params)
        result = delegator(tester, params)
        if result_formatter is not None:
            result = result_formatter(result)
        return _to_wire(_geth_shape(result))

    return run


def _geth_shape(result: Any) -> Any:
    """Drop eth-tester-only fields that strict clients trip on (log `type`, receipt root)."""
    if isinstance(result, dict):
        if "logs" in result:  # a receipt
            result = {k: v for k, v in result.items() if k != "state_root"}
            result["logs"] = [_geth_log(log) for log in result["logs"]]
        return result
    if isinstance(result, list | tuple) and result and isinstance(result[0], dict):
        if "topics" in result[0]:
            return [_geth_log(log) for log in result]
    return result


def _geth_log(log: Any) -> Any:
    if not isinstance(log, dict):
        return log
    log = {k: v for k, v in log.items() if k != "type"}
    log.setdefault("removed", False)
    return log


def _failed_data(exc: TransactionFailed) -> bytes:
    """Revert bytes from eth-tester's TransactionFailed (estimateGas wraps py-evm's Revert)."""
    arg: Any = exc.args[0] if exc.args else b""
    while isinstance(arg, Exception):
        arg = arg.args[0] if arg.args else b""
    return arg if isinstance(arg, bytes) else b""
