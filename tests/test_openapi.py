"""GET /openapi.json on a real gateway (loopback, devnet): a valid OpenAPI 3.1 document, generated
from the registry (every resource's path with its input schema, every paid operation's price as the
one price description), listing exactly the routes the app serves; real answers (a quote, a paid
call on the devnet) conform to it; schemathesis drives a subset of its operations."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from jsonschema import Draft202012Validator
from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from agent.pipeline.price_terms import route_terms
from payments.codec import decode_base64_any
from tests.support.live_server import LiveServer, start_server
from tests.support.openai_shapes import SHAPES_FILE, render
from tests.support.paying import EVM_NET, client_for, header, post_paid, quote, sign

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
    assert document["components"]["securitySchemes"]["x402"]["type"] == "http"
    assert document["components"]["securitySchemes"]["x402"]["scheme"] == "X402"
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
        assert body["schema"] == skill.input_schema
        if skill.examples:
            assert body["example"] == skill.examples[0]
            assert not list(Draft202012Validator(body["schema"]).iter_errors(body["example"])), skill.id
        assert operation["summary"] == skill.name


def test_model_routes_accept_exactly_their_field_tables_fields(live: LiveServer, document: dict[str, Any]
                                                                ) -> None:
    catalogue = live.runtime.gateway.catalogue
    for path, (operation, form) in _model_routes(document).items():
        content = document["paths"][path]["post"]["requestBody"]["content"]
        schema = content["multipart/form-data" if form else "application/json"]["schema"]
        table = catalogue.request_schema(operation)
        assert table is not None and set(schema["properties"]) == set(table["properties"]), path
        assert schema["additionalProperties"] is False
        serving = sorted(s.id for s in catalogue.of_kind("model") if operation in s.operations)
        assert sorted(schema["properties"]["model"].get("enum", [])) == serving
    chat = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert chat["schema"]["required"] == ["messages", "model"]
    assert "audio" not in chat["schema"]["properties"]  # refused: billed as audio tokens
    assert chat["schema"]["properties"]["temperature"]["anyOf"][0] == {"type": "number", "minimum": 0,
                                                                        "maximum": 2}
    assert chat["schema"]["properties"]["messages"]["type"] == "array"  # OpenAI's own message types


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


# Schemathesis over the document, on the live server: generated requests (positive data, bounded),
# each answer checked for no 5xx, a documented status, content type and schema. Covered: every
# operation but /mcp (MCP's own protocol, tested with the official MCP client) and the per-resource
# paths beyond one (they share the generic route's code; one, token-count-508, runs locally).
FUZZ_EXAMPLES = 8
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _fuzzed(path: str) -> bool:
    if path == "/mcp":
        return False
    return not path.startswith("/v1/marketplace/api/") or path in (
        "/v1/marketplace/api/{resource_id}", "/v1/marketplace/api/token-count-508")


def test_schemathesis_finds_no_server_error_and_no_undocumented_answer(live: LiveServer) -> None:
    schema = schemathesis.openapi.from_url(f"{live.url}/openapi.json", timeout=30)
    operations = [result.ok() for result in schema.get_all_operations()]
    chosen = [op for op in operations if _fuzzed(op.path)]
    assert len(chosen) >= 20
    failures: list[str] = []
    session = requests.Session()  # one connection pool for the run
    for op in chosen:
        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def run(case: Any) -> None:
            case.call_and_validate(base_url=live.url, session=session, checks=CHECKS)

        try:
            run()
        except Exception as exc:  # noqa: BLE001 - collect every operation's failure, then report
            failures.append(f"{op.method.upper()} {op.path}: {str(exc)[:1500]}")
    session.close()
    assert not failures, "\n\n".join(failures)

