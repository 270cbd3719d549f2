"""Production signer fixes on top of the SDK's own implementations (x402 2.25).

- Solana: `FacilitatorKeypairSigner.confirm_transaction` returns as soon as a transaction is
  confirmed, before looking at its error: a transaction that landed but failed (state changed
  between verify and send) reads as settled, and paywire would deliver a result whose payment
  did not move. `StrictFacilitatorKeypairSigner` checks the error first.
- EVM: `FacilitatorWeb3Signer` reserves a nonce before it builds and broadcasts; if that write
  fails, the reserved nonce is never used and every later settlement waits behind the gap
  (ending as `settlement_pending`). `ResilientFacilitatorWeb3Signer` takes the account nonce
  from the node under a send lock held from the nonce to the node's answer, so a failed send
  leaves no gap and replicas sharing the key never reuse a nonce (`payments/send_lock.py`).

Both note each broadcast in the settlement's `BroadcastTrace` (payments/broadcast_trace.py): the
transaction id before it is sent, then whether the node accepted it.
"""

from __future__ import annotations

import base64
import time
from typing import Any

from solana.rpc.core import RPCException
from solders.message import to_bytes_versioned
from solders.signature import Signature
from solders.transaction import VersionedTransaction
from web3 import Web3
from web3.exceptions import Web3RPCError
from x402.mechanisms.evm.data_suffix import append_data_suffix
from x402.mechanisms.evm.signers import FacilitatorWeb3Signer
from x402.mechanisms.svm.signers import FacilitatorKeypairSigner

from . import failpoints
from .broadcast_trace import broadcasting
from .send_lock import ProcessSendLock, SendLock


class ResilientFacilitatorWeb3Signer(FacilitatorWeb3Signer):
    _send_lock: SendLock | None = None

    def use_send_lock(self, lock: SendLock) -> None:
        """Share the sending of this key with other replicas (the default lock is this
        process's only)."""
        self._send_lock = lock

    def _lock(self) -> SendLock:
        if self._send_lock is None:
            self._send_lock = ProcessSendLock()
        return self._send_lock

    @property
    def send_lock(self) -> SendLock:
        """The lock held from reading this key's nonce to the node's answer on a send (the
        reconciler holds it too, to prove nothing of ours is on its way)."""
        return self._lock()

    def write_contract(self, address: str, abi: list[dict[str, Any]], function_name: str,
                       *args: Any, data_suffix: str | None = None) -> str:
        contract = self._w3.eth.contract(address=Web3.to_checksum_address(address), abi=abi)
        call = getattr(contract.functions, function_name)(*args)
        return self._send({"to": Web3.to_checksum_address(address),
                           "data": call._encode_transaction_data()}, data_suffix)

    def send_transaction(self, to: str, data: bytes) -> str:
        return self._send({"to": Web3.to_checksum_address(to), "data": data}, None)

    def _send(self, tx: dict[str, Any], data_suffix: str | None) -> str:
        tx = {**tx, "from": self._account.address, "gas": self._gas_limit,
              "gasPrice": self._w3.eth.gas_price, "chainId": self.get_chain_id()}
        if data_suffix:
            calldata = tx["data"]
            if isinstance(calldata, bytes | bytearray):
                calldata = "0x" + bytes(calldata).hex()
            tx["data"] = append_data_suffix(calldata, data_suffix)
        with self._lock().held():
            # The node's pending count, read under the lock: every earlier send (any replica's)
            # was accepted or refused by now, so the nonce is the next free one.
            tx["nonce"] = self._w3.eth.get_transaction_count(self._account.address, "pending")
            signed = self._account.sign_transaction(tx)
            tx_hash = "0x" + bytes(signed.hash).hex()
            with broadcasting(tx_hash, Web3RPCError):
                self._w3.eth.send_raw_transaction(signed.raw_transaction)
        failpoints.reached("after_broadcast")
        return tx_hash


class StrictFacilitatorKeypairSigner(FacilitatorKeypairSigner):
    def __init__(self, keypairs: Any, rpc_url: str | None = None, *,
                 confirm_timeout_seconds: float = 30.0) -> None:
        """`confirm_timeout_seconds`: how long `confirm_transaction` waits (the SDK's scheme
        calls it without a timeout, so its own default, 30 s, could not be configured)."""
        super().__init__(keypairs, rpc_url)
        self._confirm_timeout = confirm_timeout_seconds

    def fee_payer_signature(self, tx: VersionedTransaction) -> str | None:
        """The transaction's id once signed by its fee payer, if that key is ours: known before
        anything is sent, so the settlement intent can name it."""
        keypair = self._keypairs.get(str(tx.message.account_keys[0]))
        return str(keypair.sign_message(to_bytes_versioned(tx.message))) if keypair else None

    def send_transaction(self, tx_base64: str, network: str) -> str:
        tx = VersionedTransaction.from_bytes(base64.b64decode(tx_base64))
        with broadcasting(str(tx.signatures[0]), RPCException):
            signature = super().send_transaction(tx_base64, network)
        failpoints.reached("after_broadcast")
        return signature

    def confirm_transaction(self, signature: str, network: str,
                            timeout_seconds: float | None = None) -> None:
        from solders.transaction_status import TransactionConfirmationStatus

        client = self._get_client(network)
        sig = Signature.from_string(signature)
        deadline = time.monotonic() + (
            self._confirm_timeout if timeout_seconds is None else timeout_seconds)
        while time.monotonic() < deadline:
            result = client.get_signature_statuses([sig])
            status = result.value[0] if result.value else None
            if status is not None:
                if status.err:
                    raise RuntimeError(f"Transaction failed: {status.err}")
                if status.confirmation_status in (
                    TransactionConfirmationStatus.Confirmed,
                    TransactionConfirmationStatus.Finalized,
                ):
                    return
            time.sleep(0.5)  # polling a remote node for confirmation
        raise RuntimeError("Transaction confirmation timeout")
