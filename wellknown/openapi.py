"""GET /openapi.json: paywire's public HTTP API as an OpenAPI 3.1.0 document (API version 1.0.0).

Generated from what the routes themselves use, so it cannot drift from them:
- the registry (the `Catalogue`): one path per marketplace resource with its input JSON Schema and
  example, the models each /v1 route serves, and every price as `x-payment-info`, the one price
  description (agent/pipeline/price_terms.py) the 402s, discovery, MCP and the catalogue page show too;
- the /v1 routes' field tables (skills/models/request_fields.py via `Catalogue.request_schema`):
  exactly the fields each route accepts, typed by the checks that enforce them, else by OpenAI's
  own request types; OpenAI's response shapes, generated from the `openai` package's types into
  openai_shapes.json (tests/support/openai_shapes.py writes it; a test keeps it current);
- the x402 v1 402 body from the x402 SDK's own model.

Paid operations carry `security: [{x402: []}]` (scheme `X402`: pay with a `PAYMENT-SIGNATURE` or
`X-PAYMENT` header, as the 402's `PAYMENT-REQUIRED` header asks); free ones `security: []`. The
document is built once per registry state (the registry only grows: its size identifies it).
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from x402.schemas import PaymentRequiredV1

from agent.pipeline.gateway import Gateway
from agent.pipeline.price_terms import PriceTerms, route_terms

from . import discovery

OPENAPI_PATH = "/openapi.json"
OPENAPI_VERSION = "3.1.0"
API_VERSION = "1.0.0"  # the version of this API description, not paywire's
_SHAPES = json.loads((Path(__file__).parent / "openai_shapes.json").read_text(encoding="utf-8"))
_REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Surface:
    """What the assembly mounted, as the document needs it: the model routes (path -> (operation,
    multipart body?)), the marketplace catalogue's page sizes and the body limits."""

    model_routes: Mapping[str, tuple[str, bool]]
    default_page_size: int
    max_page_size: int
    max_body_bytes: int
    max_upload_bytes: int


# ---------------------------------------------------------------------------------------------- shapes

def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=name)}


def _json(schema: dict[str, Any], example: Any = None) -> dict[str, Any]:
    media: dict[str, Any] = {"schema": schema}
    if example is not None:
        media["example"] = example
    return {"application/json": media}


_ERROR_OBJECT = {
    "type": "object",
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
    "required": ["message", "type"],
}
_BINARY = {"type": "string", "format": "binary"}
_OWN_SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "description": "OpenAI's error shape (every /v1 route).",
              "properties": {"error": _ERROR_OBJECT}, "required": ["error"]},
    "MarketplaceError": {"type": "object", "description": "The marketplace's error: OpenAI's error "
                         "object with `success: false`.",
                         "properties": {"success": {"const": False}, "error": _ERROR_OBJECT},
                         "required": ["success", "error"]},
    "JsonRpcError": {"type": "object", "properties": {
        "jsonrpc": {"const": "2.0"}, "id": {"type": ["string", "integer", "null"]},
        "error": {"type": "object", "properties": {"code": {"type": "integer"}, "message": {"type": "string"},
                                                   "data": {}}, "required": ["code", "message"]}},
        "required": ["jsonrpc", "error"]},
    "A2AError": {"anyOf": [_ref("JsonRpcError"), _ref("Error")], "description": "JSON-RPC's error for a "
                 "request refused at the edge; OpenAI's error shape for a call the pipeline refused."},
    "JsonRpcRequest": {"type": "object", "properties": {
        "jsonrpc": {"const": "2.0"}, "id": {"type": ["string", "integer"]},
        "method": {"type": "string", "description": "A2A 1.0 (SendMessage, GetTask...) or 0.3 (message/send, "
                                                    "tasks/get...) method names."},
        "params": {"type": "object"}}, "required": ["jsonrpc", "method"]},
    "JsonRpcResponse": {"type": "object", "description": "A JSON-RPC 2.0 answer: `result` or `error`.",
                        "properties": {"jsonrpc": {"const": "2.0"},
                                       "id": {"type": ["string", "integer", "null"]},
                                       "result": {}, "error": {"type": "object"}},
                        "required": ["jsonrpc"]},
    "Edit": {"type": "object", "description": "The legacy /v1/edits answer.", "properties": {
        "object": {"const": "edit"}, "created": {"type": "integer"},
        "choices": {"type": "array", "items": {"type": "object", "properties": {
            "text": {"type": "string"}, "index": {"type": "integer"}}, "required": ["text", "index"]}},
        "usage": {"type": "object", "properties": {k: {"type": "integer"} for k in (
            "prompt_tokens", "completion_tokens", "total_tokens")}}},
        "required": ["object", "created", "choices", "usage"]},
    "PaywireModel": {"allOf": [_ref("Model"), {"type": "object", "description": "paywire adds the model's "
                     "family, operations, context window, availability and prices.", "properties": {
                         "family": {"type": "string"},
                         "operations": {"type": "array", "items": {"type": "string"}},
                         "context_window": {"type": ["integer", "null"]}, "available": {"type": "boolean"},
                         "enable_with": {"type": "array", "items": {"type": "string"}},
                         "reason": {"type": "string"},
                         "pricing": {"type": "object", "additionalProperties": {"type": "string"}}}}]},
    "ModelList": {"type": "object", "properties": {"object": {"const": "list"},
                                                   "data": {"type": "array", "items": _ref("PaywireModel")}},
                  "required": ["object", "data"]},
    "CatalogueItem": {"type": "object", "properties": {
        "resource_id": {"type": "string"}, "name": {"type": "string"}, "description": {"type": "string"},
        "category": {"type": "string"}, "categories": {"type": "array", "items": {"type": "string"}},
        "method": {"type": "string"}, "display_price": {"type": "string"}, "price_usd": {"type": "string"},
        "endpoint": {"type": "string"}, "available": {"type": "boolean"},
        "price": {"type": "object", "description": "The price description (as `x-payment-info`)."}},
        "required": ["resource_id", "name", "description", "categories", "endpoint", "available"]},
    "Catalogue": {"type": "object", "properties": {
        "success": {"const": True},
        "data": {"type": "object", "properties": {
            "items": {"type": "array", "items": _ref("CatalogueItem")},
            "total": {"type": "integer", "minimum": 0}, "page": {"type": "integer", "minimum": 1},
            "page_size": {"type": "integer", "minimum": 1},
            "categories": {"type": "array", "items": {"type": "object", "properties": {
                "category": {"type": "string"}, "count": {"type": "integer"}}}}},
            "required": ["items", "total", "page", "page_size", "categories"]}},
        "required": ["success", "data"]},
    "DiscoveryResource": {"type": "object", "description": "One paid resource in the x402 facilitator "
                          "discovery format.", "properties": {
                              "resource": {"type": "string", "description": "Its URL."},
                              "type": {"type": "string", "description": "`http` (or `mcp`)."},
                              "x402Version": {"type": "integer"},
                              "accepts": {"type": "array", "items": {"type": "object"},
                                          "description": "The payment requirements of its 402."},
                              "lastUpdated": {"type": "string"},
                              "metadata": {"type": "object", "description": "Name, description, "
                                           "input schema and the price description."}},
                          "required": ["resource", "type", "x402Version", "accepts"]},
    "DiscoveryResources": {"type": "object", "properties": {
        "x402Version": {"type": "integer"},
        "items": {"type": "array", "items": _ref("DiscoveryResource")},
        "pagination": {"type": "object", "properties": {
            "limit": {"type": "integer"}, "offset": {"type": "integer"}, "total": {"type": "integer"}}}},
        "required": ["items"]},
    "AnyObject": {"type": "object"},
    "X402Manifest": {"type": "object", "properties": {
        "x402Version": {"type": "integer"}, "kind": {"type": "string"}, "name": {"type": "string"},
        "discovery": {"type": "object", "properties": {"resources": {"type": "string"},
                                                       "type": {"type": "string"},
                                                       "maxLimit": {"type": "integer"}}},
        "resources": {"type": "array", "items": {"type": "object"}}},
        "required": ["discovery"]},
    "Home": {"type": "object", "properties": {
        "name": {"type": "string"}, "version": {"type": "string"}, "description": {"type": "string"},
        "links": {"type": "object", "additionalProperties": {"type": "string"}}},
        "required": ["name", "links"]},
    "Health": {"type": "object", "properties": {"status": {"const": "ok"}, "ready": {"type": "boolean"},
                                                "devnet": {"type": "boolean"}, "skills": {"type": "integer"}},
               "required": ["status", "ready"]},
    "Readiness": {"type": "object", "properties": {
        "ready": {"type": "boolean"},
        "not_ready": {"type": "object", "additionalProperties": {"type": "string"}}}, "required": ["ready"]},
}


def _payment_required_schemas() -> dict[str, Any]:
    """The 402 body: the x402 SDK's v1 PaymentRequired (what legacy clients read), plus paywire's
    `reason` for a refused payment; v2 is the `PAYMENT-REQUIRED` header."""
    schema = TypeAdapter(PaymentRequiredV1).json_schema(by_alias=True, mode="serialization",
                                                        ref_template=_REF)
    defs = schema.pop("$defs", {})
    schema["properties"]["reason"] = {"type": "string", "description": "Why a payment was refused "
                                      "(the SDK's reason code), absent on a plain quote."}
    return {**defs, "PaymentRequired": schema}


_HEADERS = {
    "PAYMENT-REQUIRED": {"description": "x402 v2 PaymentRequired, base64 JSON: the accepted payments "
                         "(one per network), the resource and its extensions.", "schema": {"type": "string"}},
    "PAYMENT-RESPONSE": {"description": "x402 settlement receipt (base64 JSON): network, transaction, payer.",
                         "schema": {"type": "string"}},
    "X-PAYMENT-RESPONSE": {"description": "The same receipt under x402 v1's header name.",
                           "schema": {"type": "string"}},
    "Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "string"}},
}
_PAYMENT_PARAMETERS = [
    {"name": "PAYMENT-SIGNATURE", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "x402 v2 payment payload (base64 JSON), signed for one of the 402's `accepts`."},
    {"name": "X-PAYMENT", "in": "header", "required": False, "schema": {"type": "string"},
     "description": "The payment under x402 v1's header name (either header; not both needed)."},
]
_X402_SCHEME = {
    "type": "http", "scheme": "X402",
    "description": "x402 (https://x402.org): call without payment to get HTTP 402 with the price in the "
                   "`PAYMENT-REQUIRED` header (and the v1 JSON body); sign one of its `accepts` (USDC on "
                   "Base or Solana) and repeat the identical request with the payment in "
                   "`PAYMENT-SIGNATURE` (or `X-PAYMENT`). The 200 carries the settlement receipt in "
                   "`PAYMENT-RESPONSE`.",
}
_ERROR_CODES = {
    "400": "Invalid input: the error names the field (`param`) and how to fix it.",
    "403": "The payer is on the operator's deny list.",
    "404": "No such model or resource.",
    "409": "The payment is being settled for another request, or was already used for other input.",
    "413": "The body is larger than the limit.",
    "429": "Too many quotes or refused payments from this client; see Retry-After.",
    "502": "The upstream failed; nothing was charged.",
    "503": "Not available now (payments not ready, the skill switched off or not configured, a "
           "settlement pending); see Retry-After.",
    "504": "The upstream timed out; nothing was charged.",
}


_ERROR_SHAPES = ("Error", "MarketplaceError", "A2AError")


def _error_responses() -> dict[str, Any]:
    """components.responses: each error status in each face's shape (`Error400`...), and the 402,
    referenced by every operation (a catalogue of thousands stays a reasonable document)."""
    out: dict[str, Any] = {}
    for shape in _ERROR_SHAPES:
        for code, text in _ERROR_CODES.items():
            response = out[f"{shape}{code}"] = {"description": text, "content": _json(_ref(shape))}
            if code in ("429", "503"):
                response["headers"] = {"Retry-After": {"$ref": "#/components/headers/Retry-After"}}
    out["PaymentRequired"] = {
        "description": "Payment required: the quote (`PAYMENT-REQUIRED` header, v1 body), or why a payment "
                       "was refused.",
        "headers": {"PAYMENT-REQUIRED": {"$ref": "#/components/headers/PAYMENT-REQUIRED"}},
        "content": _json(_ref("PaymentRequired"))}
    return out


def _errors(schema: str, codes: tuple[str, ...] = tuple(_ERROR_CODES)) -> dict[str, Any]:
    return {code: {"$ref": f"#/components/responses/{schema}{code}"} for code in codes}


def _paid(operation: dict[str, Any], terms: PriceTerms | None, error_schema: str,
          ok: dict[str, Any]) -> dict[str, Any]:
    """A paid operation: 200 with the receipt, 402 with the quote, the pipeline's errors; the price as
    `x-payment-info`. A free one (terms free) has no 402 and no security."""
    if terms is not None and not terms.paid:
        operation.update(security=[], responses={"200": ok, **_errors(error_schema, ("400", "404", "503"))})
        return operation
    ok = {**ok, "headers": {name: {"$ref": f"#/components/headers/{name}"}
                            for name in ("PAYMENT-RESPONSE", "X-PAYMENT-RESPONSE")}}
    payment = [{"$ref": f"#/components/parameters/{p['name']}"} for p in _PAYMENT_PARAMETERS]
    operation["parameters"] = [*operation.get("parameters", []), *payment]
    operation["security"] = [{"x402": []}]
    operation["responses"] = {
        "200": ok,
        "402": {"$ref": "#/components/responses/PaymentRequired"},
        **_errors(error_schema),
    }
    if terms is not None:
        operation["x-payment-info"] = terms.as_json()
        operation["description"] = (operation.get("description", "") + f"\n\nPrice: {terms.summary}.").strip()
    return operation


# ---------------------------------------------------------------------------------------------- /v1

_MODEL_OPERATIONS = {  # operation -> (operationId, summary, 200 content)
    "chat.completions": ("createChatCompletion", "Chat completion", {
        **_json(_SHAPES["responses"]["chat.completion"]),
        "text/event-stream": {"schema": {"type": "string", "description": "With `stream: true`: "
                                         "chat.completion.chunk events, then `data: [DONE]`."}}}),
    "completions": ("createCompletion", "Text completion (legacy)", {
        **_json(_SHAPES["responses"]["text_completion"]),
        "text/event-stream": {"schema": {"type": "string", "description": "With `stream: true`."}}}),
    "edits": ("createEdit", "Edit text (legacy; a chat call)", _json(_ref("Edit"))),
    "embeddings": ("createEmbedding", "Embeddings", _json(_SHAPES["responses"]["embeddings"])),
    "audio.speech": ("createSpeech", "Text to speech", {"audio/*": {"schema": _BINARY}}),
    "audio.transcriptions": ("createTranscription", "Transcribe audio", {
        **_json(_SHAPES["responses"]["transcription"]),
        "text/plain": {"schema": {"type": "string", "description": "text, srt or vtt formats."}}}),
    "audio.translations": ("createTranslation", "Translate audio into English", {
        **_json(_SHAPES["responses"]["translation"]),
        "text/plain": {"schema": {"type": "string", "description": "text, srt or vtt formats."}}}),
    "audio.generations": ("createSoundGeneration", "Sound effects from a prompt",
                          {"audio/mpeg": {"schema": _BINARY}}),
    "images.generations": ("createImage", "Generate images", _json(_SHAPES["responses"]["images"])),
    "images.edits": ("createImageEdit", "Edit images", _json(_SHAPES["responses"]["images"])),
}
_UPLOAD_FIELDS = {"file": _BINARY, "mask": _BINARY,
                  "image": {"anyOf": [_BINARY, {"type": "array", "items": _BINARY}]}}


def _model_body(gateway: Gateway, operation: str, form: bool) -> dict[str, Any]:
    """The route's field table (declared checks), typed by OpenAI's request type where the table's
    check declares nothing; `model` is one of the models serving the operation here."""
    schema = gateway.catalogue.request_schema(operation) or {"type": "object"}
    openai = _SHAPES["requests"].get(operation, {"properties": {}, "required": []})
    properties: dict[str, Any] = schema.get("properties", {})
    for name, declared in properties.items():
        if form and name in _UPLOAD_FIELDS:
            properties[name] = {**_UPLOAD_FIELDS[name], "description": declared.get("description", "")}
        elif set(declared) == {"description"} and name in openai["properties"]:
            properties[name] = {**copy.deepcopy(openai["properties"][name]), **declared}
    models = [s.id for s in gateway.catalogue.of_kind("model") if operation in s.operations]
    if "model" in properties:
        properties["model"] = {"type": "string", "description": "A model id from GET /v1/models that "
                               "serves this route.", **({"enum": models} if models else {})}
    required = [n for n in openai["required"] if n in properties]
    if gateway.default_model(operation) is not None:
        required = [n for n in required if n != "model"]
    if required:
        schema["required"] = required
    return schema


def _model_path(gateway: Gateway, path: str, operation: str, form: bool, limit: int) -> dict[str, Any]:
    op_id, summary, content = _MODEL_OPERATIONS[operation]
    schema = _model_body(gateway, operation, form)
    media = "multipart/form-data" if form else "application/json"
    body: dict[str, Any] = {"schema": schema}
    example = next((s.examples[0] for s in gateway.catalogue.of_kind("model")
                    if operation == "chat.completions" and operation in s.operations and s.examples), None)
    if example is not None:
        body["example"] = example
    terms = gateway.catalogue.route_price_terms(operation)
    served = "" if terms is not None else " No model on this gateway serves it now."
    operation_doc = {
        "operationId": op_id, "summary": summary, "tags": ["Models (OpenAI-compatible)"],
        "description": f"OpenAI's `{path}`; only the listed fields are accepted (any other is refused, "
                       f"naming it). Body at most {limit} bytes.{served}",
        "requestBody": {"required": True, "content": {media: body}},
    }
    return {"post": _paid(operation_doc, terms, "Error", {"description": summary, "content": content})}


# ---------------------------------------------------------------------------------------------- resources

def _operation_id(skill_id: str) -> str:
    return "invoke_" + re.sub(r"[^A-Za-z0-9_]", "_", skill_id)


def _resource_path(gateway: Gateway, skill: Any, limit: int) -> dict[str, Any]:
    body: dict[str, Any] = {"schema": skill.input_schema}
    if skill.examples:
        body["example"] = skill.examples[0]
    operation = {
        "operationId": _operation_id(skill.id), "summary": skill.name, "description": skill.description,
        "tags": ["Marketplace", *skill.categories],
        "requestBody": {"required": True, "content": {"application/json": body}},
    }
    ok = {"description": "The resource's answer.", "content": _json({})}
    return {"post": _paid(operation, gateway.catalogue.price_terms(skill), "MarketplaceError", ok)}


# ---------------------------------------------------------------------------------------------- document

def _free(op_id: str, summary: str, schema: dict[str, Any], *, tags: list[str], description: str = "",
          parameters: list[dict[str, Any]] | None = None, errors: tuple[str, ...] = (),
          error_schema: str = "Error", media: str = "application/json") -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": op_id, "summary": summary, "tags": tags, "security": [],
        "responses": {"200": {"description": summary, "content": {media: {"schema": schema}}},
                      **_errors(error_schema, errors)}}
    if description:
        operation["description"] = description
    if parameters:
        operation["parameters"] = parameters
    return operation


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def build_document(gateway: Gateway, base_url: str, surface: Surface) -> dict[str, Any]:
    """The whole OpenAPI document for the registry as it is now."""
    catalogue = gateway.catalogue
    paths: dict[str, Any] = {}
    for path, (operation, form) in surface.model_routes.items():
        limit = surface.max_upload_bytes if form else surface.max_body_bytes
        paths[path] = _model_path(gateway, path, operation, form, limit)
    paths["/v1/models"] = {"get": _free("listModels", "The models, with prices and availability",
                                        _ref("ModelList"), tags=["Models (OpenAI-compatible)"])}
    paths["/v1/models/{model}"] = {"get": _free(
        "retrieveModel", "One model", _ref("PaywireModel"), tags=["Models (OpenAI-compatible)"],
        parameters=[{"name": "model", "in": "path", "required": True, "schema": {"type": "string"},
                     "description": "A model id (may hold a slash)."}], errors=("404",))}
    paths["/api/marketplace/apis"] = {"get": _free(
        "listResources", "The marketplace catalogue (free)", _ref("Catalogue"), tags=["Marketplace"],
        description="Paged and filtered server-side.", errors=("400",), error_schema="MarketplaceError",
        parameters=[
            _query("page", {"type": "integer", "minimum": 1, "default": 1}, "Page number, from 1."),
            _query("page_size", {"type": "integer", "minimum": 1, "default": surface.default_page_size},
                   f"Items per page; at most {surface.max_page_size} are returned."),
            _query("category", {"type": "string"}, "Only this category (case-insensitive)."),
            _query("keyword", {"type": "string"}, "Words to find in the id, name or description."),
            _query("q", {"type": "string"}, "The same as `keyword`."),
        ])}
    resources = [s for s in catalogue.all() if s.kind != "model"]
    generic = {"operationId": "invokeResource", "summary": "Call any marketplace resource by id",
               "tags": ["Marketplace"],
               "description": "The resource's own path below lists its input schema and price.",
               "parameters": [{"name": "resource_id", "in": "path", "required": True,
                               "schema": {"type": "string", "minLength": 1}}],
               "requestBody": {"required": True, "content": _json(_ref("AnyObject"))}}
    paths["/v1/marketplace/api/{resource_id}"] = {"post": _paid(
        generic, route_terms(catalogue.price_terms(s) for s in resources if s.kind == "resource"),
        "MarketplaceError", {"description": "The resource's answer.", "content": _json({})})}
    for skill in resources:
        paths[f"/v1/marketplace/api/{skill.id}"] = _resource_path(gateway, skill, surface.max_body_bytes)
    a2a = {"operationId": "a2a", "summary": "A2A JSON-RPC (1.0 and 0.3 methods)", "tags": ["A2A"],
           "description": "Send a message with a data part `{\"skill\": id, \"input\": {...}}`. Paid in band "
                          "(the a2a-x402 extension, v0.1 and v0.2) or, for a client without it, by HTTP 402 "
                          "and a payment header as on REST: the same price as the skill's own path.",
           "requestBody": {"required": True, "content": _json(_ref("JsonRpcRequest"))}}
    every_skill = route_terms(catalogue.price_terms(s) for s in catalogue.all())  # A2A and MCP sell them all
    a2a_op = _paid(a2a, every_skill,
                   "A2AError", {"description": "The JSON-RPC answer (SSE for streaming methods).",
                                    "content": {**_json(_ref("JsonRpcResponse")),
                                                "text/event-stream": {"schema": {"type": "string"}}}})
    a2a_op["security"] = [{}, {"x402": []}]  # help and task reads are free
    paths["/a2a"] = {"post": a2a_op}
    card = {"type": "object", "description": "The A2A agent card: skills with prices, interfaces, the "
            "a2a-x402 extension."}
    paths["/.well-known/agent-card.json"] = {"get": _free("agentCard", "A2A agent card (1.0)", card,
                                                          tags=["Discovery"])}
    paths["/.well-known/agent.json"] = {"get": _free("agentCardLegacy", "A2A agent card (0.3 shape)", card,
                                                     tags=["Discovery"])}
    paths[discovery.RESOURCES_PATH] = {"get": _free(
        "discoveryResources", "paywire's paid resources in the x402 discovery format",
        _ref("DiscoveryResources"), tags=["Discovery"], errors=("400", "503"),
        description="What a facilitator's bazaar lists, served by paywire itself: every paid route with "
                    "the requirements of its 402 and the price description (paginated).",
        parameters=[
            _query("limit", {"type": "integer", "minimum": 1, "maximum": discovery.MAX_LIMIT,
                             "default": discovery.DEFAULT_LIMIT}, "Items per page."),
            _query("offset", {"type": "integer", "minimum": 0, "maximum": discovery.MAX_OFFSET,
                              "default": 0}, "Items to skip."),
            *(_query(name, {"type": "string", "maxLength": discovery.MAX_QUERY_CHARS}, text)
              for name, text in (
                ("type", "Only this protocol type (`http`)."),
                ("payTo", "Only resources paid to this address."), ("scheme", "Only this scheme (`exact`)."),
                ("network", "Only resources payable on this network (CAIP-2)."),
                ("extensions", "Only resources whose 402 offers this extension (`bazaar`)."),
                ("q", "Words to find in the id, name, description or categories.")))])}
    paths[discovery.WELL_KNOWN_PATH] = {"get": _free(
        "x402WellKnown", "The x402 manifest: what this host is and where its catalogue is",
        _ref("X402Manifest"), tags=["Discovery"], description="Points at GET /discovery/resources.")}
    paths[OPENAPI_PATH] = {"get": _free("openapi", "This document", _ref("AnyObject"), tags=["Discovery"])}
    home = _free("home", "The catalogue page (a browser), or where everything is (JSON)", _ref("Home"),
                 tags=["Discovery"], description="Asking for text/html (a browser) gets the catalogue page; "
                 "any other client a JSON document linking the agent card, this document, discovery, MCP "
                 "and the catalogue.")
    home["responses"]["200"]["content"]["text/html"] = {"schema": {"type": "string"}}
    paths["/"] = {"get": home}
    paths["/mcp"] = {"post": {
        "operationId": "mcp", "summary": "MCP server (streamable HTTP)", "tags": ["MCP"],
        "description": "Every model operation and marketplace resource as an MCP tool; `tools/list` is "
                       "free, a paid `tools/call` follows x402's MCP transport (`_meta[\"x402/payment\"]`). "
                       "Speak MCP with an MCP client; the body is JSON-RPC.",
        "security": [{}, {"x402": []}],
        "requestBody": {"required": True, "content": _json(_ref("JsonRpcRequest"))},
        "responses": {"200": {"description": "JSON-RPC answer (JSON or SSE).",
                              "content": {**_json(_ref("JsonRpcResponse")),
                                          "text/event-stream": {"schema": {"type": "string"}}}},
                      "default": {"description": "An MCP transport error."}},
        **({"x-payment-info": every_skill.as_json()} if every_skill is not None else {})}}
    for path, summary in (("/health", "Liveness"), ("/healthz", "Liveness (alias)")):
        paths[path] = {"get": _free(path.strip("/"), summary, _ref("Health"), tags=["Operations"])}
    paths["/readyz"] = {"get": {**_free("readyz", "Readiness: 200 when paid calls can be taken",
                                        _ref("Readiness"), tags=["Operations"]),
                                "responses": {
                                    "200": {"description": "Ready", "content": _json(_ref("Readiness"))},
                                    "503": {"description": "Not ready, and why", "content": _json(
                                        _ref("Readiness")), "headers": {
                                            "Retry-After": {"$ref": "#/components/headers/Retry-After"}}}}}}
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": "paywire", "version": API_VERSION,
                 "description": "Pay-per-call AI models and marketplace resources, paid in USDC with x402 "
                                "on Base and Solana. Every paid operation lists its price in "
                                "`x-payment-info`."},
        "servers": [{"url": base_url}],
        "tags": [{"name": n} for n in ("Models (OpenAI-compatible)", "Marketplace", "A2A", "MCP",
                                       "Discovery", "Operations")],
        "paths": paths,
        "components": {
            "schemas": {**copy.deepcopy(_SHAPES["schemas"]), **_payment_required_schemas(), **_OWN_SCHEMAS},
            "responses": _error_responses(),
            "parameters": {p["name"]: p for p in _PAYMENT_PARAMETERS},
            "headers": _HEADERS,
            "securitySchemes": {"x402": _X402_SCHEME},
        },
    }


class OpenApiDocument:
    """The document as JSON bytes, rebuilt only when the registry has grown (a catalogue of 2,000
    resources: ~0.65 s and 4.8 MB, built in a worker thread so the event loop keeps serving)."""

    def __init__(self, gateway: Gateway, base_url: str, surface: Surface) -> None:
        self._gateway, self._base_url, self._surface = gateway, base_url, surface
        self._built: tuple[int, bytes] | None = None

    def cached(self) -> bytes | None:
        """The document if it is current, else None (build it with `current`)."""
        built = self._built
        return built[1] if built is not None and built[0] == len(self._gateway.catalogue) else None

    def current(self) -> bytes:
        state = len(self._gateway.catalogue)
        built = self._built
        if built is None or built[0] != state:
            document = build_document(self._gateway, self._base_url, self._surface)
            built = self._built = (state, json.dumps(document, ensure_ascii=False).encode())
        return built[1]


def routes(gateway: Gateway, base_url: str, surface: Surface) -> list[Route]:
    document = OpenApiDocument(gateway, base_url, surface)

    async def openapi(request: Request) -> Response:
        body = document.cached()
        if body is None:
            body = await asyncio.to_thread(document.current)
        return Response(body, media_type="application/json", headers={"Cache-Control": "public, max-age=60"})

    return [Route(OPENAPI_PATH, openapi, methods=["GET"])]
