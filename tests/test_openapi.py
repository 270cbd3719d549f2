"""GET /openapi.json on a real gateway (loopback, devnet): a valid OpenAPI 3.1 document, generated
from the registry (every resource's path with its input schema, every paid operation's price as the
one price description), listing exactly the routes the app serves; real answers (a quote, a paid
call on the devnet) conform to it; it says what the server enforces, no looser and no stricter:
schemathesis finds no request the server refuses that it calls valid, nor one it takes that it calls
invalid, nor an answer it does not describe."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import OpenAPIV31SpecValidator, validate

from agent.pipeline.price_terms import route_terms
from payments.codec import decode_base64_any
from skills.models.catalog import DEFAULT_PATH as DEFAULT_MODELS
from tests.support import conformance
from tests.support.live_server import LiveServer, start_server
from tests.support.openai_shapes import SHAPES_FILE, render
from tests.support.openai_upstream import silent_wav
from tests.support.paying import EVM_NET, client_for, header, post_paid, quote, sign
from tests.support.served_process import free_port, paywire_env, start_paywire, stop
from wellknown.openapi import for_generators

# Served but not in the document, each for a reason: the operator's and the devnet's own routes
# (not public), the catalogue page's assets and the data its script reads (the page's implementation;
# the public catalogue is /api/marketplace/apis), and trailing-slash aliases of documented endpoints.
UNDOCUMENTED = {"/metrics", "/admin", "/catalogue/app.js", "/catalogue/style.css", "/catalogue/models",
                "/catalogue/skills/{skill_id}", "/a2a/", "/mcp/"}
UNDOCUMENTED_PREFIXES = ("/devnet",)


# Every model provider and data source configured (placeholder keys), as on a full production gateway:
# each operation is then for sale (a 402), not "not configured here" (503). No call here pays, so no
# upstream is ever contacted with them.
PROVIDERS = ("OPENAI", "OPENROUTER", "ANTHROPIC", "GEMINI", "GROQ", "TOGETHER", "DEEPSEEK", "MISTRAL",
             "XAI", "FIREWORKS", "ELEVENLABS", "NANSEN", "CRYPTOPANIC", "LUNARCRUSH")
CONFIGURED = {f"{name}_API_KEY": "placeholder-key" for name in PROVIDERS} | {
    "LOCAL_LLM_BASE_URL": "http://127.0.0.1:9/v1", "X_BEARER_TOKEN": "placeholder-token",
    "COINGECKO_DEMO_API_KEY": "placeholder-key", "PAYWIRE_METRICS": "true"}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(tmp_path_factory.mktemp("openapi"), env=CONFIGURED)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def document(live: LiveServer) -> dict[str, Any]:
    answer = httpx.get(f"{live.url}/openapi.json", timeout=30)
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    return answer.json()


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            yield path, method, operation


def _validator(document: dict[str, Any], name: str) -> Draft202012Validator:
    """A JSON Schema validator for a component, its refs resolved inside the document."""
    return Draft202012Validator({"$ref": f"#/components/schemas/{name}",
                                 "components": document["components"]})


def test_it_is_a_valid_openapi_3_1_document_of_this_server(live: LiveServer, document: dict[str, Any]
                                                           ) -> None:
    validate(document, cls=OpenAPIV31SpecValidator)
    assert document["openapi"] == "3.1.0" and document["info"]["version"] == "1.0.0"
    assert document["servers"] == [{"url": live.runtime.settings.base_url}]
    # the payment is a header the server reads, PAYMENT-SIGNATURE (not `Authorization`)
    assert document["components"]["securitySchemes"]["x402"] | {"description": ""} == {
        "type": "apiKey", "in": "header", "name": "PAYMENT-SIGNATURE", "description": ""}
    ids = [op["operationId"] for _, _, op in _operations(document)]
    assert len(ids) == len(set(ids))


def test_every_paid_operation_is_secured_by_x402_and_priced_by_the_one_price_description(
        live: LiveServer, document: dict[str, Any]) -> None:
    catalogue = live.runtime.gateway.catalogue
    paths = document["paths"]
    expected: dict[str, Any] = {}
    for path, (operation, _) in _model_routes(document).items():
        terms = catalogue.route_price_terms(operation)
        expected[path] = terms.as_json() if terms is not None else None
    for skill in catalogue.all():
        if skill.kind != "model":
            expected[f"/v1/marketplace/api/{skill.id}"] = catalogue.price_terms(skill).as_json()
    resources = [catalogue.price_terms(s) for s in catalogue.all() if s.kind == "resource"]
    generic = route_terms(resources)
    assert generic is not None
    expected["/v1/marketplace/api/{resource_id}"] = generic.as_json()
    every_skill = route_terms(catalogue.price_terms(s) for s in catalogue.all())
    assert every_skill is not None
    expected["/a2a"] = expected["/mcp"] = every_skill.as_json()  # they sell every skill
    priced = 0
    for path, _, operation in _operations(document):
        assert "security" in operation, path
        info = operation.get("x-payment-info")
        if {"x402": []} in operation["security"]:
            assert info == expected[path], path
            assert info["pricing"] != "free", path
            if path != "/mcp":  # (MCP asks for payment in its own JSON-RPC result, not HTTP 402)
                assert operation["responses"]["402"] == {"$ref": "#/components/responses/PaymentRequired"}
            priced += 1
        else:
            assert operation["security"] == [] and info is None, path
    fixed = paths["/v1/marketplace/api/token-count-508"]["post"]["x-payment-info"]
    assert fixed["price"] == {"usd": "0.00575", "atomic": "5750"}  # its file's price, exactly
    assert paths["/v1/marketplace/api/help"]["post"]["security"] == []  # the free help skill
    chat = paths["/v1/chat/completions"]["post"]["x-payment-info"]
    assert chat["pricing"] == "per_request" and chat["model_prices"] == "GET /v1/models"
    assert priced >= len(resources) + 10
    quoted = document["components"]["responses"]["PaymentRequired"]
    assert quoted["headers"]["PAYMENT-REQUIRED"] and quoted["content"]["application/json"]["schema"]


def _model_routes(document: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    from compat.openai_api import model_routes  # (the test may read the face's own table)

    return model_routes()


def test_every_resource_has_its_own_path_with_its_input_schema_and_example(
        live: LiveServer, document: dict[str, Any]) -> None:
    resources = live.runtime.gateway.catalogue.of_kind("resource")
    assert len(resources) >= 10
    for skill in resources:
        operation = document["paths"][f"/v1/marketplace/api/{skill.id}"]["post"]
        body = operation["requestBody"]["content"]["application/json"]
        # its input schema, and what its validator enforces besides (as generators read them); or `{}`,
        # the probe
        assert body["schema"] == {"anyOf": [for_generators(skill.body_schema),
                                            {"$ref": "#/components/schemas/Probe"}]}
        assert operation["requestBody"]["required"] is False
        if skill.examples:
            assert body["example"] == skill.examples[0]
            assert not list(Draft202012Validator(skill.body_schema).iter_errors(body["example"])), skill.id
        assert operation["summary"] == skill.name


def test_the_schemas_rewritten_for_generators_accept_and_refuse_the_same_bodies() -> None:
    schema = {"type": "object", "additionalProperties": False, "properties": {
        "messages": {"type": "array", "maxItems": 2}, "payload": {"type": ["object", "array"]},
        "stream": {"const": False}, "anyOf": {"const": True}},  # a field may be named like a keyword
        "allOf": [{"properties": {"messages": {"items": {"type": "string"}}}}]}
    rewritten = for_generators(schema)
    assert rewritten["properties"]["messages"]["items"] == {}
    assert rewritten["properties"]["payload"]["items"] == {}
    assert rewritten["properties"]["stream"] == {"type": "boolean", "not": {"const": True}}
    bodies = [{}, {"messages": []}, {"messages": ["a", "b"]}, {"messages": ["a", "b", "c"]},
              {"messages": [1]}, {"payload": [1, {}]}, {"payload": {"a": 1}}, {"payload": "x"},
              {"stream": False}, {"stream": True}, {"stream": 0}, {"stream": None}, {"anyOf": True},
              {"anyOf": 1}, {"other": 1}]
    for body in bodies:
        assert (Draft202012Validator(schema).is_valid(body)
                == Draft202012Validator(rewritten).is_valid(body)), body


def test_model_routes_accept_exactly_their_field_tables_fields(live: LiveServer, document: dict[str, Any]
                                                                ) -> None:
    catalogue = live.runtime.gateway.catalogue
    for path, (operation, form) in _model_routes(document).items():
        content = document["paths"][path]["post"]["requestBody"]["content"]
        schema = content["multipart/form-data" if form else "application/json"]["schema"]
        schema = schema if form else schema["anyOf"][0]  # (a JSON body may be `{}`: the probe)
        table = catalogue.request_schema(operation)
        assert table is not None
        assert {name.removesuffix("[]") for name in schema["properties"]} == set(table["properties"]), path
        assert schema["additionalProperties"] is False
        serving = sorted(s.id for s in catalogue.of_kind("model") if operation in s.operations)
        assert sorted(schema["properties"]["model"].get("enum", [])) == serving
    chat = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    body = chat["schema"]["anyOf"][0]
    assert body["required"] == ["model", "messages"]
    assert "audio" not in body["properties"]  # refused: billed as audio tokens
    assert body["properties"]["temperature"]["anyOf"][0] == {"type": "number", "minimum": 0, "maximum": 2}
    messages = body["properties"]["messages"]  # what the route takes: text messages, 1 to 2,048
    assert messages["minItems"] == 1 and messages["maxItems"] == 2048
    assert messages["items"]["properties"]["role"] == {"enum": ["system", "user", "assistant"]}
    assert messages["items"]["properties"]["content"] == {"type": "string"}
    # each model's own output cap, one branch per cap: gpt-4o's is 16,384 tokens
    gpt_4o = next(b for b in body["anyOf"] if "gpt-4o" in b["properties"]["model"]["enum"])
    cap = gpt_4o["properties"]["max_tokens"]["anyOf"][0]
    assert cap == {"type": "integer", "minimum": 1, "maximum": 16384}
    # a form has no null, and sends an array as name[] parts; an upload names the formats it is read as
    form = document["paths"]["/v1/audio/transcriptions"]["post"]["requestBody"]["content"][
        "multipart/form-data"]
    assert form["schema"]["properties"]["timestamp_granularities[]"]["items"] == {"enum": ["word", "segment"]}
    # false only, said as generators read it (openapi-python-client writes an optional boolean const as
    # a syntax error: tests/test_doc_snippets.py generates a client)
    assert form["schema"]["properties"]["stream"] == {"type": "boolean", "not": {"const": True},
                                                      "description": "paywire: free"}
    assert form["encoding"]["file"]["contentType"].startswith("audio/wav")


def _served(app: Any) -> set[str]:
    paths = set()
    for route in app.routes:
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)  # Starlette's {name:path} -> {name}
        paths.add(path)
    return paths


def test_the_document_lists_exactly_the_routes_the_app_serves(live: LiveServer, document: dict[str, Any]
                                                              ) -> None:
    served = {p for p in _served(live.app) if not p.startswith(UNDOCUMENTED_PREFIXES)} - UNDOCUMENTED
    documented = {p for p in document["paths"] if not p.startswith("/v1/marketplace/api/")
                  or p == "/v1/marketplace/api/{resource_id}"}
    assert documented == served
    # and each documented method is one the route answers
    by_path = {re.sub(r"\{(\w+):\w+\}", r"{\1}", r.path): r for r in live.app.routes}
    for path in documented:
        methods = getattr(by_path[path], "methods", None)
        if methods:  # (an ASGI app mounted as a route, /mcp, takes any method)
            assert {m.upper() for m in document["paths"][path]} <= methods, path


def test_openai_shapes_are_generated_from_the_installed_openai_package() -> None:
    assert SHAPES_FILE.read_text(encoding="utf-8") == render(), (
        "wellknown/openai_shapes.json is stale: run `.venv/bin/python -m tests.support.openai_shapes`")


# (path, body, the field a refusal names; None: valid), each checked against the document and the
# server's first answer: the same verdict from both. Some were the server's slips (a `0` taken for
# false, `64.0` refused as not whole, an empty voice id taken), some the document's (an empty chat,
# an output cap past the model's, a size the model does not offer, text and messages together).
VERDICTS = [
    ("/v1/images/generations", {"model": "dall-e-2", "prompt": "x", "stream": 0}, "stream"),
    ("/v1/images/generations", {"model": "dall-e-3", "prompt": "x", "size": "256x256"}, "size"),
    ("/v1/embeddings", {"model": "text-embedding-3-small", "input": "x", "dimensions": 64.0}, None),
    ("/v1/embeddings", {"model": "text-embedding-3-small", "input": ["x", ""]}, "input.1"),
    ("/v1/audio/speech", {"model": "tts-1", "input": "hi", "voice": {"id": ""}}, "voice"),
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": []}, "messages"),
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 16385}, "max_tokens"),
    ("/v1/chat/completions", {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 16384.0, "n": 1.0}, None),
    ("/v1/edits", {"model": "gpt-4o", "instruction": " \u0085 "}, "instruction"),
    ("/v1/completions", {"model": "davinci-002", "prompt": "x", "best_of": 2, "stream": True}, "best_of"),
    ("/v1/marketplace/api/token-count-508", {"model": "gpt-4o"}, "text"),
    ("/v1/marketplace/api/token-count-508", {"model": "gpt-4o", "text": "a", "messages": []}, "text"),
    ("/v1/marketplace/api/token-attention-report", {"ticker": "ETH", "window_days": 30.0}, None),
    ("/v1/marketplace/api/restaurant-menu-image-generate", {"prompt": "soup", "cuisine": "4 cheese"},
     "cuisine"),
    ("/v1/marketplace/api/webhook-test-payload", {"url": "ftp://example.com/hook"}, "url"),
    ("/v1/marketplace/api/webhook-test-payload", {"url": "https://example.com/hook", "event": "github.ping",
                                                  "payload": {}}, "event"),
    ("/v1/marketplace/api/changelog-generate", {}, None),  # the probe: the quote
]


@pytest.mark.parametrize(("path", "body", "refused"), VERDICTS)
def test_the_document_and_the_server_give_the_same_verdict(live: LiveServer, document: dict[str, Any],
                                                           path: str, body: dict[str, Any],
                                                           refused: str | None) -> None:
    content = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
    errors = list(Draft202012Validator({**content["schema"], "components": document["components"]})
                  .iter_errors(body))
    answer = httpx.post(f"{live.url}{path}", json=body, timeout=30)
    if refused is None:
        assert not errors, errors[0].message
        assert answer.status_code == 402, answer.text  # valid: quoted
    else:
        assert errors, f"the document takes {body}"
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == refused


def test_a_form_array_is_sent_as_name_parts_and_each_value_is_checked(live: LiveServer) -> None:
    wav = silent_wav(0.5)
    sent = {"model": "whisper-1", "timestamp_granularities[]": "word"}
    taken = httpx.post(f"{live.url}/v1/audio/transcriptions", data=sent, files={"file": ("a.wav", wav)})
    assert taken.status_code == 402, taken.text
    sent["timestamp_granularities[]"] = "sentence"  # not one OpenAI offers: was forwarded, now refused
    refused = httpx.post(f"{live.url}/v1/audio/transcriptions", data=sent, files={"file": ("a.wav", wav)})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "timestamp_granularities.0"


def test_every_answer_mcp_gives_at_the_http_level_is_documented(live: LiveServer, document: dict[str, Any]
                                                                ) -> None:
    documented = document["paths"]["/mcp"]["post"]["responses"]
    assert "default" not in documented
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    accept = {"Accept": conformance.MCP_ACCEPT}
    answers = {
        "200": httpx.post(f"{live.url}/mcp", json=listing, headers=accept),
        "202": httpx.post(f"{live.url}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                          headers=accept),
        "400": httpx.post(f"{live.url}/mcp", json={**listing, "method": ""}, headers=accept),
        "406": httpx.post(f"{live.url}/mcp", json=listing, headers={"Accept": "text/html"}),
    }
    for status, answer in answers.items():
        assert str(answer.status_code) == status and status in documented, (status, answer.text)


def test_a_real_quote_and_a_paid_call_conform_to_the_document(live: LiveServer, document: dict[str, Any]
                                                              ) -> None:
    resource = f"{live.url}/v1/marketplace/api/token-count-508"
    operation = document["paths"]["/v1/marketplace/api/token-count-508"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["example"]
    answer, required = quote(resource, body)
    assert not list(_validator(document, "PaymentRequired").iter_errors(answer.json()))
    info = operation["x-payment-info"]
    assert {a.amount for a in required.accepts} == {info["price"]["atomic"]}
    assert {a.network for a in required.accepts} == set(info["networks"])
    offered = {(x["network"], x["asset"]) for x in info["assets"]}
    assert {(a.network, a.asset) for a in required.accepts} == offered
    keys = live.devnet.keys
    paid = post_paid(resource, body, header(sign(client_for(live.url, evm_key=keys.evm_payer), required,
                                                 EVM_NET)))
    assert paid.status_code == 200, paid.text
    receipt = json.loads(decode_base64_any(paid.headers["PAYMENT-RESPONSE"]))
    assert receipt["success"] is True and receipt["network"] == EVM_NET
    assert set(operation["responses"]["200"]["headers"]) == {"PAYMENT-RESPONSE", "X-PAYMENT-RESPONSE"}
    # a refused input answers in the marketplace's documented error shape
    refused = httpx.post(resource, json={"text": 5}, timeout=30)
    assert refused.status_code == 400
    assert not list(_validator(document, "MarketplaceError").iter_errors(refused.json()))
    unknown = httpx.post(f"{live.url}/v1/models/no-such-model", timeout=30)
    assert unknown.status_code == 405  # (GET only: the document lists GET alone)
    missing = httpx.get(f"{live.url}/v1/models/no-such-model", timeout=30)
    assert missing.status_code == 404 and not list(_validator(document, "Error").iter_errors(missing.json()))


# schemathesis over the whole document against a live gateway (tests/support/conformance.py): every
# operation, its examples, coverage and fuzzing phases (seeded, derandomized, bounded), checked for
# no 5xx, documented statuses, content types and answer shapes, and validation both ways: a request
# the document calls valid is not refused, one it calls invalid is. The gateway runs as its own
# process (`paywire serve`, every provider configured so nothing answers "not configured") on a
# model table of OpenAI-tokenized models, one or more per operation with different limits: a
# tokenizer loads in 0.1-6 s on first use, and the other families add load time, not document.
CONFORMANCE_MODELS = ("gpt-4o", "gpt-4o-mini", "o3-mini", "gpt-3.5-turbo-instruct", "davinci-002",
                      "text-embedding-3-small", "text-embedding-3-large", "tts-1", "gpt-4o-mini-tts",
                      "whisper-1", "gpt-4o-transcribe", "elevenlabs/sound-effects", "dall-e-2",
                      "dall-e-3", "gpt-image-1", "gpt-image-1-mini")
CONFORMANCE_EXAMPLES = 40


@pytest.fixture(scope="module")
def conformance_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("conformance")
    table = json.loads(DEFAULT_MODELS.read_text(encoding="utf-8"))
    table["models"] = [m for m in table["models"] if m["id"] in CONFORMANCE_MODELS]
    assert {m["id"] for m in table["models"]} == set(CONFORMANCE_MODELS)
    (root / "models.json").write_text(json.dumps(table), encoding="utf-8")
    port = free_port()
    with (root / "serve.log").open("w") as log:
        proc = start_paywire(port, paywire_env(root / "data", PAYWIRE_MODELS_FILE=str(root / "models.json"),
                                               **CONFIGURED), stdout=log, stderr=log)
        yield f"http://127.0.0.1:{port}"
        stop(proc)


def test_schemathesis_finds_no_disagreement_between_the_document_and_the_server(conformance_url: str
                                                                                 ) -> None:
    found = conformance.run(conformance_url, max_examples=CONFORMANCE_EXAMPLES)
    assert found.cases >= 1000, found.cases  # every operation was exercised, not filtered away
    assert not found.errors, "\n".join(found.errors)
    assert not found.disagreements, "\n".join(str(d)[:800] for d in found.disagreements)
