"""/v1/completions, /v1/edits and /v1/embeddings: the official `openai` package (or, for edits, which
it no longer has, an x402-wrapped httpx client) paying on the devnet; quotes, usage in the ledger,
validation before any quote, upstream failures not charged.

Tests do not rely on which upstream served a call: an earlier test's failures may have put the
primary in cooldown, so they look at both stand-ins."""

from __future__ import annotations

import asyncio
import base64
import struct
from decimal import Decimal
from functools import cache
from typing import Any

import httpx
import pytest
from eth_account import Account
from openai import AsyncOpenAI
from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner

from payments.money import usd_to_atomic
from skills.errors import UpstreamError, UpstreamTimeout
from skills.models import ModelSpec, load_catalog
from skills.models.chat import chat_price
from skills.models.text_ops import (
    completions_price,
    edit_messages,
    edits_price,
    embeddings_price,
    make_embeddings_operation,
)
from skills.models.token_quotes import MIN_USD
from skills.models.upstream import Target, UpstreamClient
from tests.support.model_env import Env
from tests.support.openai_upstream import embedding_vector, reply_text
from tests.support.polling import stream_recorded, until

pytestmark = pytest.mark.usefixtures("reset_upstreams")  # fixtures from tests/support/model_env.py

COMPLETION_MODEL = "gpt-3.5-turbo-instruct"
EDIT_MODEL = "gpt-4o-mini"
EMBEDDING_MODEL = "text-embedding-3-small"





@cache
def _spec(model: str) -> ModelSpec:
    return load_catalog().models[model]


def _payer(env: Env) -> x402Client:
    payer = x402Client()
    register_exact_evm_client(payer, EthAccountSigner(Account.from_key(env.gateway.devnet.keys.evm_payer)))
    return payer


def _openai(env: Env) -> AsyncOpenAI:
    http = httpx.AsyncClient(transport=x402AsyncTransport(_payer(env)), timeout=60)
    # openai 3.x annotates httpx2's client; the x402 transport is httpx's, which it accepts at runtime
    return AsyncOpenAI(base_url=f"{env.gateway.url}/v1", api_key="not-needed",
                       http_client=http, max_retries=0)  # type: ignore[arg-type]


def _paid_post(env: Env, path: str, body: dict[str, Any]) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=x402AsyncTransport(_payer(env)), timeout=60) as http:
            return await http.post(f"{env.gateway.url}{path}", json=body)

    return asyncio.run(go())


def _last_usage(env: Env, model: str) -> dict[str, Any]:
    rows = env.gateway.ledger_rows(skill_id=model, state="settled")
    return rows[-1]["usage"]


# ---- completions -----------------------------------------------------------------------------------


def test_completion_paid_through_the_official_client(env: Env) -> None:
    before = env.balance()

    async def go() -> Any:
        async with _openai(env) as client:
            return await client.completions.create(model=COMPLETION_MODEL, prompt="Say this is a test",
                                                   max_tokens=7, temperature=0)

    answer = asyncio.run(go())
    assert answer.object == "text_completion" and answer.model == COMPLETION_MODEL
    assert answer.choices[0].text == reply_text("openai", 4)
    assert answer.usage is not None and answer.usage.prompt_tokens == 5
    quote = completions_price({"prompt": "Say this is a test", "max_tokens": 7}, _spec(COMPLETION_MODEL))
    assert quote == MIN_USD  # 7 output tokens cost less than the route's minimum: charged the minimum
    assert env.balance() - before == usd_to_atomic(quote)
    [forwarded] = env.primary.requests_to("/completions")  # the model has no other upstream
    assert forwarded.json["prompt"] == "Say this is a test" and forwarded.json["stream"] is False
    assert forwarded.headers["authorization"] == "Bearer sk-test-openai"
    usage = _last_usage(env, COMPLETION_MODEL)
    assert usage["provider"] == "openai" and usage["prompt_tokens"] == 5


def test_completion_streams_text_completion_chunks(env: Env) -> None:
    before = env.balance()
    body = {"model": COMPLETION_MODEL, "prompt": ["One", "Two"], "max_tokens": 300, "stream": True,
            "stream_options": {"include_usage": True}}

    async def go() -> list[Any]:
        async with _openai(env) as client:
            stream = await client.completions.create(
                model=COMPLETION_MODEL, prompt=["One", "Two"], max_tokens=300, stream=True,
                stream_options={"include_usage": True})
            return [chunk async for chunk in stream]

    chunks = asyncio.run(go())
    assert all(c.object == "text_completion" and c.model == COMPLETION_MODEL for c in chunks)
    texts = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i)
             for i in (0, 1)]
    assert texts == [reply_text("openai", 4)] * 2  # one completion per prompt
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    quote = completions_price(body, _spec(COMPLETION_MODEL))
    assert quote > MIN_USD
    assert env.balance() - before == usd_to_atomic(quote)
    assert env.primary.stream_finished.is_set()
    row = until(lambda: stream_recorded(lambda: env.gateway.ledger_rows(
        skill_id=COMPLETION_MODEL, state="settled")), "the stream's end recorded")
    assert row["usage"]["delivery"] == "complete"


def test_completion_quote_counts_every_prompt_and_choice() -> None:
    spec = _spec(COMPLETION_MODEL)
    one = completions_price({"prompt": "Hello there", "max_tokens": 1000}, spec)
    four = completions_price({"prompt": ["Hello there", "Hello there"], "n": 2, "max_tokens": 1000}, spec)
    in_price, out_price = spec.prices.token_prices(0)
    assert out_price is not None
    # two prompts: twice the input; two prompts x n=2: four completions of up to 1000 tokens
    assert four - 2 * one == 2 * 1000 * out_price / 1_000_000
    assert completions_price({"prompt": "x", "max_tokens": 10, "best_of": 3}, spec) == max(
        MIN_USD, completions_price({"prompt": "x", "max_tokens": 30}, spec))


def test_completion_above_the_maximum_says_how_to_fit(env: Env) -> None:
    r = httpx.post(f"{env.gateway.url}/v1/completions",
                   json={"model": COMPLETION_MODEL, "prompt": "hi", "max_tokens": 4000, "n": 100})
    assert r.status_code == 400 and "PAYMENT-REQUIRED" not in r.headers
    error = r.json()["error"]
    assert error["param"] == "max_tokens" and "lower max_tokens to" in error["message"]
    fit = int(error["message"].split("lower max_tokens to ")[1].split()[0])
    assert completions_price({"prompt": "hi", "max_tokens": fit, "n": 100}, _spec(COMPLETION_MODEL)) \
        <= Decimal("0.50")


def test_unpaid_request_gets_the_same_quote_every_time(env: Env) -> None:
    body = {"model": COMPLETION_MODEL, "prompt": "Once upon a time", "max_tokens": 500}
    quotes = [httpx.post(f"{env.gateway.url}/v1/completions", json=body) for _ in range(2)]
    assert [q.status_code for q in quotes] == [402, 402]
    amounts = {q.json()["accepts"][0]["maxAmountRequired"] for q in quotes}
    assert amounts == {str(usd_to_atomic(completions_price(body, _spec(COMPLETION_MODEL))))}


# ---- edits -----------------------------------------------------------------------------------------


def test_edit_runs_as_a_chat_call_and_answers_the_edit_shape(env: Env) -> None:
    before = env.balance()
    body = {"model": EDIT_MODEL, "instruction": "Fix the spelling mistakes",
            "input": "What day of the wek is it?", "temperature": 0.5}
    r = _paid_post(env, "/v1/edits", body)
    assert r.status_code == 200, r.text
    assert r.headers.get("PAYMENT-RESPONSE")
    edit = r.json()
    assert set(edit) == {"object", "created", "choices", "usage"}
    assert edit["object"] == "edit" and isinstance(edit["created"], int)
    assert edit["choices"] == [{"text": edit["choices"][0]["text"], "index": 0}]
    assert edit["choices"][0]["text"] in (reply_text("openai", 4), reply_text("openrouter", 4))
    usage = edit["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    [forwarded] = env.served("/chat/completions")
    assert forwarded.json["messages"] == [
        {"role": "system", "content": "Fix the spelling mistakes"},
        {"role": "user", "content": "What day of the wek is it?"}]
    assert forwarded.json["temperature"] == 0.5 and "instruction" not in forwarded.json
    # priced exactly as the chat call it is
    chat_body = {"messages": edit_messages(body)}
    quote = edits_price(body, _spec(EDIT_MODEL))
    assert quote == chat_price(chat_body, _spec(EDIT_MODEL))
    assert env.balance() - before == usd_to_atomic(quote)
    ledger = _last_usage(env, EDIT_MODEL)
    assert ledger["completion_tokens"] == usage["completion_tokens"]
    assert ledger["provider"] in ("openai", "openrouter")


# ---- embeddings ------------------------------------------------------------------------------------


def test_embeddings_float_through_the_official_client(env: Env) -> None:
    before = env.balance()
    texts = ["The food was delicious", "and the waiter was friendly"]

    async def go() -> Any:
        async with _openai(env) as client:
            return await client.embeddings.create(model=EMBEDDING_MODEL, input=texts,
                                                  encoding_format="float", dimensions=8)

    answer = asyncio.run(go())
    assert answer.model == EMBEDDING_MODEL and answer.object == "list"
    assert [d.embedding for d in answer.data] == [embedding_vector(EMBEDDING_MODEL, t, 8) for t in texts]
    assert answer.usage.prompt_tokens == 9  # the stand-in counts words
    quote = embeddings_price({"input": texts}, _spec(EMBEDDING_MODEL))
    assert env.balance() - before == usd_to_atomic(quote)
    [forwarded] = env.primary.requests_to("/embeddings")
    assert forwarded.json["encoding_format"] == "float" and forwarded.json["dimensions"] == 8
    usage = _last_usage(env, EMBEDDING_MODEL)
    assert usage["provider"] == "openai" and usage["prompt_tokens"] == 9


def test_embeddings_base64_is_passed_through(env: Env) -> None:
    big = " ".join(["tokens"] * 12_000)  # enough input to be quoted above the minimum
    before = env.balance()

    async def go() -> Any:
        async with _openai(env) as client:
            return await client.embeddings.create(model=EMBEDDING_MODEL, input=big,
                                                  encoding_format="base64")

    answer = asyncio.run(go())
    raw = answer.data[0].embedding
    assert isinstance(raw, str)  # asked for base64 explicitly: the client leaves it as sent
    decoded = list(struct.unpack(f"<{len(base64.b64decode(raw)) // 4}f", base64.b64decode(raw)))
    assert decoded == embedding_vector(EMBEDDING_MODEL, big, 16)
    quote = embeddings_price({"input": big}, _spec(EMBEDDING_MODEL))
    assert quote > MIN_USD
    assert env.balance() - before == usd_to_atomic(quote)


# ---- refusals --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"model": COMPLETION_MODEL}, "prompt"),
    ("/v1/completions", {"model": COMPLETION_MODEL, "prompt": [1, 2, 3]}, "prompt.0"),
    ("/v1/completions", {"model": COMPLETION_MODEL, "prompt": []}, "prompt"),
    ("/v1/completions", {"model": COMPLETION_MODEL, "prompt": "x", "temperature": 3}, "temperature"),
    ("/v1/completions", {"model": COMPLETION_MODEL, "prompt": "x", "max_tokens": 10**9}, "max_tokens"),
    ("/v1/completions", {"model": COMPLETION_MODEL, "prompt": "x", "n": 0}, "n"),
    ("/v1/completions", {"model": COMPLETION_MODEL, "prompt": "x", "n": 3, "best_of": 2}, "best_of"),
    ("/v1/completions", {"model": COMPLETION_MODEL, "prompt": "x", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": "x"}, "model"),
    ("/v1/completions", {"model": EMBEDDING_MODEL, "prompt": "x"}, "model"),
    ("/v1/edits", {"model": EDIT_MODEL, "input": "x"}, "instruction"),
    ("/v1/edits", {"model": EDIT_MODEL, "instruction": " "}, "instruction"),
    ("/v1/edits", {"model": EDIT_MODEL, "instruction": "x", "input": 5}, "input"),
    ("/v1/edits", {"model": EDIT_MODEL, "instruction": "x", "temperature": -1}, "temperature"),
    ("/v1/edits", {"model": EDIT_MODEL, "instruction": "x", "stream": True}, "stream"),
    ("/v1/embeddings", {"model": EMBEDDING_MODEL}, "input"),
    ("/v1/embeddings", {"model": EMBEDDING_MODEL, "input": ""}, "input"),
    ("/v1/embeddings", {"model": EMBEDDING_MODEL, "input": ["a", ""]}, "input.1"),
    ("/v1/embeddings", {"model": EMBEDDING_MODEL, "input": [[1, 2], [3]]}, "input.0"),
    ("/v1/embeddings", {"model": EMBEDDING_MODEL, "input": "a", "encoding_format": "int8"},
     "encoding_format"),
    ("/v1/embeddings", {"model": EMBEDDING_MODEL, "input": "a", "dimensions": 0}, "dimensions"),
    ("/v1/embeddings", {"model": COMPLETION_MODEL, "input": "a"}, "model"),
])
def test_bad_requests_are_refused_before_any_quote(env: Env, path: str, body: dict[str, Any],
                                                   param: str) -> None:
    r = httpx.post(f"{env.gateway.url}{path}", json=body)
    assert r.status_code == 400 and "PAYMENT-REQUIRED" not in r.headers, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_token_arrays_are_refused_saying_strings_only(env: Env) -> None:
    r = httpx.post(f"{env.gateway.url}/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": [1, 2]})
    assert r.status_code == 400 and "strings only" in r.json()["error"]["message"]


BODIES: dict[str, dict[str, Any]] = {
    "/v1/completions": {"model": COMPLETION_MODEL, "prompt": "Hi", "max_tokens": 5},
    "/v1/edits": {"model": EDIT_MODEL, "instruction": "Shout it", "input": "hi", "max_tokens": 5},
    "/v1/embeddings": {"model": EMBEDDING_MODEL, "input": "hi"},
}


@pytest.mark.parametrize("path", list(BODIES))
def test_upstream_400_is_a_400_with_its_message_and_free(env: Env, path: str) -> None:
    for upstream in (env.primary, env.fallback):
        upstream.behaviour.fail(400)
    before = env.balance()
    r = _paid_post(env, path, BODIES[path])
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "Bad request (injected by the test upstream)." in message and "nothing was charged" in message
    assert env.balance() == before


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("failure", ["5xx", "bad body"])
def test_upstream_failure_is_a_502_and_free(env: Env, path: str, failure: str) -> None:
    for upstream in (env.primary, env.fallback):
        if failure == "5xx":
            upstream.behaviour.fail(*[500] * 4)
        else:
            upstream.behaviour.malformed_next = 4
    before = env.balance()
    r = _paid_post(env, path, BODIES[path])
    assert r.status_code == 502 and r.headers["x-should-retry"] == "false"
    assert r.json()["error"]["type"] == "server_error"
    assert env.balance() == before


def test_upstream_timeout_is_a_504(env: Env) -> None:
    # the gateway's client waits 120 s; an operation on a short-fused client shows the mapping fast
    for upstream in (env.primary, env.fallback):
        upstream.behaviour.delay = 1.0
    targets = [Target("openai", env.primary.url, EMBEDDING_MODEL, "k"),
               Target("openrouter", env.fallback.url, EMBEDDING_MODEL, "k")]

    async def go() -> UpstreamError:
        client = UpstreamClient(read_timeout=0.1, backoff_seconds=0)
        op = make_embeddings_operation(_spec(EMBEDDING_MODEL), targets, client)
        try:
            with pytest.raises(UpstreamError) as caught:
                await op.run({"model": EMBEDDING_MODEL, "input": "hi"})
            return caught.value
        finally:
            await client.aclose()

    assert isinstance(asyncio.run(go()), UpstreamTimeout)  # the pipeline answers 504


def test_edit_through_the_official_clients_generic_post(env: Env) -> None:
    """openai's package dropped `client.edits`; its own `post()` still reaches the route, paid."""
    before = env.balance()
    body = {"model": EDIT_MODEL, "instruction": "Make it shout", "input": "hello agents"}

    async def go() -> Any:
        async with _openai(env) as client:
            return await client.post("/edits", cast_to=object, body=body)

    edit = asyncio.run(go())
    assert edit["object"] == "edit" and edit["choices"][0]["index"] == 0
    assert edit["choices"][0]["text"] in (reply_text("openai", 4), reply_text("openrouter", 4))
    assert env.balance() - before == usd_to_atomic(edits_price(body, _spec(EDIT_MODEL)))
