"""A model upstream that cannot be reached, and one that is not configured, say where and which
variable: the base URL (never its credentials or query) and the variable that sets it
(OPENAI_BASE_URL, LOCAL_LLM_BASE_URL). A keyless local server counts as configured only once
LOCAL_LLM_BASE_URL is set. A paid call that meets an unreachable upstream charges nothing."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import httpx
import pytest

from skills.errors import UpstreamError, UpstreamTimeout
from skills.models.upstream import Target, UpstreamClient
from tests.support.live_server import LiveServer, start_server
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.paying import EVM_NET, client_for, header, post_paid, quote, sign

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}


@pytest.fixture(scope="module")
def closed_port() -> Iterator[int]:
    """A loopback port bound but not listening: every connection to it is refused, and no other
    process can take it while the module runs."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


# ---- the client's messages ----------------------------------------------------------------------


async def test_a_refused_connection_names_the_url_and_its_variable(closed_port: int) -> None:
    target = Target("openai", f"http://user:pw@127.0.0.1:{closed_port}/v1?api-key=sk-secret",
                    "gpt-4o-mini", base_url_env="OPENAI_BASE_URL")
    client = UpstreamClient(retries_per_upstream=0)
    try:
        with pytest.raises(UpstreamError) as raised:
            await client.request([target], "/chat/completions", json_body=CHAT)
        with pytest.raises(UpstreamError) as streamed:
            async for _ in client.stream([target], "/chat/completions", CHAT):
                pass
    finally:
        await client.aclose()
    for exc in (raised.value, streamed.value):
        assert str(exc) == (f"every upstream failed: openai (http://127.0.0.1:{closed_port}/v1, "
                            "set by OPENAI_BASE_URL) unreachable: connection refused")
        assert not isinstance(exc, UpstreamTimeout)


async def test_a_production_gateway_keeps_the_url_to_its_log(
        closed_port: int, caplog: pytest.LogCaptureFixture) -> None:
    """In production the caller is a stranger: the answer names the provider and the variable,
    and the internal address goes to the operator's log only."""
    target = Target("local", f"http://127.0.0.1:{closed_port}/v1", "llama3.2",
                    base_url_env="LOCAL_LLM_BASE_URL")
    client = UpstreamClient(retries_per_upstream=0, urls_in_errors=False)
    try:
        with caplog.at_level(logging.WARNING, logger="skills.models.upstream"):
            with pytest.raises(UpstreamError) as raised:
                await client.request([target], "/chat/completions", json_body=CHAT)
    finally:
        await client.aclose()
    assert str(raised.value) == ("every upstream failed: local (set by LOCAL_LLM_BASE_URL) "
                                 "unreachable: connection refused")
    assert f"local (http://127.0.0.1:{closed_port}/v1, set by LOCAL_LLM_BASE_URL) unreachable: " \
           "connection refused" in caplog.text


async def test_tls_to_a_plain_server_and_a_timeout_are_named_too() -> None:
    with OpenAIUpstream("plain") as up:
        client = UpstreamClient(retries_per_upstream=0, read_timeout=0.3)
        try:
            tls = Target("local", f"https://127.0.0.1:{up.port}/v1", "llama3.2",
                         base_url_env="LOCAL_LLM_BASE_URL")
            with pytest.raises(UpstreamError, match=rf"local \(https://127.0.0.1:{up.port}/v1, set by "
                                                    r"LOCAL_LLM_BASE_URL\) unreachable: TLS failed"):
                await client.request([tls], "/chat/completions", json_body=CHAT)
            up.behaviour.hang = True
            slow = Target("openai", up.url, "gpt-4o-mini", "k", base_url_env="OPENAI_BASE_URL")
            with pytest.raises(UpstreamTimeout, match=rf"openai \({up.url}, set by OPENAI_BASE_URL\) "
                                                      "timed out"):
                await client.request([slow], "/chat/completions", json_body=CHAT)
        finally:
            await client.aclose()


# ---- a live gateway ----------------------------------------------------------------------------


def test_local_models_are_unavailable_until_their_server_is_configured(server: LiveServer) -> None:
    """The session's devnet gateway sets no LOCAL_LLM_BASE_URL."""
    local = httpx.get(f"{server.url}/v1/models/local/llama3.2").json()  # not listed: not for sale
    assert local["available"] is False and local["enable_with"] == ["LOCAL_LLM_BASE_URL"]
    assert "LOCAL_LLM_BASE_URL" in local["reason"]
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "local/llama3.2", **CHAT})
    assert r.status_code == 503 and "PAYMENT-REQUIRED" not in r.headers  # before any quote
    error = r.json()["error"]
    assert "set LOCAL_LLM_BASE_URL to enable it" in error["message"]


@pytest.fixture(scope="module")
def unreachable(tmp_path_factory: pytest.TempPathFactory, closed_port: int) -> Iterator[LiveServer]:
    gateway = start_server(tmp_path_factory.mktemp("unreachable"), env={
        "OPENAI_API_KEY": "sk-do-not-show", "OPENAI_BASE_URL": f"http://127.0.0.1:{closed_port}/v1",
        "LOCAL_LLM_BASE_URL": f"http://127.0.0.1:{closed_port}/local/v1?token=do-not-show"})
    yield gateway
    gateway.stop()


@pytest.mark.parametrize(("model", "where"), [
    ("gpt-4o-mini", "openai (http://127.0.0.1:{port}/v1, set by OPENAI_BASE_URL) unreachable"),
    ("local/llama3.2", "local (http://127.0.0.1:{port}/local/v1, set by LOCAL_LLM_BASE_URL) "
                       "unreachable"),
], ids=["openai", "local"])
def test_a_paid_call_to_an_unreachable_upstream_names_it_and_charges_nothing(
        unreachable: LiveServer, closed_port: int, model: str, where: str) -> None:
    devnet = unreachable.devnet
    models = {m["id"]: m for m in httpx.get(f"{unreachable.url}/v1/models").json()["data"]}
    assert models[model]["available"] is True
    url, body = f"{unreachable.url}/v1/chat/completions", {"model": model, **CHAT}
    payer = devnet.keys.evm_payer_address
    merchant_before, payer_before = devnet.merchant_balances().evm, devnet.evm.balance_of(payer)
    _, required = quote(url, body)
    payment = sign(client_for(unreachable.url, evm_key=devnet.keys.evm_payer), required, EVM_NET)
    r = post_paid(url, body, header(payment))
    assert r.status_code == 502, r.text
    message = r.json()["error"]["message"]
    assert where.format(port=closed_port) in message and "nothing was charged" in message
    assert "do-not-show" not in r.text
    assert devnet.merchant_balances().evm == merchant_before
    assert devnet.evm.balance_of(payer) == payer_before
    assert [row["state"] for row in unreachable.ledger_rows(skill_id=model)] == ["released"]
