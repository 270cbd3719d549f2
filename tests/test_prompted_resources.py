"""The four `prompted` resources (error-explain, changelog-generate, release-notes-generate,
restaurant-review-sentiment) paid on the devnet, their model served by the OpenAI stand-in with
scripted answers: the rendered prompt and a json_schema response_format go upstream, the answer is
validated, a bad answer is retried once, a second bad answer or an upstream failure is not
charged, bad input and a missing provider key are refused before any quote. Plus the `prompted`
kind's checker and its run-time rules, on a stand-in model skill."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from skills.errors import SkillUnavailableError, UpstreamError, UpstreamRejected
from skills.kinds import prompted
from skills.models.catalog import load_catalog
from skills.models.chat import validate_chat
from skills.resource_context import ResourceContext
from skills.resource_files import BUILTIN_DIR, check_resource, skill_from_resource
from skills.skill import Operation, Skill, SkillResult
from skills.tokens import estimate_messages
from tests.support.live_server import LiveServer, start_server
from tests.support.openai_upstream import OpenAIUpstream, word_tokens
from tests.support.paying import EVM_NET, client_for, header, post_paid, quote, receipt, sign

PRICES = {  # atomic USDC (6 decimals)
    "error-explain": 62101,
    "changelog-generate": 37260,
    "release-notes-generate": 37260,
    "restaurant-review-sentiment": 11500,
}
REVIEW = ("The pasta was superb and the tiramisu even better, but we waited 40 minutes for a "
          "table and the waiter never apologised. A bit pricey for the portions.")
INPUTS: dict[str, dict[str, Any]] = {
    "error-explain": {
        "error": "Traceback (most recent call last):\n  File \"shop/cart.py\", line 42, in total\n"
                 "    return sum(i.price for i in items)\n"
                 "AttributeError: 'NoneType' object has no attribute 'price'",
        "language": "python",
        "context": "items comes from cart.load(user_id)",
    },
    "changelog-generate": {
        "commits": ["feat: add CSV export (#41)", "fix: crash on empty input",
                    "ci: cache pip downloads", "feat!: drop Node 16 support"],
        "version": "1.4.0",
        "date": "2025-06-30",
    },
    "release-notes-generate": {
        "changes": ["Add dark mode", "Fix login timeout after 5 minutes",
                    "Remove the legacy v1 export API; use /v2/export"],
        "version": "2.1.0",
        "product": "Acme Notes",
        "audience": "workspace administrators",
    },
    "restaurant-review-sentiment": {"review": REVIEW},
}
ANSWERS: dict[str, dict[str, Any]] = {  # what the scripted model answers: valid for the schema
    "error-explain": {
        "summary": "A None ended up in items: one element has no price attribute.",
        "error_type": "AttributeError",
        "language": "python",
        "likely_causes": [{"cause": "cart.load returns None entries for deleted products",
                           "likelihood": "high"}],
        "where_to_look": [{"location": "shop/cart.py:42 in total",
                           "reason": "where the None element is dereferenced"}],
        "fixes": [{"description": "Skip missing products when summing",
                   "code": "return sum(i.price for i in items if i is not None)"}],
        "checks": ["print(items) before the sum"],
        "confidence": "high",
    },
    "changelog-generate": {
        "version": "1.4.0",
        "date": "2025-06-30",
        "sections": {"Added": ["CSV export (#41)"], "Changed": [], "Deprecated": [],
                     "Removed": ["BREAKING: Node 16 support"], "Fixed": ["Crash on empty input"],
                     "Security": []},
        "omitted": ["ci: cache pip downloads"],
    },
    "release-notes-generate": {
        "title": "Acme Notes 2.1.0",
        "summary": "Dark mode arrives and sign-in is more reliable.",
        "highlights": [{"title": "Dark mode", "description": "Easier on the eyes at night."}],
        "sections": [{"heading": "Bug fixes", "items": ["You no longer get signed out after "
                                                        "5 minutes."]}],
        "breaking_changes": [{"change": "The v1 export API is gone.",
                              "action": "Point your integrations at /v2/export."}],
        "upgrade_notes": [],
    },
    "restaurant-review-sentiment": {
        "overall": {"polarity": "mixed", "score": 0.1,
                    "summary": "Excellent food let down by the wait and the service."},
        "aspects": [
            {"aspect": "food", "polarity": "positive", "score": 0.9,
             "evidence": ["The pasta was superb", "the tiramisu even better"]},
            {"aspect": "wait_time", "polarity": "negative", "score": -0.7,
             "evidence": ["we waited 40 minutes for a table"]},
            {"aspect": "service", "polarity": "negative", "score": -0.5,
             "evidence": ["the waiter never apologised"]},
            {"aspect": "price", "polarity": "negative", "score": -0.3,
             "evidence": ["A bit pricey for the portions"]},
        ],
    },
}


def _invalid(resource: str) -> dict[str, Any]:
    """A well-formed JSON answer the output schema refuses (an enum, a range, a required key...)."""
    answer = json.loads(json.dumps(ANSWERS[resource]))
    if resource == "error-explain":
        answer["likely_causes"][0]["likelihood"] = "certain"
    elif resource == "changelog-generate":
        del answer["sections"]["Security"]
    elif resource == "release-notes-generate":
        answer["highlights"][0]["emoji"] = "sparkles"
    else:
        answer["aspects"][0]["score"] = 1.5
    return answer


def _file(resource: str) -> dict[str, Any]:
    return json.loads(Path(BUILTIN_DIR, f"{resource}.json").read_text())


RESOURCES = sorted(PRICES)
SPEC = load_catalog().models["gpt-4o-mini"]


# ---------------------------------------------------------------- one gateway for the module

@pytest.fixture(scope="module")
def upstream() -> Iterator[OpenAIUpstream]:
    with OpenAIUpstream("openai") as up:
        yield up


@pytest.fixture(scope="module")
def gateway(upstream: OpenAIUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("prompted"), env={
        "OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": "sk-test"})
    yield live
    live.stop()


@pytest.fixture(autouse=True)
def _reset(request: pytest.FixtureRequest) -> None:
    if "upstream" in request.fixturenames:
        request.getfixturevalue("upstream").reset()


def _url(gateway: LiveServer, resource: str) -> str:
    return f"{gateway.url}/v1/marketplace/api/{resource}"


def _pay(gateway: LiveServer, resource: str, body: dict[str, Any]) -> httpx.Response:
    _, required = quote(_url(gateway, resource), body)
    assert required.accepts[0].amount == str(PRICES[resource])
    client = client_for(gateway.url, evm_key=gateway.devnet.keys.evm_payer)
    return post_paid(_url(gateway, resource), body, header(sign(client, required, EVM_NET)))


def _balance(gateway: LiveServer) -> int:
    return int(gateway.devnet.merchant_balances().evm)


def _chats(upstream: OpenAIUpstream) -> list[Any]:
    return upstream.requests_to("/chat/completions")


def _cost(sent: Any, answer_text: str) -> Decimal:
    """What the stand-in's usage for one call costs at gpt-4o-mini's upstream prices."""
    prompt = word_tokens(" ".join(m["content"] for m in sent.json["messages"]))
    usd = (prompt * SPEC.prices.input_per_mtok
           + word_tokens(answer_text) * SPEC.prices.output_per_mtok) / 1_000_000
    return SPEC.upstream_cost(usd)


def _last_row(gateway: LiveServer, resource: str) -> dict[str, Any]:
    return gateway.ledger_rows(skill_id=resource)[-1]


# ---------------------------------------------------------------- paid calls

@pytest.mark.parametrize("resource", RESOURCES)
def test_a_paid_call_answers_the_models_validated_json(
    gateway: LiveServer, upstream: OpenAIUpstream, resource: str
) -> None:
    text = json.dumps(ANSWERS[resource])
    upstream.behaviour.reply(text)
    before = _balance(gateway)
    r = _pay(gateway, resource, INPUTS[resource])
    assert r.status_code == 200, r.text
    assert r.json() == ANSWERS[resource]
    assert receipt(r)["success"] is True
    assert _balance(gateway) - before == PRICES[resource]

    settings = _file(resource)["prompted"]
    [sent] = _chats(upstream)
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.json["model"] == "gpt-4o-mini" and sent.json["stream"] is False
    assert sent.json["max_tokens"] == settings["max_tokens"]
    system, user = sent.json["messages"]
    assert system == {"role": "system", "content": settings["system"]}
    assert user == {"role": "user", "content": prompted.render(settings["prompt"], INPUTS[resource])}
    for value in INPUTS[resource].values():  # the caller's input reached the model
        assert (value if isinstance(value, str) else json.dumps(value)) in user["content"]
    assert sent.json["response_format"] == {"type": "json_schema", "json_schema": {
        "name": resource, "schema": settings["output_schema"]}}

    row = _last_row(gateway, resource)
    assert row["state"] == "settled" and row["amount_atomic"] == PRICES[resource]
    usage = row["usage"]
    assert usage["model"] == "gpt-4o-mini" and usage["attempts"] == 1
    [call] = usage["calls"]
    assert call["provider"] == "openai" and call["completion_tokens"] == word_tokens(text)
    assert Decimal(row["upstream_cost_usd"]) == _cost(sent, text)
    assert Decimal(row["upstream_cost_usd"]) < Decimal(PRICES[resource]) / 1_000_000 / 10


@pytest.mark.parametrize("resource", RESOURCES)
def test_an_invalid_answer_is_retried_once_with_the_problem_explained(
    gateway: LiveServer, upstream: OpenAIUpstream, resource: str
) -> None:
    bad, good = json.dumps(_invalid(resource)), json.dumps(ANSWERS[resource])
    upstream.behaviour.reply(bad, good)
    before = _balance(gateway)
    r = _pay(gateway, resource, INPUTS[resource])
    assert r.status_code == 200, r.text
    assert r.json() == ANSWERS[resource]
    assert _balance(gateway) - before == PRICES[resource]
    first, second = _chats(upstream)
    assert second.json["messages"][:2] == first.json["messages"]
    assert second.json["messages"][2] == {"role": "assistant", "content": bad}
    retry = second.json["messages"][3]
    assert retry["role"] == "user" and retry["content"].startswith("That answer is not valid: at ")
    assert second.json["response_format"] == first.json["response_format"]
    row = _last_row(gateway, resource)
    usage = row["usage"]
    assert row["state"] == "settled" and usage["attempts"] == 2 and len(usage["calls"]) == 2
    assert Decimal(row["upstream_cost_usd"]) == _cost(first, bad) + _cost(second, good)


@pytest.mark.parametrize("resource", RESOURCES)
def test_two_invalid_answers_are_a_502_and_nothing_is_charged(
    gateway: LiveServer, upstream: OpenAIUpstream, resource: str
) -> None:
    prose, invalid = "Sure! Here is the analysis you asked for.", json.dumps(_invalid(resource))
    upstream.behaviour.reply(prose, invalid)
    before = _balance(gateway)
    r = _pay(gateway, resource, INPUTS[resource])
    assert r.status_code == 502, r.text
    message = r.json()["error"]["message"]
    assert "no valid answer" in message and "nothing was charged" in message
    assert "PAYMENT-RESPONSE" not in r.headers
    assert _balance(gateway) == before
    assert len(_chats(upstream)) == 2
    assert "it is not JSON" in _chats(upstream)[1].json["messages"][-1]["content"]
    row = _last_row(gateway, resource)
    assert row["state"] == "released" and "two attempts" in row["error"]
    # not charged, but what the model cost the operator is on the row
    first, second = _chats(upstream)
    assert row["usage"]["attempts"] == 2
    assert Decimal(row["upstream_cost_usd"]) == _cost(first, prose) + _cost(second, invalid) > 0


@pytest.mark.parametrize("resource", RESOURCES)
def test_an_upstream_failure_is_not_charged(
    gateway: LiveServer, upstream: OpenAIUpstream, resource: str
) -> None:
    upstream.behaviour.fail(500, 500)  # the first try and its one retry
    upstream.behaviour.reply(json.dumps(ANSWERS[resource]))  # never reached
    before = _balance(gateway)
    r = _pay(gateway, resource, INPUTS[resource])
    assert r.status_code == 502, r.text
    assert "nothing was charged" in r.json()["error"]["message"]
    assert "PAYMENT-RESPONSE" not in r.headers
    assert _balance(gateway) == before
    assert [q.status for q in _chats(upstream)] == [500, 500]
    assert _last_row(gateway, resource)["state"] == "released"


BAD_INPUTS = [
    ("error-explain", {"language": "python"}, "error"),  # missing
    ("error-explain", {"error": "x" * 50_001}, "error"),
    ("error-explain", {"error": "boom", "language": ["python"]}, "language"),
    ("error-explain", {"error": "boom", "stack": "more"}, "stack"),  # unexpected
    ("changelog-generate", {"version": "1.0.0"}, "commits"),
    ("changelog-generate", {"commits": []}, "commits"),
    ("changelog-generate", {"commits": ["feat: x"] * 201}, "commits"),
    ("changelog-generate", {"commits": ["y" * 251]}, "commits.0"),
    ("changelog-generate", {"commits": "feat: x"}, "commits"),
    ("changelog-generate", {"commits": ["feat: x"], "date": "30/06/2025"}, "date"),
    ("release-notes-generate", {"product": "Acme"}, "changes"),
    ("release-notes-generate", {"changes": ["Add dark mode"], "product": "p" * 101}, "product"),
    ("release-notes-generate", {"changes": [42]}, "changes.0"),
    ("restaurant-review-sentiment", {"text": REVIEW}, "text"),  # unexpected, then missing
    ("restaurant-review-sentiment", {"review": ""}, "review"),
    ("restaurant-review-sentiment", {"review": "r" * 10_001}, "review"),
    ("restaurant-review-sentiment", {"review": 5}, "review"),
]


@pytest.mark.parametrize(("resource", "body", "param"), BAD_INPUTS)
def test_bad_input_is_refused_before_the_quote(
    gateway: LiveServer, upstream: OpenAIUpstream, resource: str, body: dict[str, Any],
    param: str
) -> None:
    r = httpx.post(_url(gateway, resource), json=body)
    assert r.status_code == 400, r.text
    assert "PAYMENT-REQUIRED" not in r.headers
    assert r.json()["error"]["param"] == param
    assert _chats(upstream) == []


@pytest.mark.parametrize("resource", RESOURCES)
def test_without_a_provider_key_the_resource_is_503_before_any_quote(
    server: LiveServer, resource: str
) -> None:
    # the session gateway has no model provider configured
    r = httpx.post(_url(server, resource), json=INPUTS[resource])
    assert r.status_code == 503, r.text
    assert "OPENAI_API_KEY" in r.json()["error"]["message"]
    assert "PAYMENT-REQUIRED" not in r.headers


# ---------------------------------------------------------------- the resource files

@pytest.mark.parametrize("resource", RESOURCES)
def test_the_files_pass_the_checker_and_their_examples_and_answers_fit(resource: str) -> None:
    data = _file(resource)
    assert check_resource(data) == []
    assert data["kind"] == "prompted" and data["prompted"]["model"] == "gpt-4o-mini"
    assert data["prompted"]["model_env"].startswith("PAYWIRE_")
    skill = skill_from_resource(data, resource)
    for example in (*data["examples"], INPUTS[resource]):
        skill.validate(example)
    schema = Draft202012Validator(data["prompted"]["output_schema"])
    assert list(schema.iter_errors(ANSWERS[resource])) == []
    assert list(schema.iter_errors(_invalid(resource)))
    assert data["input_schema"]["additionalProperties"] is False


def test_review_evidence_is_quoted_from_the_review() -> None:
    # the contract the prompt asks for (the kind checks the schema only; see the report)
    for aspect in ANSWERS["restaurant-review-sentiment"]["aspects"]:
        assert all(quote_ in REVIEW for quote_ in aspect["evidence"])


def _filler(length: int) -> str:
    unit = 'File "/srv/app/handlers/user_profile.py", line 1234, in get_user_profile\n'
    return (unit * (length // len(unit) + 1))[:length]


def _largest_input(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, spec in data["input_schema"]["properties"].items():
        if spec["type"] == "array":
            out[name] = [_filler(spec["items"]["maxLength"])] * spec["maxItems"]
        else:
            out[name] = _filler(spec.get("maxLength", 10))
    return out


@pytest.mark.parametrize("resource", RESOURCES)
def test_the_worst_case_model_cost_is_well_under_the_price(resource: str) -> None:
    """The largest input the schema lets in, two attempts (the retry resends the prompt and the
    first answer), every output token used: under half the price at gpt-4o-mini's prices."""
    data = _file(resource)
    settings = data["prompted"]
    messages = prompted._messages(settings, _largest_input(data))
    prompt = estimate_messages(messages, "gpt-4o-mini").tokens
    out = settings["max_tokens"]
    tokens_in, tokens_out = 2 * prompt + out + 100, 2 * out
    usd = (tokens_in * SPEC.prices.input_per_mtok + tokens_out * SPEC.prices.output_per_mtok) / 1_000_000
    assert usd < Decimal(data["price"]) / 2, (resource, usd)


# ---------------------------------------------------------------- the kind's checker

def _resource(**prompted_settings: Any) -> dict[str, Any]:
    settings = {"model": "gpt-4o-mini", "system": "Be brief.", "prompt": "Topic: {topic}",
                "output_schema": {"type": "object", "required": ["text"],
                                  "properties": {"text": {"type": "string"}}},
                "max_tokens": 50, **prompted_settings}
    return {"id": "test-prompted", "name": "T", "description": "D", "categories": ["General"],
            "price": "0.01", "method": "POST", "kind": "prompted", "prompted": settings,
            "input_schema": {"type": "object", "required": ["topic"],
                             "properties": {"topic": {"type": "string", "maxLength": 100}}}}


def test_check_accepts_a_good_file() -> None:
    assert prompted.check(_resource()) == []
    assert prompted.check(_resource(temperature=0)) == []  # deterministic answers are allowed


@pytest.mark.parametrize(("change", "expected"), [
    ({"prompt": "Topic: {topic} in {tone}"},
     "field 'prompted.prompt' uses {tone}, which is not a property of 'input_schema' "
     "(properties: topic)"),
    ({"output_schema": {"type": "nope"}}, "field 'prompted.output_schema' is not a valid JSON Schema"),
    ({"output_schema": ["text"]}, "field 'prompted.output_schema' must be a JSON Schema object"),
    ({"max_tokens": 0}, "field 'prompted.max_tokens' must be a whole number from 1 to 100000"),
    ({"temperature": 2.5}, "field 'prompted.temperature' must be a number from 0 to 2"),
    ({"model": ""}, "field 'prompted.model' must be a non-empty string"),
])
def test_check_names_each_problem(change: dict[str, Any], expected: str) -> None:
    [problem] = prompted.check(_resource(**change))
    assert problem.startswith(expected)


def test_check_without_settings_or_with_a_broken_input_schema() -> None:
    data = _resource()
    del data["prompted"]
    assert prompted.check(data) == ["kind 'prompted' needs field 'prompted': "
                                    "{model, system, prompt, output_schema, ...}"]
    broken = {**_resource(), "input_schema": ["topic"]}  # reported by check_resource, no crash here
    assert prompted.check(broken) == [
        "field 'prompted.prompt' uses {topic}, which is not a property of 'input_schema' "
        "(properties: none)"]
    assert any("input_schema" in p for p in check_resource(broken))


# ---------------------------------------------------------------- the kind's run-time rules

class FakeModel:
    """A chat model skill whose answers are scripted: (content, finish_reason) per call."""

    def __init__(self, *answers: tuple[str | None, str] | Exception,
                 max_output_tokens: int = 1000) -> None:
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []
        spec = replace(SPEC, id="fake-chat", max_output_tokens=max_output_tokens,
                       default_max_tokens=min(SPEC.default_max_tokens or 1, max_output_tokens))

        async def run(body: dict[str, Any]) -> SkillResult:
            self.requests.append(body)
            answer = self.answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            content, finish = answer
            message = {"role": "assistant", "content": content,
                       "refusal": "I can't help with that." if content is None else None}
            return SkillResult(body={"choices": [{"message": message, "finish_reason": finish}]},
                               usage={"completion_tokens": 3}, upstream_cost_usd=Decimal("0.0001"))

        def price(body: dict[str, Any]) -> Decimal:
            return Decimal("0.001")

        self.skill = Skill(id="fake-chat", name="Fake", description="A fake chat model",
                           categories=("Llm",), run=run, kind="model", operations={
                               "chat.completions": Operation(
                                   "chat.completions", run, price,
                                   lambda body: validate_chat(body, spec))})


def _built(fake: FakeModel, environ: dict[str, str] | None = None, **settings: Any) -> Skill:
    data = _resource(**{"model": "fake-chat", "model_env": "TEST_PROMPTED_MODEL", **settings})
    context = ResourceContext(environ=environ or {},
                              find_skill=lambda sid: fake.skill if sid == "fake-chat" else None)
    return skill_from_resource(data, "test", context)


def _run(skill: Skill, payload: dict[str, Any]) -> SkillResult:
    return asyncio.run(skill.run(payload))


def test_a_fenced_answer_is_accepted_and_absent_fields_render_empty() -> None:
    model = FakeModel(('```json\n{"text": "ok"}\n```', "stop"))
    result = _run(_built(model), {"topic": "tea"})
    assert result.body == {"text": "ok"} and result.usage is not None
    assert result.usage["attempts"] == 1 and result.upstream_cost_usd == Decimal("0.0001")
    assert model.requests[0]["messages"][1]["content"] == "Topic: tea"
    assert prompted.render("{a}|{b}|{c}", {"a": "x", "c": ["y"]}) == 'x||["y"]'


def test_a_truncated_answer_is_retried_asking_for_less() -> None:
    model = FakeModel(('{"text": "a very long', "length"), ('{"text": "short"}', "stop"))
    assert _run(_built(model), {"topic": "tea"}).body == {"text": "short"}
    retry = model.requests[1]["messages"][-1]["content"]
    assert "cut off at the 50-token limit" in retry and "shorter answer" in retry


def test_a_refusal_and_nan_are_invalid_answers() -> None:
    model = FakeModel((None, "stop"), ('{"text": NaN}', "stop"))
    with pytest.raises(UpstreamError) as failed:
        _run(_built(model), {"topic": "tea"})
    assert type(failed.value) is UpstreamError and "NaN is not a JSON number" in failed.value.message
    assert model.requests[1]["messages"][2] == {"role": "assistant",
                                                "content": "(refused: I can't help with that.)"}


def test_a_failed_call_still_reports_what_its_attempts_spent_upstream() -> None:
    model = FakeModel(("not json", "stop"), ("still not json", "stop"))
    with pytest.raises(UpstreamError) as invalid:
        _run(_built(model), {"topic": "tea"})
    assert invalid.value.usage is not None and invalid.value.usage["attempts"] == 2
    assert len(invalid.value.usage["calls"]) == 2
    assert invalid.value.upstream_cost_usd == Decimal("0.0002")
    # the retry's upstream fails: the first attempt's spending is kept on the error
    model = FakeModel(("not json", "stop"), UpstreamError("upstream answered 500"))
    with pytest.raises(UpstreamError) as broken:
        _run(_built(model), {"topic": "tea"})
    assert broken.value.message == "upstream answered 500"
    assert broken.value.usage == {"model": "fake-chat", "attempts": 2,  # the second got no answer
                                  "calls": [{"completion_tokens": 3}]}
    assert broken.value.upstream_cost_usd == Decimal("0.0001")
    # a first attempt that fails outright spent nothing
    model = FakeModel(UpstreamError("upstream answered 500"))
    with pytest.raises(UpstreamError) as first:
        _run(_built(model), {"topic": "tea"})
    assert first.value.usage is None and first.value.upstream_cost_usd is None


def test_a_model_refusing_the_resources_request_is_a_setup_problem_not_the_callers() -> None:
    refused = UpstreamRejected("Unsupported parameter: 'temperature' is not supported with this model.")
    with pytest.raises(UpstreamError) as failed:
        _run(_built(FakeModel(refused)), {"topic": "tea"})
    assert type(failed.value) is UpstreamError  # a plain failure: the pipeline answers 502
    message = failed.value.message
    assert "model 'fake-chat' refused the request" in message and "TEST_PROMPTED_MODEL" in message
    assert "'temperature' is not supported" in message


def test_a_long_schema_problem_is_shortened() -> None:
    too_long = json.dumps({"text": "z" * 5000})  # the schema error quotes the whole value
    model = FakeModel((too_long, "stop"), (too_long, "stop"))
    with pytest.raises(UpstreamError) as failed:
        _run(_built(model, output_schema={"type": "object", "properties": {
            "text": {"type": "string", "maxLength": 10}}}), {"topic": "tea"})
    assert len(model.requests[1]["messages"][-1]["content"]) < 700
    assert len(failed.value.message) < 700


def test_an_evidence_quote_not_in_the_input_is_retried() -> None:
    schema = {"type": "object", "properties": {"quotes": {"type": "array", "items": {"type": "string"}}}}
    invented = json.dumps({"quotes": ["the tea was \u201cgreat\u201d", "best ever"]})
    fixed = json.dumps({"quotes": ["The  TEA was \"great\""]})  # case, spacing, quote marks may differ
    model = FakeModel((invented, "stop"), (fixed, "stop"))
    skill = _built(model, output_schema=schema, quoted_from={"quotes/*": "topic"})
    assert _run(skill, {"topic": 'the tea was "great", really'}).body == json.loads(fixed)
    retry = model.requests[1]["messages"][-1]["content"]
    assert "at quotes/1: 'best ever' is not quoted word for word from the input's 'topic'" in retry
    assert prompted.check(_resource(quoted_from={"x/*": "nope"})) == [
        "field 'prompted.quoted_from' names input field 'nope', which is not a property of 'input_schema'"]


def test_the_model_override_and_its_readiness() -> None:
    model = FakeModel(('{"text": "ok"}', "stop"), max_output_tokens=1000)
    skill = _built(model)
    assert skill.price({"topic": "tea"}) == Decimal("0.01")  # ready: the model is there
    with pytest.raises(SkillUnavailableError, match="model 'gpt-9' is not in this gateway's"):
        _built(model, {"TEST_PROMPTED_MODEL": "gpt-9"}).price({"topic": "tea"})
    with pytest.raises(SkillUnavailableError, match="misconfigured for model 'fake-chat'.*max_tokens"):
        _built(FakeModel(max_output_tokens=10)).price({"topic": "tea"})
    overridden = _built(model, {"TEST_PROMPTED_MODEL": "fake-chat"}, model="gpt-4o-mini")
    assert _run(overridden, {"topic": "tea"}).usage == {
        "model": "fake-chat", "attempts": 1, "calls": [{"completion_tokens": 3}]}


def test_the_stand_in_plays_scripted_replies_in_order_then_its_fixed_text(
    upstream: OpenAIUpstream
) -> None:
    upstream.behaviour.reply('{"a":  1, "b": 2}', "second")

    def chat(max_tokens: int) -> dict[str, Any]:
        body = {"model": "gpt-4o-mini", "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": "two words"}]}
        return httpx.post(f"{upstream.url}/chat/completions", json=body).json()

    cut, second, fixed = chat(2), chat(50), chat(50)
    assert cut["choices"][0]["message"]["content"] == '{"a":  1,'  # spacing kept, cut at 2 words
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["usage"]["completion_tokens"] == 2 and cut["usage"]["prompt_tokens"] == 2
    assert second["choices"][0]["message"]["content"] == "second"
    assert fixed["choices"][0]["message"]["content"] == "Hello from openai. 1 2 3"
    assert upstream.behaviour.replies == []
