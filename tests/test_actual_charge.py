"""Each call is charged what it used, never more than its quote (`charge_usd`), on the loopback
OpenAI-shaped upstream (tests/support/openai_upstream.py) through the real UpstreamClient.

Every figure comes from the model table's prices (the catalog), never a constant: `_usd` prices
tokens from `spec.prices` as the table gives them (with the long-context tier the input selects).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from decimal import ROUND_CEILING, Decimal
from typing import Any

import pytest

from skills.errors import UpstreamError
from skills.models import ModelSpec, load_catalog
from skills.models.audio_duration import audio_duration
from skills.models.chat import make_chat_operation
from skills.models.media_ops import make_generation_operation, make_image_generation_operation
from skills.models.text_ops import make_completions_operation, make_edits_operation, make_embeddings_operation
from skills.models.token_quotes import MIN_USD
from skills.models.upstream import Target, UpstreamClient
from skills.skill import Operation, StreamUsage
from skills.tokens import estimate_tokens
from tests.support.openai_upstream import OpenAIUpstream, reply_text, running_upstream

CATALOG = load_catalog()
HELLO = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Say hello in one word."}]}
# gpt-4o's own count of HELLO's prompt (o200k_base, exact, chat framing): what it reports
HELLO_PROMPT_TOKENS = 13


@pytest.fixture(scope="module")
def shared() -> Iterator[OpenAIUpstream]:
    with running_upstream("up") as upstream:
        yield upstream


@pytest.fixture
def up(shared: OpenAIUpstream) -> OpenAIUpstream:
    shared.reset()
    return shared


@pytest.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    upstreams = UpstreamClient(backoff_seconds=0)
    yield upstreams
    await upstreams.aclose()


def _spec(model: str) -> ModelSpec:
    return CATALOG.models[model]


def _op(up: OpenAIUpstream, client: UpstreamClient, model: str, factory: Any = make_chat_operation,
        spec: ModelSpec | None = None) -> Operation:
    spec = spec or _spec(model)
    return factory(spec, (Target("openai", up.url, spec.upstreams[0].model, "k"),), client)


def _usd(spec: ModelSpec, prompt: int, completion: int) -> Decimal:
    """The table's token prices for a usage, the tier chosen by the prompt's size, no floor."""
    prices = spec.prices
    in_price, out_price = prices.input_per_mtok or Decimal(0), prices.output_per_mtok or Decimal(0)
    for above, price in prices.input_tiers:
        in_price = price if prompt > above else in_price
    for above, price in prices.output_tiers:
        out_price = price if prompt > above else out_price
    return (prompt * in_price + completion * out_price) / 1_000_000


async def _drain(chunks: AsyncIterator[Any]) -> tuple[list[Any], StreamUsage]:
    events = [chunk async for chunk in chunks]
    assert isinstance(events[-1], StreamUsage) and not any(isinstance(e, StreamUsage) for e in events[:-1])
    return events[:-1], events[-1]


def _content(events: list[Any]) -> str:
    return "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])


# ---------------------------------------------------------------- chat.completions


async def test_a_one_word_answer_is_charged_its_usage_not_its_4096_token_quote(
        up: OpenAIUpstream, client: UpstreamClient) -> None:
    spec, op = _spec("gpt-4o"), _op(up, client, "gpt-4o")
    quote = op.pricer(HELLO)
    # no max_tokens: the quote pays for the model's whole default output budget
    assert spec.default_max_tokens == 4096
    assert quote == _usd(spec, HELLO_PROMPT_TOKENS, 4096)
    assert quote.quantize(Decimal("0.000001"), ROUND_CEILING) == Decimal("0.040993")  # issue 23's figure
    up.behaviour.reply("Hello.")
    up.behaviour.reported_usage = {"prompt_tokens": HELLO_PROMPT_TOKENS, "completion_tokens": 2}

    result = await op.run(dict(HELLO))

    assert result.body["choices"][0]["message"]["content"] == "Hello."
    assert _usd(spec, HELLO_PROMPT_TOKENS, 2) < MIN_USD  # $0.0000525 used: the floor is charged
    assert result.charge_usd == MIN_USD == Decimal("0.0001")
    assert quote / result.charge_usd > 400
    assert result.usage is not None and result.usage["completion_tokens"] == 2
    assert "counted_tokens" not in result.usage  # the upstream's report was used


async def test_usage_equal_to_the_quotes_assumptions_is_charged_exactly_the_quote(
        up: OpenAIUpstream, client: UpstreamClient) -> None:
    spec, op = _spec("gpt-4o"), _op(up, client, "gpt-4o")
    body = {**HELLO, "max_tokens": 50}
    quote = op.pricer(body)
    up.behaviour.reported_usage = {"prompt_tokens": HELLO_PROMPT_TOKENS, "completion_tokens": 50}

    result = await op.run(body)

    assert quote == _usd(spec, HELLO_PROMPT_TOKENS, 50) > MIN_USD
    assert result.charge_usd == quote


async def test_a_usage_above_the_quote_is_capped_at_the_quote(up: OpenAIUpstream,
                                                               client: UpstreamClient) -> None:
    spec, op = _spec("gpt-4o"), _op(up, client, "gpt-4o")
    body = {**HELLO, "max_tokens": 50}
    quote = op.pricer(body)
    # an upstream that counted far more prompt than we did (and more output than the cap)
    up.behaviour.reported_usage = {"prompt_tokens": 900, "completion_tokens": 60}

    result = await op.run(body)

    assert _usd(spec, 900, 60) > quote
    assert result.charge_usd == quote
    assert result.upstream_cost_usd == _usd(spec, 900, 60)  # (our loss: the ledger sees the cost)


async def test_no_usage_reported_is_counted_on_the_answer_with_the_models_tokenizer(
        up: OpenAIUpstream, client: UpstreamClient) -> None:
    spec, op = _spec("gpt-4o"), _op(up, client, "gpt-4o")
    quote = op.pricer(HELLO)
    answer = " ".join(f"Hello number {i}, friend." for i in range(60))
    up.behaviour.reply(answer)
    up.behaviour.report_usage = False

    result = await op.run(dict(HELLO))

    assert "usage" not in result.body
    delivered = result.body["choices"][0]["message"]["content"]
    assert delivered == answer
    output = estimate_tokens(delivered, "gpt-4o").tokens
    assert output > 300  # (so the charge is above the floor)
    assert result.charge_usd == _usd(spec, HELLO_PROMPT_TOKENS, output) < quote
    assert result.usage is not None
    assert result.usage["counted_tokens"] == {"prompt_tokens": HELLO_PROMPT_TOKENS,
                                              "completion_tokens": output}


async def test_a_stream_is_charged_the_usage_its_upstream_reports(up: OpenAIUpstream,
                                                                  client: UpstreamClient) -> None:
    spec, op = _spec("gpt-4o"), _op(up, client, "gpt-4o")
    body = {**HELLO, "stream": True}
    quote = op.pricer(body)
    up.behaviour.reported_usage = {"prompt_tokens": HELLO_PROMPT_TOKENS, "completion_tokens": 300}
    assert op.streamer is not None

    events, used = await _drain(op.streamer(body))

    assert _content(events) == reply_text("up", 4)  # 4 chunks delivered; the report says 300 tokens
    assert all("usage" not in e for e in events)  # the caller did not ask for the report
    assert used.charge_usd == _usd(spec, HELLO_PROMPT_TOKENS, 300) < quote
    assert used.usage is not None and "counted_tokens" not in used.usage


async def test_a_stream_without_a_usage_report_is_charged_its_delivered_text_counted(
        up: OpenAIUpstream, client: UpstreamClient) -> None:
    spec, op = _spec("gpt-4o"), _op(up, client, "gpt-4o")
    body = {**HELLO, "stream": True, "stream_options": {"include_usage": True}}
    up.behaviour.chunks = 400
    up.behaviour.report_usage = False
    assert op.streamer is not None

    events, used = await _drain(op.streamer(body))

    text = _content(events)
    assert text == reply_text("up", 400)
    output = estimate_tokens(text, "gpt-4o").tokens
    assert used.charge_usd == _usd(spec, HELLO_PROMPT_TOKENS, output) > MIN_USD
    assert used.usage is not None
    assert used.usage["counted_tokens"] == {"prompt_tokens": HELLO_PROMPT_TOKENS, "completion_tokens": output}


async def test_a_stream_left_after_n_chunks_is_charged_for_those_chunks(up: OpenAIUpstream,
                                                                        client: UpstreamClient) -> None:
    spec, op = _spec("gpt-4o"), _op(up, client, "gpt-4o")
    body = {**HELLO, "stream": True}
    up.behaviour.chunks = 1000  # its usage report would come after the 1,000th
    assert op.streamer is not None
    stream = op.streamer(body)
    events = []
    async for event in stream:
        events.append(event)
        if len(events) == 201:  # the role chunk, then 200 content chunks
            break
    await stream.aclose()  # type: ignore[attr-defined]  # the caller left

    used = stream.used()  # type: ignore[attr-defined]

    text = _content(events)
    assert text == reply_text("up", 200)
    output = estimate_tokens(text, "gpt-4o").tokens
    assert used.charge_usd == _usd(spec, HELLO_PROMPT_TOKENS, output) > MIN_USD
    assert used.charge_usd < _usd(spec, HELLO_PROMPT_TOKENS, estimate_tokens(reply_text("up", 1000),
                                                                             "gpt-4o").tokens)


async def test_a_stream_its_upstream_cut_short_is_charged_for_the_chunks_it_passed(
        up: OpenAIUpstream, client: UpstreamClient) -> None:
    spec, op = _spec("gpt-4o"), _op(up, client, "gpt-4o")
    up.behaviour.chunks, up.behaviour.break_after = 1000, 300  # the connection drops: no report
    assert op.streamer is not None
    stream = op.streamer({**HELLO, "stream": True})
    events = []
    with pytest.raises(UpstreamError):
        async for event in stream:
            events.append(event)

    used = stream.used()  # type: ignore[attr-defined]

    text = _content(events)
    assert text == reply_text("up", 300)
    output = estimate_tokens(text, "gpt-4o").tokens
    assert used.charge_usd == _usd(spec, HELLO_PROMPT_TOKENS, output) > MIN_USD


async def test_the_long_context_tier_prices_a_usage_above_its_threshold(up: OpenAIUpstream,
                                                                        client: UpstreamClient) -> None:
    spec, op = _spec("gemini-2.5-pro"), _op(up, client, "gemini-2.5-pro")
    [(threshold, tier_price)] = spec.prices.input_tiers
    assert tier_price > (spec.prices.input_per_mtok or 0)
    body = {"model": spec.id, "messages": [{"role": "user", "content": "Summarise the attached."}],
            "max_tokens": 40_000}
    quote = op.pricer(body)
    # the upstream counts the prompt at the threshold: base prices
    up.behaviour.reported_usage = {"prompt_tokens": threshold, "completion_tokens": 5}
    at = await op.run(dict(body))
    # one token more: the whole request pays the tier, which here is above the quote: capped
    up.behaviour.reported_usage = {"prompt_tokens": threshold + 1, "completion_tokens": 5}
    above = await op.run(dict(body))

    base_in, base_out = spec.prices.input_per_mtok or 0, spec.prices.output_per_mtok or 0
    untiered = ((threshold + 1) * base_in + 5 * base_out) / 1_000_000
    assert at.charge_usd == _usd(spec, threshold, 5) < quote
    # under the quote at the base prices, over it at the tier's
    assert untiered < quote < _usd(spec, threshold + 1, 5)
    assert above.charge_usd == quote


async def test_an_edit_without_usage_is_charged_its_answer_counted(up: OpenAIUpstream,
                                                                   client: UpstreamClient) -> None:
    spec, op = _spec("gpt-4o"), _op(up, client, "gpt-4o", make_edits_operation)
    body = {"model": "gpt-4o", "instruction": "Fix the spelling.", "input": "teh cat sat on teh mat"}
    quote = op.pricer(body)
    answer = "The cat sat on the mat. " * 40
    up.behaviour.reply(answer)
    up.behaviour.report_usage = False

    result = await op.run(dict(body))

    assert result.body["choices"][0]["text"] == answer
    assert result.usage is not None
    counted = result.usage["counted_tokens"]
    assert counted["completion_tokens"] == estimate_tokens(answer, "gpt-4o").tokens
    assert quote == _usd(spec, counted["prompt_tokens"], spec.default_max_tokens or 0)  # the input as quoted
    assert result.charge_usd == _usd(spec, counted["prompt_tokens"], counted["completion_tokens"]) < quote


# ---------------------------------------------------------------- completions


async def test_a_completion_is_charged_its_reported_usage(up: OpenAIUpstream,
                                                          client: UpstreamClient) -> None:
    model = "gpt-3.5-turbo-instruct"
    spec, op = _spec(model), _op(up, client, model, make_completions_operation)
    body = {"model": model, "prompt": "Write a haiku about the sea."}
    quote = op.pricer(body)
    prompt = estimate_tokens(body["prompt"], model).tokens
    assert quote == _usd(spec, prompt, spec.default_max_tokens or 0)
    up.behaviour.reported_usage = {"prompt_tokens": prompt, "completion_tokens": 120}

    result = await op.run(dict(body))

    assert result.charge_usd == _usd(spec, prompt, 120) > MIN_USD
    assert result.charge_usd < quote


async def test_an_echoed_completion_without_usage_counts_only_its_output(
        up: OpenAIUpstream, client: UpstreamClient) -> None:
    model = "gpt-3.5-turbo-instruct"
    spec, op = _spec(model), _op(up, client, model, make_completions_operation)
    body = {"model": model, "prompt": "Count slowly, one number after the other: " * 20, "echo": True}
    up.behaviour.chunks = 120
    up.behaviour.report_usage = False

    result = await op.run(dict(body))

    text = result.body["choices"][0]["text"]
    assert text == body["prompt"] + reply_text("up", 120)  # the prompt comes back, then the output
    prompt, output = (estimate_tokens(body["prompt"], model).tokens,
                      estimate_tokens(reply_text("up", 120), model).tokens)
    assert result.charge_usd == _usd(spec, prompt, output) > MIN_USD
    assert result.usage is not None
    assert result.usage["counted_tokens"] == {"prompt_tokens": prompt, "completion_tokens": output}


async def test_a_completion_stream_without_usage_is_charged_its_delivered_text(
        up: OpenAIUpstream, client: UpstreamClient) -> None:
    model = "gpt-3.5-turbo-instruct"
    spec, op = _spec(model), _op(up, client, model, make_completions_operation)
    body = {"model": model, "prompt": "Count to a hundred.", "stream": True}
    up.behaviour.chunks = 80  # (about 160 tokens: under the model's default cap of 256)
    up.behaviour.report_usage = False
    assert op.streamer is not None

    events, used = await _drain(op.streamer(body))

    text = "".join(c["text"] for e in events for c in e["choices"])
    assert text == reply_text("up", 80)
    prompt, output = estimate_tokens(body["prompt"], model).tokens, estimate_tokens(text, model).tokens
    assert used.charge_usd == _usd(spec, prompt, output) > MIN_USD
    assert used.charge_usd < op.pricer(body)


async def test_a_completion_stream_above_its_quote_is_capped(up: OpenAIUpstream,
                                                             client: UpstreamClient) -> None:
    model = "gpt-3.5-turbo-instruct"
    op = _op(up, client, model, make_completions_operation)
    body = {"model": model, "prompt": "Count to ten.", "stream": True, "max_tokens": 10}
    up.behaviour.reported_usage = {"prompt_tokens": 5000, "completion_tokens": 10}
    assert op.streamer is not None

    _, used = await _drain(op.streamer(body))

    assert used.charge_usd == op.pricer(body)


# ---------------------------------------------------------------- embeddings

EMBEDDING_MODEL = "text-embedding-3-small"
LONG_INPUT = [f"paragraph {i}: " + "the quick brown fox jumps over the lazy dog " * 40 for i in range(30)]


async def test_embeddings_are_charged_the_prompt_tokens_reported(up: OpenAIUpstream,
                                                                 client: UpstreamClient) -> None:
    spec, op = _spec(EMBEDDING_MODEL), _op(up, client, EMBEDDING_MODEL, make_embeddings_operation)
    body = {"model": EMBEDDING_MODEL, "input": LONG_INPUT}
    counted = sum(estimate_tokens(text, EMBEDDING_MODEL).tokens for text in LONG_INPUT)
    quote = op.pricer(body)
    assert quote == _usd(spec, counted, 0) > 2 * MIN_USD
    up.behaviour.reported_usage = {"prompt_tokens": counted // 2}

    fewer = await op.run(dict(body))
    up.behaviour.reported_usage = {"prompt_tokens": counted * 2}
    more = await op.run(dict(body))
    up.behaviour.report_usage = False
    unreported = await op.run(dict(body))

    assert fewer.charge_usd == _usd(spec, counted // 2, 0) < quote
    assert more.charge_usd == quote  # capped
    assert unreported.charge_usd == quote  # the input as the quote counted it
    assert unreported.usage is not None
    assert unreported.usage["counted_tokens"] == {"prompt_tokens": counted, "completion_tokens": 0}


# ---------------------------------------------------------------- media


async def test_an_auto_quality_image_is_charged_the_quality_produced(up: OpenAIUpstream,
                                                                     client: UpstreamClient) -> None:
    spec = _spec("gpt-image-1")
    op = _op(up, client, "gpt-image-1", make_image_generation_operation)
    body = {"model": "gpt-image-1", "prompt": "a lighthouse at dusk"}
    quote = op.pricer(body)  # "auto": quoted at the dearest size and quality

    result = await op.run(dict(body))

    assert (result.body["size"], result.body["quality"]) == ("1024x1024", "medium")  # what it picked
    text_tokens = result.body["usage"]["input_tokens_details"]["text_tokens"]
    produced = spec.prices.image_price("1024x1024", "medium")
    assert produced is not None and produced < max(spec.prices.per_image.values())
    assert result.charge_usd == produced + text_tokens * (spec.prices.input_per_mtok or 0) / 1_000_000
    assert result.charge_usd < quote


async def test_sound_whose_length_the_provider_picked_is_charged_its_seconds(
        up: OpenAIUpstream, client: UpstreamClient) -> None:
    table = _spec("elevenlabs/sound-effects")
    # the table's model priced per second only (no price per call): quoted at the longest length
    spec = dataclasses.replace(table, prices=dataclasses.replace(table.prices, per_call=None))
    op = make_generation_operation(spec, (Target("elevenlabs", up.root_url, table.upstreams[0].model, "k"),),
                                   client)
    body = {"model": spec.id, "prompt": "rain on a tin roof"}
    quote = op.pricer(body)

    result = await op.run(dict(body))

    seconds = audio_duration(result.body)
    assert seconds is not None and spec.prices.per_second is not None
    assert result.charge_usd == seconds * spec.prices.per_second < quote
    timed = await op.run({**body, "duration_seconds": 4})
    assert timed.charge_usd is None  # a length asked for: the quote is exact
