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
document is built once per registry version (it moves when a skill is added, replaced or removed).
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

from agent.edge import rpc
from agent.edge.rpc import Envelope
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
    "Probe": {"type": "object", "maxProperties": 0, "description": "An empty body (or none at all) "
              "without a payment: an indexer's probe, answered with the route's quote (402; a route over "
              "many models quotes its minimum). With a payment it is refused like any invalid body."},
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


def _rpc_schemas() -> dict[str, Any]:
    """What the JSON-RPC edge (agent/edge/rpc.py `check_envelope`) lets through on /a2a and /mcp, by
    each face's envelope: a request (jsonrpc "2.0", a plain id, a non-empty method, params an
    object), and on MCP a notification (no id) or a client's reply. A method's own params are the
    protocol's to check (A2A, MCP): a JSON-RPC error in a 200."""
    def plain_id(envelope: Envelope) -> dict[str, Any]:
        kinds = [{"type": "string", "maxLength": rpc.MAX_ID_CHARS},
                 {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}]
        return {"anyOf": [*kinds, *([{"type": "null"}] if envelope.null_id else [])]}

    def request(envelope: Envelope, methods: str) -> dict[str, Any]:
        return {"type": "object", "properties": {
            "jsonrpc": {"const": "2.0"}, "id": plain_id(envelope),
            "method": {"type": "string", "minLength": 1, "description": methods},
            "params": {"type": "object"}}, "required": ["jsonrpc", "method"]}

    a2a = request(rpc.A2A_ENVELOPE, "A2A 1.0 (SendMessage, GetTask...) or 0.3 (message/send, tasks/get...) "
                                    "method names.")
    mcp = request(rpc.MCP_ENVELOPE, "initialize, ping, tools/list, tools/call (another method: a JSON-RPC "
                                    "error); without an id, a notification.")
    # the MCP SDK reads a reply's error as its ErrorData (pydantic, lax): a code a boolean or digits
    # also pass as a whole number
    code = {"anyOf": [{"type": "integer"}, {"type": "boolean"},
                      {"type": "string", "pattern": "^[+-]?[0-9]+$"}]}
    reply = {"type": "object", "description": "A client's answer to a server request (this stateless "
             "server sends none: taken, 202, and ignored).", "properties": {
                 "jsonrpc": {"const": "2.0"}, "id": plain_id(rpc.MCP_ENVELOPE), "result": {"type": "object"},
                 "error": {"type": "object", "properties": {"code": code, "message": {"type": "string"},
                                                            "data": {}}, "required": ["code", "message"]}},
        "required": ["jsonrpc", "id"], "oneOf": [{"required": ["result"]}, {"required": ["error"]}],
        "not": {"required": ["method"]}}
    # each kind of message its own component: openapi-python-client builds inline union branches twice
    # (a duplicate model, and a client module importing one it never wrote)
    kinds = {"McpRequest": mcp, **({"McpReply": reply} if rpc.MCP_ENVELOPE.replies else {})}
    return {"JsonRpcRequest": {**a2a, "required": ["jsonrpc", "id", "method"]}, **kinds,
            "McpMessage": {"anyOf": [_ref(kind) for kind in kinds]}}


def _payment_required_schemas() -> dict[str, Any]:
    """The 402 body: the x402 SDK's v1 PaymentRequired (what legacy clients read), plus paywire's
    `reason` for a refused payment; v2 is the `PAYMENT-REQUIRED` header."""
    schema = TypeAdapter(PaymentRequiredV1).json_schema(by_alias=True, mode="serialization",
                                                        ref_template=_REF)
    defs = schema.pop("$defs", {})
    schema["properties"]["reason"] = {"type": "string", "description": "Why a payment was refused "
                                      "(the SDK's reason code), absent on a plain quote."}
    schema["properties"]["message"] = {"type": "string", "description": "On the /v1 model routes: "
                                       "how to pay, in words (where OpenAI's clients read an error)."}
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
_PAYMENT_HEADER = {"type": "string", "contentEncoding": "base64", "contentMediaType": "application/json"}
# x402 v2's payment header is the security scheme; v1's name for it, a parameter
_PAYMENT_PARAMETERS = [
    {"name": "X-PAYMENT", "in": "header", "required": False, "schema": _PAYMENT_HEADER,
     "description": "The payment under x402 v1's header name (instead of `PAYMENT-SIGNATURE`)."},
]
_X402_SCHEME = {
    "type": "apiKey", "in": "header", "name": "PAYMENT-SIGNATURE",
    "description": "x402 (https://x402.org): call without payment to get HTTP 402 with the price in the "
                   "`PAYMENT-REQUIRED` header (and the v1 JSON body); sign one of its `accepts` (USDC on "
                   "Base or Solana) and repeat the identical request with the payment in "
                   "`PAYMENT-SIGNATURE` (x402 v2's payment payload, base64 JSON, standard or URL-safe; "
                   "or in `X-PAYMENT`). Not base64 JSON: 400 `invalid_payment_header`; a payment that does "
                   "not pay the quote: 402 saying why. The 200 carries the settlement receipt in "
                   "`PAYMENT-RESPONSE`.",
}
_ERROR_CODES = {  # every error a route may answer, by status; the codes (`error.code`) each can carry
    "400": "Invalid input (`invalid_input`, `invalid_body`, `invalid_form`, `invalid_content_type`, "
           "`missing_model`, `unsupported_operation`, `invalid_parameter`), an invalid payment header "
           "(`invalid_payment_header`, `invalid_payment_identifier`), or the upstream refused the "
           "request (`upstream_error`): the error names the field (`param`) and how to fix it.",
    "403": "The payer is on the operator's deny list (`payer_denied`); nothing was charged.",
    "404": "No such model (`model_not_found`) or resource (`unknown_resource`).",
    "408": "The request's headers or body did not arrive in time (`request_timeout`); the connection "
           "is closed.",
    "409": "The payment is being settled for another request (`payment_in_progress`), or was already "
           "used for other input (`payment_identifier_conflict`).",
    "413": "The body (`body_too_large`) or upload (`upload_too_large`) is larger than the limit.",
    "429": "Too many quotes or refused payments from this client or payer (`rate_limited`); see "
           "Retry-After.",
    "500": "The skill failed (`skill_failed`); nothing was charged.",
    "502": "The upstream failed (`upstream_error`); nothing was charged.",
    "503": "Not available now: switched off by the operator (`skill_disabled`), not configured here "
           "(`skill_unavailable`, `model_unavailable`), payments not ready (`facilitator_unavailable`), "
           "the ledger unreachable (`ledger_unavailable`), or a settlement still pending "
           "(`settlement_pending`, `cancelled_before_settlement`); see Retry-After.",
    "504": "The upstream timed out (`upstream_error`); nothing was charged.",
}
_RETRY_AFTER = ("429", "503")
# What each kind of operation may answer besides 200 (and a paid one's 402)
_PAID_ERRORS = ("400", "403", "404", "408", "409", "413", "429", "500", "502", "503", "504")
_FREE_CALL_ERRORS = ("400", "404", "408", "413", "500", "502", "503", "504")  # a free skill: no payment
_READ_ERRORS = ("408",)  # a GET: only a slow client
# /a2a answers its errors as JSON-RPC in HTTP 200, but for the statuses a plain HTTP client acts on
# (agent/edge/http_io.py A2A_HTTP_STATUSES) and server-side failures
_A2A_ERRORS = ("401", "403", "408", "429", "500", "502", "503", "504")


_ERROR_SHAPES = ("Error", "MarketplaceError", "A2AError")


def _error_responses() -> dict[str, Any]:
    """components.responses: each error status in each face's shape (`Error400`...), and the 402,
    referenced by every operation (a catalogue of thousands stays a reasonable document)."""
    out: dict[str, Any] = {}
    for shape in _ERROR_SHAPES:
        for code, text in _ERROR_CODES.items():
            response = out[f"{shape}{code}"] = {"description": text, "content": _json(_ref(shape))}
            if code in _RETRY_AFTER:
                response["headers"] = {"Retry-After": {"$ref": "#/components/headers/Retry-After"}}
    out["Error401"] = {"description": "The SIGN-IN-WITH-X proof or task token is not valid "
                                      "(`invalid_identity`).", "content": _json(_ref("A2AError"))}
    out["PaymentRequired"] = {
        "description": "Payment required: the quote (`PAYMENT-REQUIRED` header, v1 body), or why a payment "
                       "was refused.",
        "headers": {"PAYMENT-REQUIRED": {"$ref": "#/components/headers/PAYMENT-REQUIRED"}},
        "content": _json(_ref("PaymentRequired"))}
    return out


def _errors(schema: str, codes: tuple[str, ...]) -> dict[str, Any]:
    return {code: {"$ref": "#/components/responses/" + ("Error401" if code == "401" else f"{schema}{code}")}
            for code in codes}


def _paid(operation: dict[str, Any], terms: PriceTerms | None, error_schema: str,
          ok: dict[str, Any], errors: tuple[str, ...] = _PAID_ERRORS) -> dict[str, Any]:
    """A paid operation: 200 with the receipt, 402 with the quote, the pipeline's errors; the price as
    `x-payment-info`. A free one (terms free) has no 402 and no security."""
    if terms is not None and not terms.paid:
        operation.update(security=[], responses={"200": ok, **_errors(error_schema, _FREE_CALL_ERRORS)})
        return operation
    ok = {**ok, "headers": {name: {"$ref": f"#/components/headers/{name}"}
                            for name in ("PAYMENT-RESPONSE", "X-PAYMENT-RESPONSE")}}
    payment = [{"$ref": f"#/components/parameters/{p['name']}"} for p in _PAYMENT_PARAMETERS]
    operation["parameters"] = [*operation.get("parameters", []), *payment]
    operation["security"] = [{"x402": []}]
    operation["responses"] = {
        "200": ok,
        "402": {"$ref": "#/components/responses/PaymentRequired"},
        **_errors(error_schema, errors),
    }
    if terms is not None:
        operation["x-payment-info"] = terms.as_json()
        operation["description"] = (operation.get("description", "") + f"\n\nPrice: {terms.summary}.").strip()
    return operation


def _probe_body(schema: dict[str, Any]) -> dict[str, Any]:
    """A paid route's JSON body: `schema`, or `{}` (with no body at all: the probe)."""
    return {"anyOf": [schema, _ref("Probe")]}


# JSON Schema's keywords whose values are schemas: one, a list of them, a mapping of them
_SUBSCHEMA = frozenset({"items", "additionalProperties", "not", "if", "then", "else", "contains",
                        "propertyNames", "unevaluatedItems", "unevaluatedProperties"})
_SUBSCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SUBSCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas", "$defs"})


def for_generators(schema: Any) -> Any:
    """A request body `schema` as client generators can read it, meaning the same: an array without
    `items` gets `items: {}` (openapi-python-client 0.29 drops an operation whose body has one), and a
    boolean `const` becomes a boolean that is `not` the other value (the generator writes an optional
    boolean const's check as `!= Falseand ...`, a syntax error)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key, value in schema.items():
        if key in _SUBSCHEMA:
            out[key] = for_generators(value)
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [for_generators(item) for item in value]
        elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: for_generators(item) for name, item in value.items()}
    types = out.get("type")
    if (types == "array" or isinstance(types, list) and "array" in types) and not (
            {"items", "prefixItems"} & out.keys()):
        out["items"] = {}
    if isinstance(out.get("const"), bool) and "not" not in out:
        value = out.pop("const")
        out = {"type": "boolean", **out, "not": {"const": not value}}
    return out


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


def _model_body(gateway: Gateway, operation: str, form: bool) -> dict[str, Any]:
    """The route's body: its field table with each model's own limits (the catalogue's
    `request_schema`: the checks that enforce them), `model` one of the models serving the route
    (required unless the route has a default); a field no check declares (an output cap, whose
    limit is each model's own) typed by OpenAI's request type."""
    default = gateway.default_model(operation)
    schema = gateway.catalogue.request_schema(operation, default) or {"type": "object", "properties": {}}
    openai = _SHAPES["requests"].get(operation, {"properties": {}})
    properties: dict[str, Any] = schema["properties"]
    for name, declared in properties.items():
        if set(declared) == {"description"} and name in openai["properties"]:
            properties[name] = {**copy.deepcopy(openai["properties"][name]), **declared}
    models = [s.id for s in gateway.catalogue.of_kind("model") if operation in s.operations]
    properties["model"] = {"type": "string", "description": "A model id from GET /v1/models that "
                           "serves this route.", **({"enum": models} if models else {})}
    if default is None:
        schema["required"] = ["model", *schema.get("required", [])]
    return _form_body(schema) if form else schema


def _form_body(schema: dict[str, Any]) -> dict[str, Any]:
    """A body as multipart/form-data carries it: without null (a form has none: a field is sent or
    not); an array as `name[]` parts (one part: an array of one), as OpenAI's clients send them; a
    field taking a value or an array as `name` or `name[]`, one of the two."""
    schema = _without_null(schema)
    properties: dict[str, Any] = {}
    choices = []
    for name, prop in schema["properties"].items():
        branches = prop.get("anyOf", [])
        many = next((b for b in branches if b.get("type") == "array"), None)
        if prop.get("type") == "array":
            properties[f"{name}[]"] = prop
        elif many is not None and len(branches) == 2:
            one = next(b for b in branches if b is not many)
            extra = {k: v for k, v in prop.items() if k != "anyOf"}
            properties[name], properties[f"{name}[]"] = {**one, **extra}, {**many, **extra}
            either = [{"required": [name]}, {"required": [f"{name}[]"]}]
            required = name in schema.get("required", [])
            choices.append({"oneOf": either} if required else {"not": {"allOf": either}})
        else:
            properties[name] = prop
    required = [n for n in schema.get("required", []) if n in properties]
    return {**schema, "properties": properties, "required": required,
            **({"allOf": [*schema.get("allOf", []), *choices]} if choices else {})}


def _encoding(schema: dict[str, Any]) -> dict[str, Any]:
    """multipart's `encoding`: each file part's formats (`x-media-types`, what the route reads it
    as; an array's, each of its parts')."""
    files = {name: prop.get("items", prop) for name, prop in schema["properties"].items()}
    return {name: {"contentType": ", ".join(file["x-media-types"])}
            for name, file in files.items() if "x-media-types" in file}


def _without_null(schema: Any) -> Any:
    """`schema` with null taken out everywhere (from types, enums and anyOf branches)."""
    if isinstance(schema, list):
        return [_without_null(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _without_null(value) for key, value in schema.items()}
    if isinstance(out.get("enum"), list):
        out["enum"] = [v for v in out["enum"] if v is not None]
    if "anyOf" in out:
        kept = [b for b in out["anyOf"] if b != {"type": "null"}]
        if len(kept) == 1:
            del out["anyOf"]
            out = {**kept[0], **out}
        else:
            out["anyOf"] = kept
    return out


def _model_path(gateway: Gateway, path: str, operation: str, form: bool, limit: int) -> dict[str, Any]:
    op_id, summary, content = _MODEL_OPERATIONS[operation]
    schema = for_generators(_model_body(gateway, operation, form))
    media = "multipart/form-data" if form else "application/json"
    body: dict[str, Any] = {"schema": schema, "encoding": _encoding(schema)} if form else {
        "schema": _probe_body(schema)}
    example = next((s.examples[0] for s in gateway.catalogue.of_kind("model")
                    if operation == "chat.completions" and operation in s.operations and s.examples), None)
    if example is not None:
        body["example"] = example
    terms = gateway.catalogue.route_price_terms(operation)
    served = "" if terms is not None else " No model on this gateway serves it now."
    probe = "no body" if form else "no body or `{}`"
    operation_doc = {
        "operationId": op_id, "summary": summary, "tags": ["Models (OpenAI-compatible)"],
        "description": f"OpenAI's `{path}`; only the listed fields are accepted (any other is refused, "
                       f"naming it). Body at most {limit} bytes; {probe} without a payment: the route's "
                       f"quote (its minimum).{served}",
        "requestBody": {"required": False, "content": {media: body}},
    }
    return {"post": _paid(operation_doc, terms, "Error", {"description": summary, "content": content})}


# ---------------------------------------------------------------------------------------------- resources

def _operation_id(skill_id: str) -> str:
    return "invoke_" + re.sub(r"[^A-Za-z0-9_]", "_", skill_id)


def _resource_path(gateway: Gateway, skill: Any, limit: int) -> dict[str, Any]:
    body: dict[str, Any] = {"schema": _probe_body(for_generators(skill.body_schema))}
    if skill.examples:
        body["example"] = skill.examples[0]
    operation = {
        "operationId": _operation_id(skill.id), "summary": skill.name, "description": skill.description,
        "tags": ["Marketplace", *skill.categories],
        "requestBody": {"required": False, "content": {"application/json": body}},
    }
    ok = {"description": "The resource's answer.", "content": _json({})}
    return {"post": _paid(operation, gateway.catalogue.price_terms(skill), "MarketplaceError", ok)}


# ---------------------------------------------------------------------------------------------- document

def _free(op_id: str, summary: str, schema: dict[str, Any], *, tags: list[str], description: str = "",
          parameters: list[dict[str, Any]] | None = None, errors: tuple[str, ...] = (),
          error_schema: str = "Error", media: str = "application/json") -> dict[str, Any]:
    """A free operation: 200, `errors`, and what any request may get (a slow client's 408)."""
    operation: dict[str, Any] = {
        "operationId": op_id, "summary": summary, "tags": tags, "security": [],
        "responses": {"200": {"description": summary, "content": {media: {"schema": schema}}},
                      **_errors(error_schema, tuple(sorted({*errors, *_READ_ERRORS})))}}
    if description:
        operation["description"] = description
    if parameters:
        operation["parameters"] = parameters
    return operation


def _mcp(every_skill: PriceTerms | None) -> dict[str, Any]:
    """POST /mcp: the SDK's streamable HTTP transport (stateless) behind the JSON-RPC edge."""
    def rpc_error(text: str) -> dict[str, Any]:
        return {"description": text, "content": _json(_ref("JsonRpcError"))}

    return {
        "operationId": "mcp", "summary": "MCP server (streamable HTTP)", "tags": ["MCP"],
        "description": "Every model operation and marketplace resource as an MCP tool; `tools/list` is "
                       "free, a paid `tools/call` follows x402's MCP transport (`_meta[\"x402/payment\"]`). "
                       "Speak MCP with an MCP client; the body is JSON-RPC, the `Accept` header must name "
                       "application/json (MCP clients send `application/json, text/event-stream`).",
        "security": [{}, {"x402": []}],
        "requestBody": {"required": True, "content": _json(_ref("McpMessage"))},
        "responses": {
            "200": {"description": "The JSON-RPC answer (JSON or SSE): a result, or a JSON-RPC error for "
                                   "a method or params it refuses.",
                    "content": {**_json(_ref("JsonRpcResponse")),
                                "text/event-stream": {"schema": {"type": "string"}}}},
            "202": {"description": "A notification or a reply, taken (no body)."},
            "400": rpc_error("Not a JSON-RPC message this server takes (-32700, -32600, -32602)."),
            "406": rpc_error("The Accept header does not name application/json."),
            "408": {"$ref": "#/components/responses/Error408"},
            "413": rpc_error("The body is larger than the limit."),
        },
        **({"x-payment-info": every_skill.as_json()} if every_skill is not None else {})}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    """A query parameter; empty (`?page=`, as an HTML form sends a blank field) is taken as absent."""
    if schema.get("type") != "string":
        schema = {"anyOf": [schema, {"const": ""}]}
    return {"name": name, "in": "query", "required": False, "schema": schema,
            "description": f"{description} Empty: as if absent."}


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
               "requestBody": {"required": False, "content": _json(_ref("AnyObject"))}}
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
                   "A2AError", {"description": "The JSON-RPC answer (SSE for streaming methods): a result, "
                                               "or a JSON-RPC error for a request it refuses.",
                                    "content": {**_json(_ref("JsonRpcResponse")),
                                                "text/event-stream": {"schema": {"type": "string"}}}},
                   _A2A_ERRORS)
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
    paths["/mcp"] = {"post": _mcp(every_skill)}
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
            "schemas": {**copy.deepcopy(_SHAPES["schemas"]), **_payment_required_schemas(), **_rpc_schemas(),
                        **_OWN_SCHEMAS},
            "responses": _error_responses(),
            "parameters": {p["name"]: p for p in _PAYMENT_PARAMETERS},
            "headers": _HEADERS,
            "securitySchemes": {"x402": _X402_SCHEME},
        },
    }


class OpenApiDocument:
    """The document as JSON bytes, rebuilt only when the registry changed (its version: a skill
    added, replaced or removed; 3,000 resources: ~0.5-0.8 s and 10 MB, built in a worker thread so
    the event loop keeps serving)."""

    def __init__(self, gateway: Gateway, base_url: str, surface: Surface) -> None:
        self._gateway, self._base_url, self._surface = gateway, base_url, surface
        self._built: tuple[int, bytes] | None = None

    def cached(self) -> bytes | None:
        """The document if it is current, else None (build it with `current`)."""
        built = self._built
        return built[1] if built is not None and built[0] == self._gateway.catalogue.version else None

    def current(self) -> bytes:
        state = self._gateway.catalogue.version
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
