"""You get what you paid for, not more (issue 9, section 4): a table of requests, each with what was
paid (the quote's amount, from the 402) and what the upstream was asked for (the stand-in's recorded
request body).

Every input the upstream bills is priced before the quote (messages and their names, tools, schemas,
every prompt of a batch; an image model's prompt and input images, a transcription prompt); every
output budget is priced and forwarded as the paid cap, in one field (no uncapped alias): the caller's,
or, when it named none, the one the serving upstream takes (OpenAI: max_completion_tokens, which its
reasoning models require; OpenRouter: max_tokens); fields the upstream would bill beyond that are
refused with a 400 naming them, before any quote: nothing reaches the upstream and nothing is charged,
even with a payment attached. Paid rows really pay on the devnet, over REST and over A2A."""

from __future__ import annotations

import io
import json
import uuid
import wave
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cache
from typing import Any

import httpx
import pytest
from x402.schemas import PaymentRequired

from payments.codec import decode_base64_any
from payments.money import usd_to_atomic
from skills.models import ModelSpec, load_catalog
from skills.models.chat import chat_price
from skills.models.media_ops import UploadedFile, image_price, speech_price, transcription_price
from skills.models.text_ops import completions_price, edits_price
from skills.models.token_quotes import MAX_USD
from skills.tokens import estimate_tokens
from tests.support.model_env import Env
from tests.support.openai_upstream import tiny_png
from tests.support.paying import EVM_NET, client_for, header, post_paid, sign

pytestmark = pytest.mark.usefixtures("reset_upstreams")  # fixtures: tests/support/model_env.py

CHAT, COMPLETIONS, EDITS = "/v1/chat/completions", "/v1/completions", "/v1/edits"
A2A = "a2a"  # a row sent as an A2A message/send data part (operation chat.completions)
M = [{"role": "user", "content": "Say hello to the agents."}]
CAPS = ("max_tokens", "max_completion_tokens")
# The cap's field when the caller names none: each provider's preset (models.json `cap_field`).
DEFAULT_CAP = {"openai": "max_completion_tokens", "openrouter": "max_tokens"}
MILLION = Decimal(1_000_000)


@cache
def _spec(model: str) -> ModelSpec:
    return load_catalog().models[model]


def _tool(i: int, description: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": f"lookup_{i}", "description": description,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}


TOOLS = [_tool(i, f"Look up the weather forecast for a city, variant {i}.") for i in range(6)]
# 128 tools (OpenAI's maximum) of ~6.4 KiB each: ~822 KiB, well over 200k tokens of prompt
HUGE_TOOLS = [_tool(i, " ".join(str(100 + k % 900) for k in range(1640))) for i in range(128)]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "greeting", "strict": True, "schema": {
    "type": "object", "additionalProperties": False, "required": ["greeting", "audience"],
    "properties": {"greeting": {"type": "string", "description": "The greeting itself, one line."},
                   "audience": {"type": "string", "description": "Whom the greeting is for."}}}}}


@dataclass
class Row:
    """One request. `priced_as`: (price function, body) the quote must equal (None: refused with a 400
    naming `refused`). `upstream`: fields the upstream body must carry with these values; `cap`: the
    single cap field it must carry; `default_cap`: no cap field named, so the upstream must carry this
    cap in the one field its provider takes (DEFAULT_CAP); `provider`: the upstream that must serve it;
    `absent`: fields that must not reach it; `files`: multipart files (`body` is then the form's text
    fields)."""

    path: str
    body: dict[str, Any]
    priced_as: tuple[Any, dict[str, Any]] | None = None
    upstream: dict[str, Any] = field(default_factory=dict)
    cap: str | None = None
    absent: tuple[str, ...] = ()
    refused: str | None = None
    model: str = "gpt-4o"
    default_cap: int | None = None
    provider: str | None = None
    files: list[tuple[str, tuple[str, bytes, str]]] | None = None


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": M, **fields}


PAID = {
    # the cap the caller gave is what is paid for and what the upstream gets
    "max_tokens": Row(CHAT, _chat(max_tokens=3000), (chat_price, _chat(max_tokens=3000)),
                      {"max_tokens": 3000}, cap="max_tokens"),
    # null means absent: the model's default budget, paid and forwarded in the upstream's own field
    "max_tokens null": Row(CHAT, _chat(max_tokens=None), (chat_price, _chat(max_tokens=4096)),
                           default_cap=4096),
    "max_completion_tokens null": Row(CHAT, _chat(max_completion_tokens=None),
                                      (chat_price, _chat(max_tokens=4096)), default_cap=4096),
    # no cap: OpenAI's reasoning models refuse max_tokens (the stand-in too), so OpenAI gets
    # max_completion_tokens; an OpenRouter-served model gets max_tokens
    "no cap, an OpenAI reasoning model": Row(
        CHAT, {"model": "o4-mini", "messages": M},
        (chat_price, {"model": "o4-mini", "messages": M, "max_tokens": 4096}),
        {"max_completion_tokens": 4096}, default_cap=4096, provider="openai", model="o4-mini"),
    "no cap, an OpenAI reasoning model, streamed": Row(
        CHAT, {"model": "o4-mini", "messages": M, "stream": True},
        (chat_price, {"model": "o4-mini", "messages": M, "max_tokens": 4096}),
        {"max_completion_tokens": 4096, "stream": True}, default_cap=4096, provider="openai",
        model="o4-mini"),
    "no cap, an OpenRouter-served model": Row(
        CHAT, {"model": "amazon/nova-lite-v1", "messages": M},
        (chat_price, {"model": "amazon/nova-lite-v1", "messages": M, "max_tokens": 4096}),
        {"max_tokens": 4096}, default_cap=4096, provider="openrouter", model="amazon/nova-lite-v1"),
    "edits without a cap, an OpenAI reasoning model": Row(
        EDITS, {"model": "o4-mini", "instruction": "Fix it", "input": "teh cat"},
        (edits_price, {"instruction": "Fix it", "input": "teh cat", "max_tokens": 4096}),
        {"max_completion_tokens": 4096}, default_cap=4096, provider="openai", model="o4-mini"),
    # the caller's field is kept, whoever serves it
    "max_completion_tokens kept on an OpenRouter-served model": Row(
        CHAT, {"model": "amazon/nova-lite-v1", "messages": M, "max_completion_tokens": 500},
        (chat_price, {"model": "amazon/nova-lite-v1", "messages": M, "max_tokens": 500}),
        {"max_completion_tokens": 500}, cap="max_completion_tokens", provider="openrouter",
        model="amazon/nova-lite-v1"),
    # the caller's field carries the cap upstream, alone
    "max_completion_tokens only": Row(CHAT, _chat(max_completion_tokens=3000),
                                      (chat_price, _chat(max_tokens=3000)),
                                      {"max_completion_tokens": 3000}, cap="max_completion_tokens"),
    "max_tokens = max_completion_tokens": Row(
        CHAT, _chat(max_tokens=2500, max_completion_tokens=2500), (chat_price, _chat(max_tokens=2500)),
        {"max_completion_tokens": 2500}, cap="max_completion_tokens"),
    "max_completion_tokens, streamed": Row(
        CHAT, _chat(max_completion_tokens=2000, stream=True), (chat_price, _chat(max_tokens=2000)),
        {"max_completion_tokens": 2000, "stream": True}, cap="max_completion_tokens"),
    # every choice is generated and billed: n x the cap
    "n=3": Row(CHAT, _chat(max_tokens=1000, n=3), (chat_price, _chat(max_tokens=3000)),
               {"max_tokens": 1000, "n": 3}, cap="max_tokens"),
    # tools are prompt: counted, and forwarded with the cap
    "tools": Row(CHAT, _chat(max_tokens=200, tools=TOOLS, tool_choice="auto"),
                 (chat_price, _chat(max_tokens=200, tools=TOOLS)),
                 {"tools": TOOLS, "tool_choice": "auto", "max_tokens": 200}, cap="max_tokens"),
    "response_format json_schema": Row(
        CHAT, _chat(max_tokens=200, response_format=SCHEMA),
        (chat_price, _chat(max_tokens=200, response_format=SCHEMA)),
        {"response_format": SCHEMA, "max_tokens": 200}, cap="max_tokens"),
    "message name": Row(CHAT, _chat(max_tokens=200, messages=[{**M[0], "name": "ops_team_lead"}]),
                        (chat_price, _chat(max_tokens=200, messages=[{**M[0], "name": "ops_team_lead"}])),
                        {"messages": [{**M[0], "name": "ops_team_lead"}], "max_tokens": 200},
                        cap="max_tokens"),
    "reasoning budget inside the cap": Row(
        CHAT, _chat(max_tokens=3000, reasoning={"max_tokens": 1000}), (chat_price, _chat(max_tokens=3000)),
        {"max_tokens": 3000, "reasoning": {"max_tokens": 1000}}, cap="max_tokens"),
    # legacy completions: every prompt of the batch, each with best_of completions up to the cap
    "completions best_of": Row(
        COMPLETIONS, {"model": "gpt-3.5-turbo-instruct", "prompt": "Once upon", "max_tokens": 500,
                      "best_of": 3}, (completions_price, {"prompt": "Once upon", "max_tokens": 1500}),
        {"max_tokens": 500, "best_of": 3}, cap="max_tokens", model="gpt-3.5-turbo-instruct"),
    "completions batch of prompts": Row(
        COMPLETIONS, {"model": "gpt-3.5-turbo-instruct", "prompt": ["One", "Two", "Three"],
                      "max_tokens": 400},
        (completions_price, {"prompt": ["One", "Two", "Three"], "max_tokens": 400}),
        {"prompt": ["One", "Two", "Three"], "max_tokens": 400}, cap="max_tokens",
        model="gpt-3.5-turbo-instruct"),
    "completions max_tokens null": Row(
        COMPLETIONS, {"model": "gpt-3.5-turbo-instruct", "prompt": "Hi", "max_tokens": None},
        (completions_price, {"prompt": "Hi", "max_tokens": 256}), {"max_tokens": 256}, cap="max_tokens",
        model="gpt-3.5-turbo-instruct"),
    # edits run as chat calls: the cap in the caller's field, n choices
    "edits max_completion_tokens, n=2": Row(
        EDITS, {"model": "gpt-4o", "instruction": "Fix it", "input": "teh cat", "max_completion_tokens": 900,
                "n": 2}, (edits_price, {"instruction": "Fix it", "input": "teh cat", "max_tokens": 1800}),
        {"max_completion_tokens": 900, "n": 2}, cap="max_completion_tokens"),
    # over A2A: the same operation, the same cap forwarded (A2A streams from the upstream)
    "A2A max_completion_tokens": Row(
        A2A, {"messages": M, "max_completion_tokens": 3000}, (chat_price, _chat(max_tokens=3000)),
        {"max_completion_tokens": 3000, "stream": True}, cap="max_completion_tokens"),
    "A2A max_tokens null": Row(A2A, {"messages": M, "max_tokens": None}, (chat_price, _chat(max_tokens=4096)),
                               {"stream": True}, default_cap=4096),
}

SPEECH = {"model": "tts-1", "input": "Paywire sells every model per call.", "voice": "alloy"}
IMAGE = {"model": "dall-e-2", "prompt": "a lighthouse at dusk", "size": "256x256"}

REFUSED = {
    # the attack of issue 9: quoted for 1 output token, the upstream would produce 3,000
    "max_tokens=1 + max_completion_tokens=3000": Row(
        CHAT, _chat(max_tokens=1, max_completion_tokens=3000), refused="max_completion_tokens"),
    "822 KiB of tools": Row(CHAT, _chat(max_tokens=1, tools=HUGE_TOOLS), refused="tools"),
    "service_tier priority": Row(CHAT, _chat(service_tier="priority"), refused="service_tier"),
    "prediction": Row(CHAT, _chat(prediction={"type": "content", "content": "Hello agents!"}),
                      refused="prediction"),
    "audio output": Row(CHAT, _chat(modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"}),
                        refused="modalities"),
    "audio": Row(CHAT, _chat(audio={"voice": "alloy", "format": "wav"}), refused="audio"),
    "web_search_options": Row(CHAT, _chat(web_search_options={}), refused="web_search_options"),
    "a built-in tool": Row(CHAT, _chat(tools=[{"type": "web_search_preview"}]), refused="tools.0.type"),
    "an unknown field": Row(CHAT, _chat(extra_body_field=True), refused="extra_body_field"),
    "a message field": Row(CHAT, _chat(messages=[{**M[0], "audio": {"id": "audio_1"}}]),
                           refused="messages.0.audio"),
    "129 tools": Row(CHAT, _chat(tools=[_tool(i, "x") for i in range(129)]), refused="tools"),
    "2049 messages": Row(CHAT, _chat(messages=M * 2049), refused="messages"),
    "a reasoning budget over the cap": Row(CHAT, _chat(max_tokens=100, reasoning={"max_tokens": 5000}),
                                           refused="reasoning.max_tokens"),
    "completions max_completion_tokens": Row(
        COMPLETIONS, {"model": "gpt-3.5-turbo-instruct", "prompt": "Hi", "max_completion_tokens": 3000},
        refused="max_completion_tokens", model="gpt-3.5-turbo-instruct"),
    "edits unknown field": Row(EDITS, {"model": "gpt-4o", "instruction": "Fix", "input": "x", "tools": TOOLS},
                               refused="tools"),
    "embeddings unknown field": Row(
        "/v1/embeddings", {"model": "text-embedding-3-small", "input": "hi", "input_type": "query"},
        refused="input_type", model="text-embedding-3-small"),
    "speech unknown field": Row("/v1/audio/speech", {**SPEECH, "voice_settings": {"stability": 1}},
                                refused="voice_settings", model="tts-1"),
    "images partial_images": Row("/v1/images/generations", {**IMAGE, "partial_images": 3},
                                 refused="partial_images", model="dall-e-2"),
    "images unknown field": Row("/v1/images/generations", {**IMAGE, "seed": 7}, refused="seed",
                                model="dall-e-2"),
    # a token-billed image model prices each input image by its size: one whose size cannot be read is
    # refused, naming its field
    "an image edit with an unreadable image": Row(
        "/v1/images/edits", {"model": "gpt-image-1", "prompt": "x", "quality": "low", "size": "1024x1024"},
        files=[("image[]", ("a.png", tiny_png("a"), "image/png")),
               ("image[]", ("b.gif", b"GIF89a" + bytes(64), "image/gif"))],
        refused="image", model="gpt-image-1"),
    "A2A max_tokens=1 + max_completion_tokens=3000": Row(
        A2A, {"messages": M, "max_tokens": 1, "max_completion_tokens": 3000},
        refused="max_completion_tokens"),
}


# ---------------------------------------------------------------------------------------------- helpers


def _rpc(row: Row) -> dict[str, Any]:
    data = {"skill": row.model, "input": row.body, "operation": "chat.completions"}
    return {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
        "role": "user", "messageId": str(uuid.uuid4()), "parts": [{"kind": "data", "data": data}]}}}


def _send(env: Env, row: Row, headers: dict[str, str] | None = None) -> httpx.Response:
    if row.path == A2A:
        return httpx.post(f"{env.gateway.url}/a2a", json=_rpc(row), headers=headers or {}, timeout=60)
    if row.files is not None:
        return httpx.post(f"{env.gateway.url}{row.path}", data=row.body, files=row.files,
                          headers=headers or {}, timeout=60)
    return httpx.post(f"{env.gateway.url}{row.path}", json=row.body, headers=headers or {}, timeout=60)


def _quote(env: Env, row: Row) -> tuple[int, PaymentRequired]:
    """The quote's amount, read from the v2 header and checked against the v1 body."""
    r = _send(env, row)
    assert r.status_code == 402, r.text
    required = PaymentRequired.model_validate(json.loads(decode_base64_any(r.headers["PAYMENT-REQUIRED"])))
    amounts = {int(a.amount) for a in required.accepts}
    assert amounts == {int(a["maxAmountRequired"]) for a in r.json()["accepts"]}
    [amount] = amounts
    return amount, required


def _payment(env: Env, required: PaymentRequired) -> str:
    payer = client_for(env.gateway.url, evm_key=env.gateway.devnet.keys.evm_payer)
    return header(sign(payer, required, EVM_NET))


def _upstream_path(row: Row) -> str:
    return "/chat/completions" if row.path in (CHAT, EDITS, A2A) else row.path.removeprefix("/v1")


def _served_by(env: Env, sent: Any) -> str:
    return "openai" if any(sent is q for q in env.primary.requests) else "openrouter"


# ---------------------------------------------------------------------------------------------- the table


@pytest.mark.parametrize("name", list(PAID))
def test_what_was_paid_is_what_the_upstream_was_asked_for(env: Env, name: str) -> None:
    row = PAID[name]
    assert row.priced_as is not None and (row.cap is None) != (row.default_cap is None)
    price, reference = row.priced_as
    expected = usd_to_atomic(Decimal(price(reference, _spec(row.model))))
    amount, required = _quote(env, row)
    assert amount == expected  # what was paid
    assert _quote(env, row)[0] == amount  # identical requests, identical quotes
    before = env.balance()
    if row.path == A2A:
        r = _send(env, row, {"PAYMENT-SIGNATURE": _payment(env, required)})
        assert r.status_code == 200 and r.json()["result"]["status"]["state"] == "completed", r.text
    else:
        r = post_paid(f"{env.gateway.url}{row.path}", row.body, _payment(env, required))
        assert r.status_code == 200, r.text
    assert env.balance() - before == amount  # really paid, on the devnet
    [sent] = env.served(_upstream_path(row))  # what the upstream was asked for
    served_by = _served_by(env, sent)
    assert row.provider in (None, served_by)
    for key, value in row.upstream.items():
        assert sent.json[key] == value, (key, sent.json.get(key))
    caps = [cap for cap in CAPS if cap in sent.json]  # one cap, no uncapped alias
    if row.default_cap is not None:  # none named: the serving upstream's own field, at the paid cap
        assert caps == [DEFAULT_CAP[served_by]] and sent.json[caps[0]] == row.default_cap, sent.json
    else:
        assert caps == [row.cap]
    for key in row.absent:
        assert key not in sent.json


def test_the_cap_is_what_the_upstream_honours(env: Env) -> None:
    """The stand-in honours max_completion_tokens as OpenAI and vLLM do: paid for 2 tokens, 2 came."""
    row = Row(CHAT, _chat(max_completion_tokens=2))
    _, required = _quote(env, row)
    r = post_paid(f"{env.gateway.url}{CHAT}", row.body, _payment(env, required))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 2
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_inputs_that_cost_tokens_raise_the_quote(env: Env) -> None:
    base = _quote(env, Row(CHAT, _chat(max_tokens=200)))[0]
    for extra in ({"tools": TOOLS}, {"response_format": SCHEMA},
                  {"messages": [{**M[0], "name": "ops_team_lead"}]}):
        assert _quote(env, Row(CHAT, _chat(max_tokens=200, **extra)))[0] > base, extra
    one = _quote(env, Row(COMPLETIONS, {"model": "gpt-3.5-turbo-instruct", "prompt": "Hi",
                                        "max_tokens": 400}))
    three = _quote(env, Row(COMPLETIONS, {"model": "gpt-3.5-turbo-instruct", "prompt": ["Hi"] * 3,
                                          "max_tokens": 400}))
    assert three[0] > 2 * one[0]
    # speech: the instructions are spoken input too
    long_text = "Paywire sells every model per call. " * 50
    plain = _quote(env, Row("/v1/audio/speech", {**SPEECH, "input": long_text}))[0]
    directed = {**SPEECH, "model": "gpt-4o-mini-tts", "input": long_text, "instructions": long_text}
    assert _quote(env, Row("/v1/audio/speech", directed))[0] == usd_to_atomic(
        speech_price(directed, _spec("gpt-4o-mini-tts")))
    assert usd_to_atomic(speech_price(directed, _spec("gpt-4o-mini-tts"))) > plain


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_is_not_paid_for_is_refused_naming_it(env: Env, name: str) -> None:
    row = REFUSED[name]
    # a payment is attached (signed for the cheapest chat quote): it is not even looked at
    _, required = _quote(env, Row(CHAT, _chat(max_tokens=1), model="gpt-4o"))
    before = env.balance()
    r = _send(env, row, {"PAYMENT-SIGNATURE": _payment(env, required)})
    if row.path == A2A:
        task = r.json()["result"]
        assert task["status"]["state"] == "failed" and row.refused in json.dumps(task["status"])
    else:
        assert r.status_code == 400 and "PAYMENT-REQUIRED" not in r.headers, r.text
        error = r.json()["error"]
        assert error["param"] == row.refused, error
        assert row.refused.split(".")[-1] in error["message"]
    assert env.balance() == before  # nothing charged
    assert env.primary.requests == [] and env.fallback.requests == []  # nothing reached the upstream


def test_huge_tools_say_what_to_shorten(env: Env) -> None:
    body = _chat(max_tokens=1, tools=HUGE_TOOLS)
    assert 800 * 1024 < len(json.dumps(body)) < 1024 * 1024  # ~822 KiB: under the body limit
    r = httpx.post(f"{env.gateway.url}{CHAT}", json=body, timeout=60)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "tools"
    assert f"above the ${MAX_USD} maximum" in error["message"]
    assert "fewer or shorter tools" in error["message"]


def _wav(seconds: float) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(8000)
        w.writeframes(bytes(round(seconds * 8000)))
    return buf.getvalue()


def test_a_form_route_refuses_an_unknown_field_too(env: Env) -> None:
    before = env.balance()
    for fields, param in (({"model": "whisper-1", "diarize": "true"}, "diarize"),
                          ({"model": "dall-e-2", "prompt": "x", "input_fidelity": "high"}, "input_fidelity")):
        path, upload = (("/v1/audio/transcriptions", {"file": ("a.wav", _wav(2.0), "audio/wav")})
                        if "diarize" in fields else
                        ("/v1/images/edits", {"image": ("a.png", tiny_png("a"), "image/png")}))
        r = httpx.post(f"{env.gateway.url}{path}", data=fields, files=upload, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert env.balance() == before
    assert env.primary.requests == [] and env.fallback.requests == []


# ---------------------------------------------------------------------------------------------- media
# Image and transcription models that bill input tokens besides their unit price: the quote adds them.
# `usd` is worked out here from OpenAI's published prices and its image-token rule for GPT Image
# (65 + 129 per 512px tile, after scaling the shortest side down to 512px: image_tokens.py), not by
# the pricing code.


def _tokens(text: str, model: str) -> int:
    return estimate_tokens(text, model).tokens


LONG_PROMPT = ("A lighthouse on a rocky cliff at dusk, waves breaking below, gulls circling the lamp. "
               * 400)[:32000]  # OpenAI's longest gpt-image-1 prompt
SHORT_PROMPT = "A lighthouse at dusk"
EDIT_PROMPT = "Merge the two pictures into one poster"
SQUARE = tiny_png("square", 1024, 1024)  # scaled to 512x512: 1 tile, 65 + 129 = 194 tokens
WIDE = tiny_png("wide", 1536, 1024)  # scaled to 768x512: 2 tiles, 65 + 2 x 129 = 323 tokens
AUDIO = _wav(30.0)
TRANSCRIBE_PROMPT = "Speakers name products: Paywire, x402, USDC, Base Sepolia, OpenRouter, Anvil. " * 10
GPT_IMAGE = {"model": "gpt-image-1", "size": "1024x1024", "quality": "low"}  # $0.011 an image
TEXT_IN, IMAGE_IN = Decimal(5), Decimal(10)  # gpt-image-1: $ per 1M text / image input tokens


@dataclass
class MediaRow:
    """A paid media request: `body` (JSON, or with `files` the form's text fields); `usd`, the quote
    from the published prices; `priced_as`, (price function, body) that must give the same; what the
    upstream must receive: `upstream` fields and `upstream_files` (field, bytes)."""

    path: str
    body: dict[str, Any]
    usd: Decimal
    priced_as: tuple[Any, dict[str, Any]]
    upstream: dict[str, Any]
    files: list[tuple[str, tuple[str, bytes, str]]] | None = None
    upstream_files: list[tuple[str, bytes]] = field(default_factory=list)


def _image_row(prompt: str) -> MediaRow:
    body = {**GPT_IMAGE, "prompt": prompt}
    return MediaRow("/v1/images/generations", body,
                    Decimal("0.011") + _tokens(prompt, "gpt-image-1") * TEXT_IN / MILLION,
                    (image_price, body), {"prompt": prompt, "quality": "low", "size": "1024x1024"})


MEDIA = {
    # the prompt's text tokens on top of the image
    "image, a 32,000-character prompt": _image_row(LONG_PROMPT),
    "image, a short prompt": _image_row(SHORT_PROMPT),
    # edits: every input image's tokens, from its own size
    "image edit, 2 input images": MediaRow(
        "/v1/images/edits", {**GPT_IMAGE, "prompt": EDIT_PROMPT},
        Decimal("0.011") + (_tokens(EDIT_PROMPT, "gpt-image-1") * TEXT_IN + (194 + 323) * IMAGE_IN) / MILLION,
        (image_price, {**GPT_IMAGE, "prompt": EDIT_PROMPT,
                       "image": [UploadedFile(SQUARE, "square.png"), UploadedFile(WIDE, "wide.png")]}),
        {"prompt": EDIT_PROMPT, "quality": "low", "size": "1024x1024"},
        files=[("image[]", ("square.png", SQUARE, "image/png")),
               ("image[]", ("wide.png", WIDE, "image/png"))],
        upstream_files=[("image[]", SQUARE), ("image[]", WIDE)]),
    "image edit, an image and its mask": MediaRow(
        "/v1/images/edits", {**GPT_IMAGE, "prompt": EDIT_PROMPT},
        Decimal("0.011") + (_tokens(EDIT_PROMPT, "gpt-image-1") * TEXT_IN + 2 * 194 * IMAGE_IN) / MILLION,
        (image_price, {**GPT_IMAGE, "prompt": EDIT_PROMPT, "image": UploadedFile(SQUARE, "in.png"),
                       "mask": UploadedFile(SQUARE, "mask.png")}),
        {"prompt": EDIT_PROMPT},
        files=[("image", ("in.png", SQUARE, "image/png")), ("mask", ("mask.png", SQUARE, "image/png"))],
        upstream_files=[("image", SQUARE), ("mask", SQUARE)]),
    # gpt-4o-transcribe bills its prompt as text input tokens ($2.50 per 1M) on top of the audio
    "transcription with a prompt, gpt-4o-transcribe": MediaRow(
        "/v1/audio/transcriptions", {"model": "gpt-4o-transcribe", "prompt": TRANSCRIBE_PROMPT},
        Decimal("0.006") * 30 / 60
        + _tokens(TRANSCRIBE_PROMPT, "gpt-4o-transcribe") * Decimal("2.50") / MILLION,
        (transcription_price, {"model": "gpt-4o-transcribe", "prompt": TRANSCRIBE_PROMPT,
                               "file": UploadedFile(AUDIO, "memo.wav")}),
        {"model": "gpt-4o-transcribe", "prompt": TRANSCRIBE_PROMPT},
        files=[("file", ("memo.wav", AUDIO, "audio/wav"))], upstream_files=[("file", AUDIO)]),
    # whisper-1 bills per minute only: its prompt costs nothing more
    "transcription with a prompt, whisper-1": MediaRow(
        "/v1/audio/transcriptions", {"model": "whisper-1", "prompt": TRANSCRIBE_PROMPT},
        Decimal("0.006") * 30 / 60,
        (transcription_price, {"model": "whisper-1", "prompt": TRANSCRIBE_PROMPT,
                               "file": UploadedFile(AUDIO, "memo.wav")}),
        {"model": "whisper-1", "prompt": TRANSCRIBE_PROMPT},
        files=[("file", ("memo.wav", AUDIO, "audio/wav"))], upstream_files=[("file", AUDIO)]),
}


@pytest.mark.parametrize("name", list(MEDIA))
def test_media_inputs_are_paid_for_and_sent_as_quoted(env: Env, name: str) -> None:
    row = MEDIA[name]
    price, reference = row.priced_as
    assert price(reference, _spec(row.body["model"])) == row.usd  # the route's price: the published one
    request = Row(row.path, row.body, files=row.files, model=row.body["model"])
    amount, required = _quote(env, request)
    assert amount == usd_to_atomic(row.usd)  # what was paid
    before = env.balance()
    r = _send(env, request, {"PAYMENT-SIGNATURE": _payment(env, required)})
    assert r.status_code == 200, r.text
    assert env.balance() - before == amount  # really paid, on the devnet
    [sent] = env.served(row.path.removeprefix("/v1"))  # what the upstream was asked for
    fields = sent.json if row.files is None else sent.form
    for key, value in row.upstream.items():
        assert fields[key] == value, (key, fields.get(key))
    assert [(f.field, f.data) for f in sent.files] == row.upstream_files


def test_a_long_image_prompt_costs_its_extra_tokens(env: Env) -> None:
    long = _quote(env, Row("/v1/images/generations", MEDIA["image, a 32,000-character prompt"].body))[0]
    short = _quote(env, Row("/v1/images/generations", MEDIA["image, a short prompt"].body))[0]
    extra = _tokens(LONG_PROMPT, "gpt-image-1") - _tokens(SHORT_PROMPT, "gpt-image-1")
    assert extra > 6000
    assert long - short == 5 * extra  # $5 per 1M text tokens: 5 atomic units (6 decimals) per token


def test_a_fallback_gets_the_paid_cap_in_its_own_field(env: Env) -> None:
    """One paid call naming no cap: OpenAI (failing) was asked with max_completion_tokens, OpenRouter
    (serving) with max_tokens; the same paid cap each time, charged once."""
    body = {"model": "o4-mini", "messages": M}
    amount, required = _quote(env, Row(CHAT, body, model="o4-mini"))
    assert amount == usd_to_atomic(chat_price({**body, "max_tokens": 4096}, _spec("o4-mini")))
    env.primary.behaviour.fail(503, 503)  # the first try and its retry
    before = env.balance()
    r = post_paid(f"{env.gateway.url}{CHAT}", body, _payment(env, required))
    assert r.status_code == 200, r.text
    assert env.balance() - before == amount
    tried = env.primary.requests_to("/chat/completions")
    [served] = env.fallback.requests_to("/chat/completions")
    assert len(tried) == 2 and all([c for c in CAPS if c in q.json] == ["max_completion_tokens"]
                                   and q.json["max_completion_tokens"] == 4096 for q in tried)
    assert [c for c in CAPS if c in served.json] == ["max_tokens"] and served.json["max_tokens"] == 4096
    assert served.json["model"] == "openai/o4-mini"
