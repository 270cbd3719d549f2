"""Discovery documents: the A2A 1.0 card and the 0.3-era card, built from the live registry."""

from __future__ import annotations

import hashlib
import json
import time
from decimal import Decimal
from email.utils import formatdate, parsedate_to_datetime
from types import SimpleNamespace
from typing import Any

import httpx
import jsonschema
import pytest
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver, parse_agent_card
from a2a.client.transports.jsonrpc import JsonRpcTransport
from a2a.compat.v0_3 import types as types_v03
from a2a.compat.v0_3.jsonrpc_transport import CompatJsonRpcTransport
from a2a.types import AgentCard
from a2a.utils.proto_utils import validate_proto_required_fields
from google.api import field_behavior_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from starlette.applications import Starlette
from starlette.testclient import TestClient

from agent.pipeline.catalogue import Catalogue
from payments.networks import BASE_SEPOLIA, SOLANA_DEVNET
from skills.registry import SkillRegistry
from skills.resource_files import BUILTIN_DIR, load_resource_dirs
from skills.skill import Skill, SkillResult
from wellknown.agent_card import (
    CARD_PATH,
    HELP_DESCRIPTION,
    LEGACY_CARD_PATH,
    X402_EXTENSION,
    build_agent_card,
    cached_card_factory,
    card_to_dict,
    legacy_card_to_dict,
    routes,
)

BASE = "https://pay.example.test"


async def _run(payload: dict[str, Any]) -> SkillResult:
    return SkillResult(body={})


def _registry() -> SkillRegistry:
    registry = SkillRegistry()
    load_resource_dirs(registry, [BUILTIN_DIR])
    # What app assembly adds: a free help skill in the registry (the card must not list it twice).
    registry.add(Skill(id="help", name="Help", description="What paywire sells.",
                       categories=("Help",), price_usd=Decimal(0), kind="builtin", run=_run))
    # A model-like skill whose price depends on the request.
    registry.add(Skill(id="gpt-test", name="GPT test", description="A chat model.",
                       categories=("Chat",), tags=("llm",), kind="model", run=_run,
                       pricer=lambda payload: Decimal("0.01")))
    return registry


def _gateway(registry: SkillRegistry | None = None) -> Any:
    """What the assembly hands the card: the registry (read through a Catalogue) and the networks."""
    return SimpleNamespace(registry=registry or _registry(),
                           networks=[f"{n.label or n.v1_name} ({n.caip2})"
                                     for n in (BASE_SEPOLIA, SOLANA_DEVNET)])


def _inputs(gateway: Any) -> tuple[Catalogue, list[str]]:
    return Catalogue(gateway.registry), gateway.networks


@pytest.fixture
def gateway() -> Any:
    return _gateway()


@pytest.fixture
def card(gateway: Any) -> AgentCard:
    return build_agent_card(*_inputs(gateway), base_url=BASE + "/", version="0.1.0")


def _app(gateway: Any, **kwargs: Any) -> Starlette:
    return Starlette(routes=routes(cached_card_factory(*_inputs(gateway), base_url=BASE, version="0.1.0",
                                                       **kwargs)))


# --- A2A 1.0 JSON Schema, generated from the SDK's own a2a.proto descriptors -----------------
# a2a-sdk ships no JSON Schema for the 1.0 card; the proto is normative in 1.0, and its
# `google.api.field_behavior = REQUIRED` marks are what the spec calls required.

_SCALARS = {
    FieldDescriptor.TYPE_STRING: {"type": "string"},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
    FieldDescriptor.TYPE_INT32: {"type": "integer"},
    FieldDescriptor.TYPE_INT64: {"type": "string"},
    FieldDescriptor.TYPE_BYTES: {"type": "string"},
    FieldDescriptor.TYPE_DOUBLE: {"type": "number"},
}
# Top-level keys the SDK's agent_card_to_dict merges in from the 0.3 form of the card.
_V03_TOP_LEVEL = {"url": {"type": "string"}, "preferredTransport": {"type": "string"},
                  "protocolVersion": {"type": "string"}}


def _required(field: FieldDescriptor) -> bool:
    return field_behavior_pb2.REQUIRED in field.GetOptions().Extensions[field_behavior_pb2.field_behavior]


def _field_schema(field: FieldDescriptor, defs: dict[str, Any]) -> dict[str, Any]:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return {"type": "object",
                "additionalProperties": _field_schema(field.message_type.fields_by_name["value"], defs)}
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        item = _message_schema(field.message_type, defs)
    elif field.type == FieldDescriptor.TYPE_ENUM:
        item = {"enum": [v.name for v in field.enum_type.values]}
    else:
        item = dict(_SCALARS[field.type])
        if _required(field) and field.type == FieldDescriptor.TYPE_STRING:
            item["minLength"] = 1
    if field.is_repeated:
        return {"type": "array", "items": item, **({"minItems": 1} if _required(field) else {})}
    return item


def _message_schema(desc: Descriptor, defs: dict[str, Any]) -> dict[str, Any]:
    if desc.full_name.startswith("google.protobuf."):
        return {"type": "object"} if desc.name == "Struct" else {}
    ref = {"$ref": f"#/$defs/{desc.name}"}
    if desc.name not in defs:
        defs[desc.name] = {}
        defs[desc.name] = {
            "type": "object",
            "properties": {f.json_name: _field_schema(f, defs) for f in desc.fields},
            "required": [f.json_name for f in desc.fields if _required(f)],
            "additionalProperties": False,
        }
    return ref


def _card_schema() -> dict[str, Any]:
    defs: dict[str, Any] = {}
    _message_schema(AgentCard.DESCRIPTOR, defs)
    defs["AgentCard"]["properties"].update(_V03_TOP_LEVEL)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$ref": "#/$defs/AgentCard",
            "$defs": defs}


def test_schema_generator_knows_the_1_0_required_fields() -> None:
    defs = _card_schema()["$defs"]
    assert set(defs["AgentCard"]["required"]) == {
        "name", "description", "version", "supportedInterfaces", "capabilities",
        "defaultInputModes", "defaultOutputModes", "skills"}
    assert set(defs["AgentSkill"]["required"]) == {"id", "name", "description", "tags"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"name": "x"}, _card_schema())


# --- the 1.0 card ------------------------------------------------------------------------------


def test_card_validates_against_the_a2a_1_0_schema(card: AgentCard) -> None:
    validate_proto_required_fields(card)  # the SDK's own check; raises on a missing field
    served = card_to_dict(card)
    jsonschema.validate(served, _card_schema())
    for skill in served["skills"]:
        assert skill["id"] and skill["name"] and skill["description"] and skill["tags"]


def test_card_identity_interfaces_and_capabilities(card: AgentCard) -> None:
    assert card.name == "paywire" and card.version == "0.1.0"
    assert card.provider.organization == "paywire" and card.provider.url == BASE
    first = card.supported_interfaces[0]
    assert (first.url, first.protocol_binding, first.protocol_version) == (
        f"{BASE}/a2a", "JSONRPC", "1.0")
    assert [i.protocol_version for i in card.supported_interfaces] == ["1.0", "0.3"]
    assert {i.url for i in card.supported_interfaces} == {f"{BASE}/a2a"}
    assert card.capabilities.streaming is True
    ext, *v01 = card.capabilities.extensions  # v0.2 first, then the v0.1 URIs clients still send
    assert ext.uri == X402_EXTENSION and ext.required is False and "402" in ext.description
    assert [e.uri for e in v01] == ["https://github.com/google-a2a/a2a-x402/v0.1",
                                    "https://google-a2a.github.io/A2A/extensions/payments/x402/v0.1"]
    assert all(e.required is False and "v0.1" in e.description for e in v01)
    assert list(card.default_input_modes) == ["application/json", "text/plain"]
    assert list(card.default_output_modes) == ["application/json", "text/plain"]
    assert "USDC" in card.description and "x402" in card.description
    assert "Base Sepolia (eip155:84532)" in card.description
    assert "Solana devnet (solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1)" in card.description
    assert "a2a-x402" in card.description and "402" in card.description
    assert "more are not listed" not in card.description


def test_extension_uri_matches_the_executor() -> None:
    messages = pytest.importorskip("agent.a2a.messages")
    assert messages.X402_EXTENSION == X402_EXTENSION


def test_examples_are_messages_the_executor_understands(gateway: Any, card: AgentCard) -> None:
    """Each example, sent as the data part of a message, calls that skill with that input."""
    messages = pytest.importorskip("agent.a2a.messages")
    for entry in card.skills:
        for example in entry.examples:
            try:
                part = {"data": json.loads(example)}
            except json.JSONDecodeError:
                part = {"text": example}  # the help entry's plain-text example
            call = messages.parse_skill_call_json({"parts": [part]})
            assert call.skill_id == entry.id
            skill = gateway.registry.get(entry.id)
            if skill is not None and skill.examples:
                skill.validate(call.input)
                assert call.input == skill.examples[0]


def test_one_skill_per_skill_for_sale_with_price_tags_and_exact_example(
        gateway: Any, card: AgentCard) -> None:
    """Every skill a call can buy here, in registry order; one that would answer 503 (here: the
    Nansen resources without NANSEN_API_KEY, the resources whose model is not sold) is left out."""
    by_id = {s.id: s for s in card.skills}
    catalogue = Catalogue(gateway.registry)
    for_sale = [s.id for s in catalogue.for_sale() if s.id != "help"]
    assert [s.id for s in card.skills] == ["help", *for_sale]
    left_out = {s.id for s in gateway.registry.all()} - set(by_id)
    assert {"v1beta1-token-screener-historical", "error-explain"} <= left_out
    assert not any(catalogue.available(i) for i in left_out)
    assert {"token-count-508", "webhook-test-payload", "gpt-test"} <= set(by_id)
    for skill in catalogue.for_sale():
        if skill.id == "help":
            continue
        entry = by_id[skill.id]
        assert entry.name == skill.name
        assert entry.description.startswith(skill.description)
        for category in skill.categories:
            assert category.lower() in entry.tags
        for tag in skill.tags:
            assert tag in entry.tags
        [example] = entry.examples
        assert json.loads(example) == {"skill": skill.id,
                                       "input": skill.examples[0] if skill.examples else {}}
        assert list(entry.input_modes) == ["application/json"]
        assert list(entry.output_modes) == ["application/json"]


def test_prices_in_descriptions_are_exact(card: AgentCard) -> None:
    by_id = {s.id: s for s in card.skills}
    assert by_id["webhook-test-payload"].description.endswith(
        "Price: $0.062101 per call (USDC via x402).")
    assert by_id["token-count-508"].description.endswith(
        "Price: $0.00575 per call (USDC via x402).")
    assert "$0.0575 per call" in by_id["token-attention-report"].description
    assert "priced per request" in by_id["gpt-test"].description
    assert "$" not in by_id["gpt-test"].description
    assert json.loads(by_id["token-count-508"].examples[0]) == {
        "skill": "token-count-508", "input": {"text": "Hello, world!", "model": "gpt-4o"}}


def test_help_entry_is_listed_once_and_free(card: AgentCard) -> None:
    helps = [s for s in card.skills if s.id == "help"]
    assert len(helps) == 1
    assert helps[0].description == HELP_DESCRIPTION
    assert "text/plain" in helps[0].input_modes


def test_help_entry_present_even_without_a_registry_help_skill() -> None:
    registry = SkillRegistry()
    load_resource_dirs(registry, [BUILTIN_DIR])
    card = build_agent_card(Catalogue(registry), [], base_url=BASE, version="1")
    assert card.skills[0].id == "help" and len(card.skills) == len(Catalogue(registry).for_sale()) + 1
    assert "the networks each quote lists" in card.description


def test_truncation_says_how_many_were_left_out_and_where(gateway: Any) -> None:
    sellable = len(Catalogue(gateway.registry).for_sale()) - 1  # all a call can buy but help
    card = build_agent_card(*_inputs(gateway), base_url=BASE, version="1", max_skills=3)
    listed = [s.id for s in card.skills if not s.id.startswith("category:")]  # the rest: grouped
    assert listed[0] == "help" and len(listed) == 4
    assert f"lists 3 of the {sellable} skills; {sellable - 3} more are not listed" in card.description
    assert f"{BASE}/api/marketplace/apis" in card.description
    exact = build_agent_card(*_inputs(gateway), base_url=BASE, version="1", max_skills=sellable)
    assert len(exact.skills) == sellable + 1 and "not listed" not in exact.description
    none = build_agent_card(*_inputs(gateway), base_url=BASE, version="1", max_skills=0)
    assert [s.id for s in none.skills if not s.id.startswith("category:")] == ["help"]
    assert f"{sellable} more" in none.description
    with pytest.raises(ValueError):
        build_agent_card(*_inputs(gateway), base_url=BASE, version="1", max_skills=-1)


def test_single_interface_when_legacy_interface_is_off(gateway: Any) -> None:
    card = build_agent_card(*_inputs(gateway), base_url=BASE, version="1", legacy_interface=False)
    assert [i.protocol_version for i in card.supported_interfaces] == ["1.0"]
    served = card_to_dict(card)
    jsonschema.validate(served, _card_schema())
    assert "url" not in served  # the SDK adds the 0.3 fields only for a card with a 0.3 interface
    assert legacy_card_to_dict(card)["url"] == f"{BASE}/a2a"


def test_served_card_round_trips_through_the_sdk_client_parser(card: AgentCard) -> None:
    served = json.loads(json.dumps(card_to_dict(card)))
    assert parse_agent_card(served) == card


async def test_sdk_resolver_and_client_factory_pick_the_1_0_interface(gateway: Any) -> None:
    transport = httpx.ASGITransport(app=_app(gateway))
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
        resolved = await A2ACardResolver(http, BASE).get_agent_card()
        assert resolved == build_agent_card(*_inputs(gateway), base_url=BASE, version="0.1.0")
        client = ClientFactory(ClientConfig(httpx_client=http)).create(resolved)
        assert type(client._transport) is JsonRpcTransport
        assert client._transport.url == f"{BASE}/a2a"

        legacy = await A2ACardResolver(http, BASE, LEGACY_CARD_PATH).get_agent_card()
        assert [(i.url, i.protocol_version) for i in legacy.supported_interfaces] == [
            (f"{BASE}/a2a", "0.3.0")]
        assert [s.id for s in legacy.skills] == [s.id for s in resolved.skills]
        old = ClientFactory(ClientConfig(httpx_client=http)).create(legacy)
        assert type(old._transport) is CompatJsonRpcTransport


# --- the 0.3 card --------------------------------------------------------------------------------


def test_legacy_card_parses_with_the_sdk_0_3_model(card: AgentCard) -> None:
    data = json.loads(json.dumps(legacy_card_to_dict(card)))
    model = types_v03.AgentCard.model_validate(data)
    assert data["url"] == f"{BASE}/a2a"
    assert data["protocolVersion"] == "0.3.0"
    assert data["preferredTransport"] == "JSONRPC"
    assert "additionalInterfaces" not in data and "supportedInterfaces" not in data
    assert model.name == "paywire" and model.description == card.description
    assert data["capabilities"]["streaming"] is True
    assert data["capabilities"]["extensions"] == [
        {"uri": e.uri, "description": e.description, "required": False}
        for e in card.capabilities.extensions]
    assert data["capabilities"]["extensions"][0]["uri"] == X402_EXTENSION
    assert data["defaultInputModes"] == ["application/json", "text/plain"]
    assert [s["id"] for s in data["skills"]] == [s.id for s in card.skills]
    explain = next(s for s in data["skills"] if s["id"] == "webhook-test-payload")
    assert explain["description"].endswith("Price: $0.062101 per call (USDC via x402).")
    assert json.loads(explain["examples"][0])["skill"] == "webhook-test-payload"
    assert explain["inputModes"] == ["application/json"]


# --- routes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [CARD_PATH, LEGACY_CARD_PATH])
def test_routes_serve_json_with_etag_cache_control_and_304(gateway: Any, path: str) -> None:
    with TestClient(_app(gateway)) as http:
        first = http.get(path)
        assert first.status_code == 200
        assert first.headers["content-type"] == "application/json"
        assert first.headers["cache-control"] == "public, max-age=60"
        etag = first.headers["etag"]
        assert etag == f'"{hashlib.sha256(first.content).hexdigest()}"'
        assert first.json()["name"] == "paywire"

        for header in (etag, f"W/{etag}", f'"other", {etag}', "*"):
            again = http.get(path, headers={"If-None-Match": header})
            assert again.status_code == 304, header
            assert again.content == b""
            assert again.headers["etag"] == etag
            assert again.headers["cache-control"] == "public, max-age=60"
        stale = http.get(path, headers={"If-None-Match": '"not-it"'})
        assert stale.status_code == 200 and stale.content == first.content

        modified = first.headers["last-modified"]
        assert parsedate_to_datetime(modified).timestamp() <= time.time()
        assert http.get(path, headers={"If-Modified-Since": modified}).status_code == 304
        earlier = formatdate(parsedate_to_datetime(modified).timestamp() - 60, usegmt=True)
        assert http.get(path, headers={"If-Modified-Since": earlier}).status_code == 200
        assert http.get(path, headers={"If-Modified-Since": "not a date"}).status_code == 200
        # If-None-Match wins over If-Modified-Since (RFC 9110 13.2.2)
        both = http.get(path, headers={"If-None-Match": '"not-it"', "If-Modified-Since": modified})
        assert both.status_code == 200
        assert http.head(path).headers["etag"] == etag


def test_the_two_paths_serve_the_two_versions(gateway: Any) -> None:
    with TestClient(_app(gateway)) as http:
        current, legacy = http.get(CARD_PATH), http.get(LEGACY_CARD_PATH)
    assert current.headers["etag"] != legacy.headers["etag"]
    assert current.json()["supportedInterfaces"][0]["protocolVersion"] == "1.0"
    assert legacy.json()["protocolVersion"] == "0.3.0"
    assert current.json() == json.loads(json.dumps(card_to_dict(
        build_agent_card(*_inputs(gateway), base_url=BASE, version="0.1.0"))))


def test_card_is_built_once_per_registry_state(gateway: Any) -> None:
    factory = cached_card_factory(*_inputs(gateway), base_url=BASE, version="1")
    first = factory()
    assert factory() is first
    with TestClient(Starlette(routes=routes(factory))) as http:
        before = http.get(CARD_PATH)
        gateway.registry.add(Skill(id="late-skill", name="Late", description="Added later.",
                                   categories=("Misc",), price_usd=Decimal("0.5"), run=_run))
        after = http.get(CARD_PATH, headers={"If-None-Match": before.headers["etag"]})
    assert factory() is not first
    assert after.status_code == 200 and after.headers["etag"] != before.headers["etag"]
    assert any(s["id"] == "late-skill" and "$0.5 per call" in s["description"]
               for s in after.json()["skills"])


def test_routes_render_once_per_card(gateway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import wellknown.agent_card as module

    calls = []
    real = module.card_to_dict
    monkeypatch.setattr(module, "card_to_dict", lambda c: calls.append(1) or real(c))
    with TestClient(_app(gateway)) as http:
        for _ in range(3):
            assert http.get(CARD_PATH).status_code == 200
    assert len(calls) == 1
