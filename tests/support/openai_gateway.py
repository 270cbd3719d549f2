"""A served devnet gateway selling OpenAI's models from a loopback upstream, and a JSON-RPC URL of
its EVM devnet for a payer's signer: what the channel and client tests start per module."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.jsonrpc_http import JsonRpcHttpServer
from tests.support.live_server import LiveServer, start_server
from tests.support.openai_upstream import OpenAIUpstream


@contextmanager
def openai_gateway(data_dir: Path, upstream: OpenAIUpstream, **env: str) -> Iterator[LiveServer]:
    """`paywire serve` on the devnet with `upstream` as OpenAI (and `env` on top)."""
    server = start_server(Path(data_dir), env={
        "OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": "sk-test-openai", **env})
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def evm_rpc_url(gateway: LiveServer) -> Iterator[str]:
    """The gateway's EVM devnet over JSON-RPC on loopback (what the SDK's client signer reads)."""
    with JsonRpcHttpServer(gateway.devnet.evm.rpc) as server:
        yield server.url
