"""Facilitators: in process (the SDK's facilitator with our signers) or remote (a URL)."""

from __future__ import annotations

import socket
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from x402 import x402FacilitatorSync
from x402.http import FacilitatorConfig, HTTPFacilitatorClient
from x402.http.facilitator_client_base import DEFAULT_TIMEOUT
from x402.mechanisms.evm.exact import register_exact_evm_facilitator
from x402.mechanisms.svm.exact import register_exact_svm_facilitator
from x402.schemas import SupportedResponse

from .facilitator_status import FacilitatorMismatch, FacilitatorUnavailable
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


class RemoteFacilitator(HTTPFacilitatorClient):
    """The SDK's HTTP facilitator client, whose `GET /supported` (asked when the processor starts)
    tells a facilitator that is down (FacilitatorUnavailable: ask again later) from a URL that is
    not a facilitator (FacilitatorMismatch: a configuration problem). It is asked with its own,
    shorter timeout: a gateway starting up does not wait long for it."""

    def __init__(self, url: str, *, timeout: float = DEFAULT_TIMEOUT,
                 supported_timeout: float = 10.0) -> None:
        super().__init__(FacilitatorConfig(url=url, timeout=timeout))
        self._supported_url = f"{url.rstrip('/')}/supported"
        self._supported_timeout = min(timeout, supported_timeout)

    def get_supported(self) -> SupportedResponse:
        where = f"GET {_without_userinfo(self._supported_url)}"
        try:
            with httpx.Client(timeout=self._supported_timeout, follow_redirects=True) as client:
                response = client.get(self._supported_url)
        except httpx.HTTPError as exc:
            if _no_such_host(exc):
                raise FacilitatorMismatch(f"{where}: host {urlsplit(self._supported_url).hostname!r} "
                                          "does not exist (its name does not resolve)") from None
            raise FacilitatorUnavailable(f"{where} did not answer ({type(exc).__name__}"
                                         f"{': ' + str(exc) if str(exc) else ''})") from None
        if response.status_code == 429 or response.status_code >= 500:
            raise FacilitatorUnavailable(f"{where} answered {response.status_code}")
        if response.status_code != 200:
            raise FacilitatorMismatch(f"{where} answered {response.status_code}, so it is not an x402 "
                                      "facilitator")
        try:
            return SupportedResponse.model_validate(response.json())
        except ValueError:  # not JSON, or not the x402 shape (pydantic's ValidationError)
            excerpt = " ".join(response.text.split())[:120]
            raise FacilitatorMismatch(f"{where} answered 200 but not with an x402 list of supported "
                                      f"payment kinds ({excerpt!r}), so it is not a facilitator"
                                      ) from None


def _no_such_host(exc: BaseException) -> bool:
    """The name does not resolve at all (not a temporary DNS failure, which is worth retrying)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, socket.gaierror):
            return seen.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME))
        seen = seen.__cause__ or seen.__context__
    return False


def _without_userinfo(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def remote_facilitator(url: str, *, timeout: float = DEFAULT_TIMEOUT) -> RemoteFacilitator:
    """A facilitator service reached over HTTP (e.g. a public x402 facilitator); `timeout` bounds
    each request (verify, settle)."""
    return RemoteFacilitator(url, timeout=timeout)
