"""The OpenAI-compatible chat route: the official `openai` package paying through an x402
transport, fallback across upstreams, streaming order, cancellation, validation."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from decimal import Decimal

import httpx
import openai
import pytest
from eth_account import Account
from openai import AsyncOpenAI
from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner

from payments.money import usd_to_atomic
from skills.models.catalog import load_catalog
from skills.models.chat import chat_price
from tests.support.live_server import start_server
from tests.support.model_env import Env
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.polling import stream_recorded, until

pytestmark = pytest.mark.usefixtures("reset_upstreams")  # fixtures: tests/support/model_env.py

MESSAGES = [{"role": "user", "content": "Say hello to the agents."}]





def _openai(env: Env) -> AsyncOpenAI:
    payer = x402Client()
    register_exact_evm_client(payer, EthAccountSigner(Account.from_key(env.gateway.devnet.keys.evm_payer)))
    http = httpx.AsyncClient(transport=x402AsyncTransport(payer), timeout=60)
    return AsyncOpenAI(base_url=f"{env.gateway.url}/v1", api_key="not-needed", http_client=http,
                       max_retries=0)


def _quote_atomic(body: dict) -> int:
    spec = load_catalog().models[body["model"]]
    return usd_to_atomic(Decimal(chat_price(body, spec)))


def test_official_openai_client_pays_for_a_chat_completion(env: Env) -> None:
    before = env.gateway.devnet.merchant_balances().evm

    async def go():  # type: ignore[no-untyped-def]
        async with _openai(env) as client:
            return await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES,
                                                        max_tokens=50)

    answer = asyncio.run(go())
    assert answer.model == "gpt-4o-mini" and answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.total_tokens > 0
    expected = _quote_atomic({"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 50})
    assert env.gateway.devnet.merchant_balances().evm - before == expected
    [forwarded] = [r for r in env.primary.requests if r.path.endswith("/chat/completions")]
    assert forwarded.headers["authorization"] == "Bearer sk-test-openai"
    assert forwarded.json["model"] == "gpt-4o-mini" and forwarded.json["messages"] == MESSAGES
    rows = env.gateway.ledger_rows(skill_id="gpt-4o-mini", state="settled")
    usage = rows[-1]["usage"]
    assert usage["provider"] == "openai" and usage["prompt_tokens"] == answer.usage.prompt_tokens


def test_official_openai_client_streams_and_pays(env: Env) -> None:
    before = env.gateway.devnet.merchant_balances().evm

    async def go() -> list:  # type: ignore[type-arg]
        async with _openai(env) as client:
            stream = await client.chat.completions.create(
                model="gpt-4o-mini", messages=MESSAGES, max_tokens=50, stream=True,
                stream_options={"include_usage": True})
            return [chunk async for chunk in stream]

    chunks = asyncio.run(go())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and len([c for c in chunks if c.choices]) >= 2
    assert chunks[-1].usage is not None
    assert env.gateway.devnet.merchant_balances().evm - before > 0
    assert env.primary.stream_finished.is_set()


def _paid_post(env: Env, body: dict, *, stream: bool = False) -> httpx.Response:
    async def go() -> httpx.Response:
        payer = x402Client()
        register_exact_evm_client(payer, EthAccountSigner(
            Account.from_key(env.gateway.devnet.keys.evm_payer)))
        async with httpx.AsyncClient(transport=x402AsyncTransport(payer), timeout=60) as http:
            r = await http.post(f"{env.gateway.url}/v1/chat/completions", json=body)
            await r.aread()
            return r

    return asyncio.run(go())


def test_fallback_to_the_next_upstream_charges_once(env: Env) -> None:
    env.primary.behaviour.fail(500, 500, 500, 500)
    before = env.gateway.devnet.merchant_balances().evm
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 20}
    r = _paid_post(env, body)
    assert r.status_code == 200, r.text
    assert [q.path for q in env.fallback.requests][-1].endswith("/chat/completions")
    assert env.fallback.requests[-1].json["model"] == "openai/gpt-4o-mini"
    assert env.gateway.devnet.merchant_balances().evm - before == _quote_atomic(body)


def test_every_upstream_down_is_502_and_free(env: Env) -> None:
    env.primary.behaviour.fail(*[503] * 10)
    env.fallback.behaviour.fail(*[503] * 10)
    before = env.gateway.devnet.merchant_balances().evm
    r = _paid_post(env, {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 20})
    assert r.status_code == 502
    assert r.json()["error"]["type"] == "server_error"
    assert r.headers["x-should-retry"] == "false"
    assert env.gateway.devnet.merchant_balances().evm == before


def test_upstream_4xx_is_a_400_with_its_message_and_free(env: Env) -> None:
    env.primary.behaviour.fail(400)
    env.fallback.behaviour.fail(400)  # (the primary may be cooling down after the test above)
    before = env.gateway.devnet.merchant_balances().evm
    r = _paid_post(env, {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 20})
    assert r.status_code == 400 and "nothing was charged" in r.json()["error"]["message"]
    assert env.gateway.devnet.merchant_balances().evm == before


def test_stream_first_chunk_arrives_before_the_upstream_finishes_and_disconnect_cancels(
    env: Env,
) -> None:
    gate = threading.Event()  # on both upstreams: an earlier test may have cooled the primary down
    for upstream in (env.primary, env.fallback):
        upstream.behaviour.gate = gate
        upstream.behaviour.chunks = 6

    async def go() -> str:
        payer = x402Client()
        register_exact_evm_client(payer, EthAccountSigner(
            Account.from_key(env.gateway.devnet.keys.evm_payer)))
        async with httpx.AsyncClient(transport=x402AsyncTransport(payer), timeout=60) as http:
            async with http.stream("POST", f"{env.gateway.url}/v1/chat/completions", json={
                    "model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 20,
                    "stream": True}) as response:
                assert response.status_code == 200
                assert response.headers.get("PAYMENT-RESPONSE")
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        # the first chunk is here while the upstream still holds the rest
                        assert not env.primary.stream_finished.is_set()
                        assert not env.fallback.stream_finished.is_set()
                        return line
        raise AssertionError("no chunk")

    first = asyncio.run(go())  # leaving the block drops the connection mid-stream
    assert json.loads(first.removeprefix("data: "))["object"] == "chat.completion.chunk"
    # paywire notices the client left and records a partial delivery for the settled payment...
    deadline = time.monotonic() + 10
    while not any((row["usage"] or {}).get("delivery") == "partial" for row in
                  env.gateway.ledger_rows(skill_id="gpt-4o-mini", state="settled")):
        assert time.monotonic() < deadline, "no partial delivery recorded"
        time.sleep(0.02)  # polling the ledger with a deadline
    # ...and has dropped the upstream request: the upstream finds its client gone when it goes on.
    gate.set()
    while not (env.primary.cancelled.is_set() or env.fallback.cancelled.is_set()):
        assert time.monotonic() < deadline + 10, "the upstream never saw its request cancelled"
        time.sleep(0.02)  # polling two events with a deadline
    assert not (env.primary.stream_finished.is_set() or env.fallback.stream_finished.is_set())


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "gpt-4o-mini", "messages": []}, "messages"),
    ({"model": "gpt-4o-mini", "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"model": "gpt-4o-mini", "messages": MESSAGES, "temperature": 3}, "temperature"),
    ({"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 10**9}, "max_tokens"),
    ({"messages": MESSAGES}, "model"),
])
def test_bad_requests_are_refused_before_any_quote(env: Env, body: dict, param: str) -> None:
    r = httpx.post(f"{env.gateway.url}/v1/chat/completions", json=body)
    assert r.status_code == 400 and "PAYMENT-REQUIRED" not in r.headers
    assert r.json()["error"]["param"] == param


def test_unknown_and_unconfigured_models(env: Env) -> None:
    r = httpx.post(f"{env.gateway.url}/v1/chat/completions",
                   json={"model": "no-such-model", "messages": MESSAGES})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(f"{env.gateway.url}/v1/chat/completions",
                   json={"model": "deepseek-chat", "messages": MESSAGES})
    assert r.status_code == 503 and "DEEPSEEK_API_KEY" in r.json()["error"]["message"]
    models = httpx.get(f"{env.gateway.url}/v1/models").json()
    assert models["object"] == "list"
    by_id = {m["id"]: m for m in models["data"]}  # the models a call can buy
    assert by_id["gpt-4o-mini"]["available"] is True and "deepseek-chat" not in by_id
    deepseek = httpx.get(f"{env.gateway.url}/v1/models/deepseek-chat").json()  # any model, marked
    assert deepseek["available"] is False and "DEEPSEEK_API_KEY" in deepseek["enable_with"]


def test_operator_model_table_and_free_models(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from agent.settings import ConfigError

    table = str(Path(__file__).resolve().parent.parent / "bench" / "models.json")
    with OpenAIUpstream("local").start() as local:
        gateway = start_server(tmp_path / "free", env={
            "PAYWIRE_MODELS_FILE": table, "PAYWIRE_FREE_MODELS": "mock-gpt",
            "LOCAL_LLM_BASE_URL": local.url})
        try:
            r = httpx.post(f"{gateway.url}/v1/chat/completions",
                           json={"model": "mock-gpt", "messages": MESSAGES})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
            assert "PAYMENT-RESPONSE" not in r.headers and gateway.ledger_rows() == []
            ids = [m["id"] for m in httpx.get(f"{gateway.url}/v1/models").json()["data"]]
            assert ids == ["mock-gpt"]
            bad = httpx.post(f"{gateway.url}/v1/chat/completions",
                             json={"model": "mock-gpt", "messages": []})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
        finally:
            gateway.stop()
    with pytest.raises(ConfigError, match="PAYWIRE_FREE_MODELS"):
        start_server(tmp_path / "bad", env={"PAYWIRE_MODELS_FILE": table,
                                            "PAYWIRE_FREE_MODELS": "no-such-model"})


def test_the_quote_covers_every_choice_and_the_upstream_is_capped_at_what_was_paid(env: Env) -> None:
    from payments.codec import decode_base64_any

    def quoted(body: dict) -> int:
        r = httpx.post(f"{env.gateway.url}/v1/chat/completions", json=body)
        assert r.status_code == 402
        return int(json.loads(decode_base64_any(r.headers["PAYMENT-REQUIRED"]))["accepts"][0]["amount"])

    one = quoted({"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 1000})
    three = quoted({"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 1000, "n": 3})
    assert three > 2 * one
    r = _paid_post(env, {"model": "gpt-4o-mini", "messages": MESSAGES})  # no max_tokens given
    assert r.status_code == 200
    [sent] = env.served("/chat/completions")
    # the default cap, in the one field the serving upstream takes (OpenAI: max_completion_tokens)
    field = "max_completion_tokens" if sent in env.primary.requests else "max_tokens"
    assert sent.json[field] == load_catalog().models["gpt-4o-mini"].default_max_tokens
    assert [cap for cap in ("max_tokens", "max_completion_tokens") if cap in sent.json] == [field]


def test_a_stream_records_the_upstreams_usage_even_when_the_caller_did_not_ask_for_it(env: Env) -> None:
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "max_tokens": 30, "stream": True}
    r = _paid_post(env, body)
    assert r.status_code == 200, r.text
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks and all("usage" not in c and c["choices"] for c in chunks)  # as OpenAI sends it
    upstream = [q for q in (*env.primary.requests, *env.fallback.requests)
                if q.path.endswith("/chat/completions")][-1]
    assert upstream.json["stream_options"] == {"include_usage": True}  # asked for the ledger's sake
    row = until(lambda: stream_recorded(lambda: env.gateway.ledger_rows(
        skill_id="gpt-4o-mini", state="settled")), "the stream's end recorded")
    usage = row["usage"]
    assert usage["delivery"] == "complete" and usage["chunks"] == len(chunks)
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    spec = load_catalog().models["gpt-4o-mini"]
    expected = (Decimal(usage["prompt_tokens"]) * spec.prices.input_per_mtok
                + Decimal(usage["completion_tokens"]) * spec.prices.output_per_mtok) / 1_000_000
    assert Decimal(row["upstream_cost_usd"]) == expected.quantize(Decimal("1e-10"))


def test_official_client_lists_and_retrieves_models_with_prices_and_availability(env: Env) -> None:
    async def go():  # type: ignore[no-untyped-def]
        async with _openai(env) as client:
            listed = [m async for m in client.models.list()]
            one = await client.models.retrieve("gpt-4o-mini")
            slashed = await client.models.retrieve("meta-llama/llama-3.3-70b-instruct")
            with pytest.raises(openai.NotFoundError) as missing:
                await client.models.retrieve("no-such-model")
            left_out = [await client.models.retrieve(i) for i in set(catalog) - {m.id for m in listed}]
            return listed, one, slashed, missing.value, left_out

    catalog = load_catalog().models
    listed, one, slashed, missing, left_out = asyncio.run(go())
    # listed: the models a call can buy (each available); the others, retrieved, say why not
    assert {m.id for m in listed} <= set(catalog) and len(listed) == len({m.id for m in listed})
    assert all((m.model_extra or {})["available"] is True for m in listed)
    assert left_out and all((m.model_extra or {})["available"] is False and (m.model_extra or {})["reason"]
                            for m in left_out)
    assert one.id == "gpt-4o-mini" and one.object == "model"
    extra = one.model_extra or {}
    assert extra["available"] is True
    spec = catalog["gpt-4o-mini"]
    assert Decimal(extra["pricing"]["input_per_mtok"]) == spec.prices.input_per_mtok > 0
    assert slashed.id == "meta-llama/llama-3.3-70b-instruct"
    assert missing.status_code == 404 and missing.code == "model_not_found"
    assert missing.param == "model" and "GET /v1/models" in missing.message


def test_a_quote_that_loads_a_tokenizer_does_not_hold_the_event_loop(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first quote of a family loads its tokenizer (0.1-3 s): in a worker thread, so the
    server keeps answering meanwhile, and the quote is the exact one once it is loaded."""
    from skills import family_tokenizers

    model, tokenizer = "qwen/qwen-2.5-72b-instruct", "qwen-2.5"  # served by OpenRouter here
    entry = family_tokenizers.FAMILY_TOKENIZERS[tokenizer]
    loading, release = threading.Event(), threading.Event()

    def held_load():  # type: ignore[no-untyped-def]
        loading.set()
        assert release.wait(timeout=60)
        return entry.load()

    monkeypatch.setattr(family_tokenizers, "_counters", {})  # as in a fresh process
    monkeypatch.setitem(family_tokenizers.FAMILY_TOKENIZERS, tokenizer,
                        dataclasses.replace(entry, load=held_load))
    body = {"model": model, "messages": MESSAGES, "max_tokens": 50}
    quoted: dict[str, httpx.Response] = {}
    quoting = threading.Thread(target=lambda: quoted.setdefault(
        "reply", httpx.post(f"{env.gateway.url}/v1/chat/completions", json=body, timeout=60)))
    quoting.start()
    try:
        assert loading.wait(timeout=30), ("the quote never loaded the tokenizer", quoted)
        # the tokenizer is loading (held): the event loop still answers
        health = httpx.get(f"{env.gateway.url}/healthz", timeout=10)
        assert health.status_code == 200
    finally:
        release.set()
        quoting.join(timeout=60)
    reply = quoted["reply"]
    assert reply.status_code == 402
    assert {int(a["maxAmountRequired"]) for a in reply.json()["accepts"]} == {_quote_atomic(body)}
    assert family_tokenizers.loaded(tokenizer)
