"""Production signer fixes on top of the SDK's own implementations (x402 2.25).

- Solana: `FacilitatorKeypairSigner.confirm_transaction` returns as soon as a transaction is
  confirmed, before looking at its error: a transaction that landed but failed (state changed
  between verify and send) reads as settled, and paywire would deliver a result whose payment
  did not move. `StrictFacilitatorKeypairSigner` checks the error first.
- EVM: `FacilitatorWeb3Signer` reserves a nonce before it builds and broadcasts; if that write
  fails, the reserved nonce is never used and every later settlement waits behind the gap
  (ending as `settlement_pending`). `ResilientFacilitatorWeb3Signer` forgets its nonce cursor on
  a failed write, so the next one asks the node again.
"""

from __future__ import annotations

import time
from typing import Any

from solders.signature import Signature
from x402.mechanisms.evm.signers import FacilitatorWeb3Signer
from x402.mechanisms.svm.signers import FacilitatorKeypairSigner


class ResilientFacilitatorWeb3Signer(FacilitatorWeb3Signer):
    def _forget_nonce(self) -> None:
        with self._nonce_lock:
            self._next_nonce = None

    def write_contract(self, address: str, abi: list[dict[str, Any]], function_name: str,
                       *args: Any, data_suffix: str | None = None) -> str:
        try:
            return super().write_contract(address, abi, function_name, *args,
                                          data_suffix=data_suffix)
        except Exception:
            self._forget_nonce()
            raise

    def send_transaction(self, to: str, data: bytes) -> str:
        try:
            return super().send_transaction(to, data)
        except Exception:
            self._forget_nonce()
            raise


class StrictFacilitatorKeypairSigner(FacilitatorKeypairSigner):
    def confirm_transaction(self, signature: str, network: str, timeout_seconds: int = 30) -> None:
        from solders.transaction_status import TransactionConfirmationStatus

        client = self._get_client(network)
        sig = Signature.from_string(signature)
        deadline = time.monotonic() + timeout_seconds
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
