"""Facilitators: in process (the SDK's facilitator with our signers) or remote (a URL)."""

from __future__ import annotations

from typing import Any

from x402 import x402FacilitatorSync
from x402.http import FacilitatorConfig, HTTPFacilitatorClient
from x402.mechanisms.evm.exact import register_exact_evm_facilitator
from x402.mechanisms.svm.exact import register_exact_svm_facilitator

from .networks import NetworkInfo
from .processor import ThreadedFacilitator


def in_process_facilitator(
    networks: list[NetworkInfo],
    *,
    evm_signer: Any | None = None,
    svm_signer: Any | None = None,
) -> ThreadedFacilitator:
    """The SDK's own facilitator, verifying and settling with our keys, off the event loop."""
    facilitator = x402FacilitatorSync()
    evm = [n.caip2 for n in networks if n.family == "evm"]
    svm = [n.caip2 for n in networks if n.family == "svm"]
    if evm:
        if evm_signer is None:
            raise ValueError("an EVM network is configured but no EVM facilitator signer")
        # Simulate again at settle time: a replayed or drained payment is refused before it is
        # broadcast, instead of reverting on chain at the facilitator's gas cost.
        register_exact_evm_facilitator(facilitator, evm_signer, networks=evm,
                                       simulate_in_settle=True)
    if svm:
        if svm_signer is None:
            raise ValueError("a Solana network is configured but no Solana facilitator signer")
        register_exact_svm_facilitator(facilitator, svm_signer, networks=svm)
    return ThreadedFacilitator(facilitator)


def rpc_signers(
    *, evm_key: str = "", evm_rpc_url: str = "", solana_key: str = "", solana_rpc_url: str = ""
) -> tuple[Any | None, Any | None]:
    """Production signers over node RPC URLs (the SDK's own implementations)."""
    evm_signer = svm_signer = None
    if evm_key:
        from .signers import ResilientFacilitatorWeb3Signer

        evm_signer = ResilientFacilitatorWeb3Signer(private_key=evm_key, rpc_url=evm_rpc_url)
    if solana_key:
        from solders.keypair import Keypair

        from .signers import StrictFacilitatorKeypairSigner

        svm_signer = StrictFacilitatorKeypairSigner(
            [Keypair.from_base58_string(solana_key)], rpc_url=solana_rpc_url
        )
    return evm_signer, svm_signer


def remote_facilitator(url: str) -> HTTPFacilitatorClient:
    """A facilitator service reached over HTTP (e.g. a public x402 facilitator)."""
    return HTTPFacilitatorClient(FacilitatorConfig(url=url))
