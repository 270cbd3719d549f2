"""Production signer fixes on top of the SDK's own implementations.

`x402.mechanisms.svm.signers.FacilitatorKeypairSigner.confirm_transaction` (SDK 2.25) returns as
soon as a transaction is confirmed, before looking at its error: a transaction that landed but
failed (state changed between verify and send) reads as settled. paywire would then deliver a
result whose payment did not move. This subclass checks the error first.
"""

from __future__ import annotations

import time

from solders.signature import Signature
from x402.mechanisms.svm.signers import FacilitatorKeypairSigner


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
