"""The MCP face: paywire's skills as MCP tools, over streamable HTTP at /mcp (the official `mcp` SDK).

Tools (`tools/list`, free, paged by cursor), what a call can buy now (the one availability rule,
`Catalogue.available`: not switched off by the operator, runnable as configured):
- one tool per marketplace resource for sale (and the free `help`): its name from its id alone
  (`tool_name`), its description, its input JSON Schema. A resource that is not for sale is not
  listed; its name still calls, and answers its 503;
- one tool per JSON model operation (`chat_completions`, `embeddings`, `images_generations`...)
  with the model as an enum argument: a client shows its user a handful of tools, not one per
  model and operation (100+ models x operations would swamp a tool picker and an LLM's context).
  The enum lists the models for sale; an operation none of them serves is not listed. Operations
  that take an uploaded file (transcriptions, translations, image edits) are REST only.
Every tool's description ends with its price (`PriceTerms.summary`) and its `_meta` carries the
price terms (`paywire/price`; a model tool also each model's unit prices, `paywire/model_prices`).

The registry changes while clients page (federation imports, reprices and withdraws resources):
- the tools are listed in one total order (help, the model tools, then the rest, each by name) and
  a cursor names the last tool of its page (`_cursor`): the next page starts after that place,
  whether or not that tool still exists, so a change between pages neither repeats nor skips a
  tool that stays (a tool added before the cursor shows on the next full listing);
- a tool's name depends on its skill's id only (`tool_name`), never on which other skills exist
  or their order: removing one never renames another;
- the table is rebuilt per catalogue generation, but each skill's tool is kept while the registry
  holds the same Skill object: after one change only that skill's tool is built again.

`tools/call` is the one pipeline (`Gateway.call`), x402's MCP transport (tool-result binding):
no payment -> an `isError` result whose `structuredContent` (and `content[0].text`) is the v2
`PaymentRequired`; a payment in `params._meta["x402/payment"]` -> the result with the settlement
receipt in `result._meta["x402/payment-response"]`; a refusal -> an `isError` result with the code,
message and field (and the receipt when there is one). Same price, ledger and exactly-once claim as
REST and A2A: the same payment again gets the kept result, never a second charge. Streaming model
operations run non-streamed here (a tool result is whole); `stream: true` is refused naming it.

Stateless streamable HTTP with JSON answers: every POST stands alone (no session to pin to a
replica, nothing to resume). What enters passes the JSON-RPC edge first (agent/edge/rpc.py: the
body bounded, its JSON structure and envelope checked before the SDK parses it; a browser's Origin
checked by http_io.OriginGuard), and a request for a method MCP does not have is -32601 here (the
SDK's request model would refuse it as -32602).
"""

from __future__ import annotations

import base64
import binascii
import bisect
import logging
import re
import time
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, get_args

from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import McpError
from starlette.requests import Request
from starlette.routing import Route
from x402.extensions.bazaar import BAZAAR, DeclareMcpDiscoveryConfig, declare_mcp_discovery_extension

from agent.edge.http_io import HttpProblem, client_address, json_bytes, json_value
from agent.edge.rpc import MCP_ENVELOPE, take_rpc
from agent.pipeline.catalogue import HELP_SKILL, mcp_tool_name
from agent.pipeline.gateway import Gateway
from agent.pipeline.outcomes import Delivered, Outcome, PaymentDemanded, Refused
from agent.pipeline.price_terms import PriceTerms, route_terms
from agent.pipeline.requests import CallRequest, Payment
from agent.pipeline.timing import Timings
from agent.version import VERSION

if TYPE_CHECKING:
    from skills.skill import Skill

log = logging.getLogger(__name__)

PAYMENT_META = "x402/payment"  # params._meta key of the payment (x402's MCP transport)
RECEIPT_META = "x402/payment-response"  # result._meta key of the settlement receipt
PRICE_META = "paywire/price"  # a tool's _meta: its PriceTerms.as_json()
MODEL_PRICES_META = "paywire/model_prices"  # a model tool's _meta: {model id: its unit prices}
SKILL_META = "paywire/skill"  # a resource tool's _meta: the skill id (the REST route's)
OPERATION_META = "paywire/operation"  # a model tool's _meta: the operation (chat.completions...)
EXAMPLE_META = "paywire/example"  # a resource tool's _meta: its first example arguments
TOOLS_PER_PAGE = 100  # tools/list page size; operators may load thousands of resources
TIMINGS_STATE = "paywire_mcp_timings"  # request state: the pipeline's stage timings of this POST
# Model operations whose request carries an uploaded file (multipart on REST): not offered here.
UPLOAD_OPERATIONS = frozenset({"audio.transcriptions", "audio.translations", "images.edits"})
_STREAM_FIELDS = frozenset({"stream", "stream_options"})  # REST only: a tool result is whole
_CURSOR_CHARS = 100  # a cursor is base64url of "<rank>:<name>": at most 90 characters
_CURSOR_TEXT = re.compile(r"([0-2]):([a-zA-Z0-9_-]{1,64})")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")
_EXAMPLE_CHARS = 600  # an example longer than this stays out of the description (it is in _meta)
INSTRUCTIONS = (
    "paywire sells AI models and data resources per call, paid in USDC with x402 on Base or Solana. "
    "A paid tool first answers a PaymentRequired result (isError, x402 v2 JSON); an x402 MCP client "
    "signs one of its `accepts` and calls again with the payment in _meta[\"x402/payment\"]; the "
    "result carries the receipt in _meta[\"x402/payment-response\"]. Retrying with the same payment "
    "returns the same result and charges nothing more. The free `help` tool lists what is for sale.")

_OPERATION_TITLES = {
    "chat.completions": "Chat completion, OpenAI's /v1/chat/completions request body",
    "completions": "Text completion, OpenAI's /v1/completions request body",
    "edits": "Text edit, OpenAI's /v1/edits request body",
    "embeddings": "Embeddings, OpenAI's /v1/embeddings request body",
    "audio.speech": "Text to speech, OpenAI's /v1/audio/speech request body; the audio comes back",
    "audio.generations": "Sound generation from a text prompt (/v1/audio/generations); the audio comes back",
    "images.generations": "Image generation, OpenAI's /v1/images/generations request body",
}


@dataclass(frozen=True)
class ToolTarget:
    """What a tool name calls: one skill (a resource, help), or a model operation over `models`;
    `extensions`: the x402 bazaar description its 402 carries."""

    name: str
    skill: Skill | None = None
    operation: str | None = None
    models: frozenset[str] = frozenset()
    extensions: dict[str, Any] = field(default_factory=dict)


Key = tuple[int, str]  # a tool's place in tools/list: (rank, name)


@dataclass
class ToolTable:
    """Every tool, built once per catalogue generation (the registry's version and the
    operator's switches); `tools` in tools/list order, `keys` their places (sorted)."""

    generation: tuple[int, int]
    tools: list[types.Tool] = field(default_factory=list)
    keys: list[Key] = field(default_factory=list)
    targets: dict[str, ToolTarget] = field(default_factory=dict)


@dataclass(frozen=True)
class _Built:
    """One skill's tool, kept across rebuilds while the registry holds this very Skill object (a
    replaced skill is a new object)."""

    skill: Skill
    tool: types.Tool
    target: ToolTarget


def tool_name(skill_id: str, reserved: Collection[str] = ()) -> str:
    """The MCP tool name of the skill `skill_id` (agent/pipeline/catalogue.py's rule)."""
    return mcp_tool_name(skill_id, reserved)


def reserved_names(model_operations: Collection[str]) -> frozenset[str]:
    """The model tools' names (every model's operations but uploads, offered or not: a resource's
    name must not move when the operator switches a model off)."""
    return frozenset(operation_tool_name(op) for op in model_operations if op not in UPLOAD_OPERATIONS)


def operation_tool_name(operation: str) -> str:
    """`chat.completions` -> `chat_completions`."""
    return operation.replace(".", "_")


def _rank(tool: types.Tool) -> int:
    """help first (what a client should look at before anything else), the model tools, the rest."""
    if tool.name == HELP_SKILL:
        return 0
    return 1 if OPERATION_META in (tool.meta or {}) else 2


def _cursor(key: Key) -> str:
    """The cursor after `key`: opaque to clients (base64url), bounded, checked when it comes back."""
    return base64.urlsafe_b64encode(f"{key[0]}:{key[1]}".encode()).decode().rstrip("=")


def _cursor_key(cursor: str) -> Key | None:
    """The place a cursor names (None: not one this server could have given)."""
    if len(cursor) > _CURSOR_CHARS or not _BASE64URL.fullmatch(cursor):
        return None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, ValueError):
        return None
    found = _CURSOR_TEXT.fullmatch(text)
    return (int(found.group(1)), found.group(2)) if found is not None else None


def _example_text(example: dict[str, Any]) -> str | None:
    text = json_bytes(example).decode()
    return text if len(text) <= _EXAMPLE_CHARS else None


class McpFace:
    """The MCP server (low-level SDK server + stateless streamable-HTTP session manager) over the
    gateway. Mount `routes()`; run `running()` in the app's lifespan (the SDK's task group)."""

    def __init__(self, gateway: Gateway, base_url: str, max_body_bytes: int) -> None:
        self.gateway = gateway
        self.catalogue = gateway.catalogue
        self.url = f"{base_url}/mcp"
        self.max_body = max_body_bytes
        self._table: ToolTable | None = None
        self._built: dict[str, _Built] = {}  # each skill's tool, by skill id (see _Built)
        self.server: Server[Any, Request] = Server("paywire", version=VERSION, instructions=INSTRUCTIONS)
        # Handlers registered directly (what the SDK's decorators do underneath): the decorators
        # would validate arguments with their own messages before the pipeline (which names the
        # field and lets an empty probe be quoted) and re-list every tool on each call.
        self.server.request_handlers[types.ListToolsRequest] = self._list_tools
        self.server.request_handlers[types.CallToolRequest] = self._call_tool
        self.manager = StreamableHTTPSessionManager(
            self.server, stateless=True, json_response=True, max_request_body_size=max_body_bytes)
        quiet_sdk_logs()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The session manager's task group: every /mcp request's server runs in it."""
        async with self.manager.run():
            yield

    def routes(self) -> list[Route]:
        # This object as an ASGI app (Starlette treats a function or method as a request handler
        # with GET only): it answers every method itself. (`/mcp/` is redirected here, 307.)
        return [Route("/mcp", self)]

    # ---- HTTP -------------------------------------------------------------------------------------

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Passes the POST through the JSON-RPC edge before the SDK (its stdlib parse recurses
        without a depth limit); passes the pipeline's stage timings out as Server-Timing."""
        if scope["method"] != "POST":
            # Stateless: no session to resume or end (DELETE), nothing the server sends unasked
            # (the GET stream would stay open, idle, for as long as the client likes).
            await HttpProblem(405, "method_not_allowed", f"{scope['method']} is not served on "
                              "/mcp: send JSON-RPC requests with POST (stateless)").response(
                scope["path"], {"Allow": "POST"})(scope, receive, send)
            return
        started = time.perf_counter()
        post = await take_rpc(scope, receive, send, self.max_body, MCP_ENVELOPE)
        if post is None:
            return
        if "id" in post.message and post.method is not None and post.method not in MCP_METHODS:
            # answered as the SDK answers a request it took: a JSON-RPC error in a 200
            await HttpProblem(200, "method_not_found", "method not found: not an MCP request "
                              "method (this server serves initialize, ping, tools/list and "
                              "tools/call)", rpc_code=types.METHOD_NOT_FOUND,
                              rpc_id=post.rpc_id).response(scope["path"])(scope, receive, send)
            return
        holder: list[Timings] = []
        scope = {**scope, "state": {**scope.get("state", {}), TIMINGS_STATE: holder}}

        async def timed_send(message: Any) -> None:
            if message["type"] == "http.response.start" and holder:
                # the pipeline's stages, and the whole request's total (the SDK's work included)
                stages = [f"{name};dur={ms:.2f}" for name, ms in holder[-1].stages.items()]
                total = (time.perf_counter() - started) * 1000
                timing = ", ".join([*stages, f"total;dur={total:.2f}"]).encode()
                message = {**message, "headers": [*message.get("headers", []), (b"server-timing", timing)]}
            await send(message)

        await self.manager.handle_request(scope, post.replay(receive), timed_send)

    # ---- tools/list ---------------------------------------------------------------------------------

    def table(self) -> ToolTable:
        """The tools, rebuilt only when the registry or the operator's switches changed."""
        table = self._table
        if table is None or table.generation != self.catalogue.generation:
            table = self._table = self._build_table()
        return table

    def _build_table(self) -> ToolTable:
        table = ToolTable(generation=self.catalogue.generation)
        skills = self.catalogue.all()
        models = [s for s in skills if s.kind == "model"]
        by_operation: dict[str, list[Skill]] = {}
        for skill in models:
            if self.catalogue.available(skill):  # configured here, not switched off
                for op in skill.operations:
                    if op not in UPLOAD_OPERATIONS:
                        by_operation.setdefault(op, []).append(skill)
        listed: list[types.Tool] = []
        for op, serving in by_operation.items():
            name = operation_tool_name(op)
            tool = self._model_tool(name, op, serving)
            table.targets[name] = ToolTarget(name, operation=op, models=frozenset(m.id for m in serving),
                                             extensions=_bazaar(tool, None))
            listed.append(tool)
        reserved = reserved_names({op for m in models for op in m.operations})
        built: dict[str, _Built] = {}
        for skill in skills:
            if skill.kind == "model":
                continue
            name = tool_name(skill.id, reserved)
            if name in table.targets:  # two ids, one 48-bit digest: not by chance; never a crash
                log.warning("MCP tool name %s is taken; %s gets a numbered one", name, skill.id)
                name = _numbered(name, table.targets)
            kept = self._built.get(skill.id)
            if kept is None or kept.skill is not skill or kept.target.name != name:
                tool = self._skill_tool(name, skill)
                example = skill.examples[0] if skill.examples else None
                kept = _Built(skill, tool, ToolTarget(name, skill=skill, extensions=_bazaar(tool, example)))
            built[skill.id] = kept
            table.targets[name] = kept.target
            if self.catalogue.available(skill):  # listed when a call can buy it (else: its 503)
                listed.append(kept.tool)
        self._built = built  # a removed skill's tool goes with it
        listed.sort(key=lambda t: (_rank(t), t.name))
        table.tools = listed
        table.keys = [(_rank(t), t.name) for t in listed]
        return table

    def _skill_tool(self, name: str, skill: Skill) -> types.Tool:
        terms = self.catalogue.price_terms(skill)
        description = f"{skill.description}\nPrice: {terms.summary}."
        meta: dict[str, Any] = {SKILL_META: skill.id, PRICE_META: terms.as_json()}
        if skill.examples:
            meta[EXAMPLE_META] = skill.examples[0]
            example = _example_text(skill.examples[0])
            if example is not None:
                description += f"\nExample arguments: {example}"
        schema = skill.input_schema if skill.input_schema.get("type") == "object" else {
            "type": "object", **skill.input_schema}
        return types.Tool(name=name, title=skill.name, description=description, inputSchema=schema,
                          annotations=types.ToolAnnotations(title=skill.name, openWorldHint=True),
                          **{"_meta": meta})

    def _model_tool(self, name: str, op: str, models: list[Skill]) -> types.Tool:
        per_model = {m.id: self.catalogue.price_terms(m, op) for m in models}
        terms = _route_terms(per_model)
        ids = [m.id for m in models]
        title = _OPERATION_TITLES.get(op, f"{op} (OpenAI-style request body)")
        description = (f"{title}, on one of {len(ids)} models (argument `model`: "
                       f"{', '.join(ids[:8])}{', ...' if len(ids) > 8 else ''}).\n"
                       f"Price: {terms.summary}.")
        default = self.gateway.default_model(op)
        # the REST route's body (its field table: every accepted field, nothing else), with the
        # models as an enum and without the streaming fields (a tool result is whole)
        body = self.catalogue.request_schema(op) or {"type": "object", "additionalProperties": True}
        properties = {k: v for k, v in body.get("properties", {}).items() if k not in _STREAM_FIELDS}
        properties["model"] = {"type": "string", "enum": ids,
                               "description": "the model; GET /v1/models lists each one's prices"}
        required = [r for r in body.get("required", []) if r != "model"]
        schema: dict[str, Any] = {**body, "type": "object", "properties": properties,
                                  "required": required if default in per_model else ["model", *required]}
        # Each model's own unit prices (what GET /v1/models lists): its price terms are the tool's
        # bounds and rule again, the same for every model of a token-priced operation.
        meta = {OPERATION_META: op, PRICE_META: terms.as_json(),
                MODEL_PRICES_META: {m.id: (m.info() if m.info else {}).get("pricing", {}) for m in models}}
        return types.Tool(name=name, title=title.split(",")[0], description=description,
                          inputSchema=schema,
                          annotations=types.ToolAnnotations(title=title.split(",")[0], openWorldHint=True),
                          **{"_meta": meta})

    async def _list_tools(self, req: types.ListToolsRequest | None) -> types.ServerResult:
        table = self.table()
        cursor = req.params.cursor if req is not None and req.params is not None else None
        start = 0
        if cursor is not None:
            key = _cursor_key(cursor)
            if key is None:
                raise McpError(types.ErrorData(
                    code=types.INVALID_PARAMS,
                    message="'cursor' is not one this server gave; list again without one"))
            start = bisect.bisect_right(table.keys, key)  # after it, whether or not it still exists
        end = start + TOOLS_PER_PAGE
        more = end < len(table.tools)
        return types.ServerResult(types.ListToolsResult(
            tools=table.tools[start:end], nextCursor=_cursor(table.keys[end - 1]) if more else None))

    # ---- tools/call ---------------------------------------------------------------------------------

    async def _call_tool(self, req: types.CallToolRequest) -> types.ServerResult:
        params = req.params
        target = self.table().targets.get(params.name)
        if target is None:  # the caller's name is not repeated back (it may be anything)
            raise McpError(types.ErrorData(
                code=types.INVALID_PARAMS, message="unknown tool; tools/list names the tools",
                data={"code": "unknown_tool", "param": "params.name"}))
        args = dict(params.arguments or {})
        extra = params.meta.model_extra if params.meta is not None else None
        sent = (extra or {}).get(PAYMENT_META)
        payment = None if sent is None else Payment.from_object(sent, f'_meta["{PAYMENT_META}"]')
        request = self._http_request()
        if target.skill is not None:
            skill, operation = target.skill, None
        else:
            assert target.operation is not None
            operation = target.operation
            found = self._model(target, args)
            if isinstance(found, types.CallToolResult):
                return types.ServerResult(found)
            skill = found
        outcome = await self.gateway.call(CallRequest(
            skill_id=skill.id, skill=skill, payload=args, resource_url=f"{self.url}#{target.name}",
            payment=payment, operation=operation, extensions=target.extensions,
            client=client_address(request) if request is not None else None))
        holder = request.scope.get("state", {}).get(TIMINGS_STATE) if request is not None else None
        if isinstance(holder, list):  # the POST's answer carries the stages as Server-Timing
            holder.append(outcome.timings)
        return types.ServerResult(tool_result(outcome))

    def _http_request(self) -> Request | None:
        try:
            found = self.server.request_context.request
        except LookupError:
            return None
        return found if isinstance(found, Request) else None

    def _model(self, target: ToolTarget, args: dict[str, Any]) -> Skill | types.CallToolResult:
        """The model a model tool's arguments name (the operation's default when it has one), or
        the error result naming `model` / `stream`. A model of the operation that is not for sale
        now (not in the enum) goes to the pipeline all the same: it answers the 503 saying why,
        as on REST."""
        op = target.operation
        assert op is not None
        if args.get("stream") not in (None, False):
            return error_result(400, "stream_unsupported", "MCP tool results are whole: leave 'stream' "
                                "out (stream over REST: POST /v1/...)", "stream")
        if "model" not in args and (default := self.gateway.default_model(op)) in target.models:
            args["model"] = default
        model = args.get("model")
        if not isinstance(model, str) or not model:
            return error_result(400, "missing_model", "'model' is required: one of the tool's model "
                                "enum (GET /v1/models lists them)", "model")
        skill = self.catalogue.get(model)
        if skill is None or skill.kind != "model" or op not in skill.operations:
            return error_result(404 if skill is None else 400, "model_not_found" if skill is None
                                else "unsupported_model", "'model' names no model of this gateway "
                                "that serves this tool; its `model` enum lists those for sale", "model")
        return skill


def _numbered(name: str, taken: Collection[str]) -> str:
    """`name` with the first free `-2`, `-3`... (only for a digest clash)."""
    n = 1
    while True:
        n += 1
        numbered = f"{name[:64 - len(str(n)) - 1]}-{n}"
        if numbered not in taken:
            return numbered


def _request_methods() -> frozenset[str]:
    """Every request method the MCP SDK's `ClientRequest` model takes (initialize, tools/call...)."""
    union = types.ClientRequest.model_fields["root"].annotation
    return frozenset(get_args(kind.model_fields["method"].annotation)[0] for kind in get_args(union))


MCP_METHODS = _request_methods()


class WithoutMessages(logging.Filter):
    """The SDK logs a request it cannot validate on the root logger, with pydantic's error text,
    which quotes the request: its arguments and `_meta`, where the payment and its signature are.
    The line is kept, without the quote (the caller gets its JSON-RPC error anyway)."""

    PREFIXES = ("Failed to validate request:", "Failed to validate notification:")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg
        if isinstance(message, str):
            if message.startswith("Message that failed validation:"):
                return False
            for prefix in self.PREFIXES:
                if message.startswith(prefix):
                    record.msg, record.args = f"MCP: {prefix[:-1].lower()} (answered -32602)", None
        return True


def quiet_sdk_logs() -> None:
    """Idempotent. At DEBUG the SDK's loggers print whole messages (tool arguments, payments) and
    at INFO a line per request: `mcp` stays at WARNING; the root logger's filter drops the quotes."""
    logger = logging.getLogger("mcp")
    if logger.getEffectiveLevel() < logging.WARNING:
        logger.setLevel(logging.WARNING)
    root = logging.getLogger()
    if not any(isinstance(f, WithoutMessages) for f in root.filters):
        root.addFilter(WithoutMessages())


def _bazaar(tool: types.Tool, example: dict[str, Any] | None) -> dict[str, Any]:
    """The x402 bazaar extension of a tool's 402 (the SDK's MCP form: tool name, input schema,
    example, transport), plus its price terms as `info.price` like the HTTP routes'
    (agent/pipeline/bazaar.py),
    so a facilitator that catalogs sellers from the payments it settles lists the tool. Never
    raises: a 402 without the description, never no 402."""
    try:
        declared = declare_mcp_discovery_extension(DeclareMcpDiscoveryConfig(
            tool_name=tool.name, description=tool.description, input_schema=tool.inputSchema,
            example=example, transport="streamable-http"))
        declared[BAZAAR.key]["info"]["price"] = (tool.meta or {})[PRICE_META]
        return declared
    except Exception:  # noqa: BLE001
        log.exception("could not describe MCP tool %s for the bazaar extension", tool.name)
        return {}


def _route_terms(per_model: dict[str, PriceTerms]) -> PriceTerms:
    terms = route_terms(per_model.values())
    assert terms is not None  # a model tool has at least one model
    return terms


# ---- outcomes as tool results ---------------------------------------------------------------------

def _dump(model: Any) -> dict[str, Any]:
    return model.model_dump(by_alias=True, exclude_none=True)


def _result(content: list[Any], *, structured: Any = None, error: bool = False,
            meta: dict[str, Any] | None = None) -> types.CallToolResult:
    extra = {"_meta": meta} if meta else {}
    return types.CallToolResult(content=content, structuredContent=structured, isError=error, **extra)


def _text(value: Any) -> types.TextContent:
    text = value if isinstance(value, str) else json_bytes(value).decode()
    return types.TextContent(type="text", text=text)


def error_result(status: int, code: str, message: str, param: str | None = None, *,
                 retry_after: int | None = None, receipt: Any = None,
                 upstream: Any = None) -> types.CallToolResult:
    """A refusal as a tool error: the REST error object (code, message, param) plus the HTTP status
    it would have had, `retry_after` seconds when a retry may work, the receipt when there is one."""
    error: dict[str, Any] = {"code": code, "message": message, "param": param, "status": status}
    if retry_after is not None:
        error["retry_after"] = retry_after
    if upstream is not None:
        error["upstream"] = upstream
    body = {"error": error}
    meta = {RECEIPT_META: _dump(receipt)} if receipt is not None else None
    return _result([_text(body)], structured=body, error=True, meta=meta)


def tool_result(outcome: Outcome) -> types.CallToolResult:
    """An Outcome as x402's MCP tool result (tool-result binding)."""
    if isinstance(outcome, PaymentDemanded):
        required = _dump(outcome.required)
        meta = {RECEIPT_META: _dump(outcome.receipt)} if outcome.receipt is not None else None
        return _result([_text(required)], structured=required, error=True, meta=meta)
    if isinstance(outcome, Refused):
        upstream = None
        if outcome.raw is not None:  # an upstream's own answer (a forward resource's non-2xx)
            raw, media_type = outcome.raw
            upstream = _json_or_text(raw[:65536], media_type)
        return error_result(outcome.status, outcome.code, outcome.message, outcome.param,
                            retry_after=outcome.retry_after, receipt=outcome.receipt, upstream=upstream)
    assert isinstance(outcome, Delivered) and outcome.stream is None
    meta = {RECEIPT_META: _dump(outcome.receipt)} if outcome.receipt is not None else None
    result = outcome.result
    body = result.body
    if isinstance(body, bytes | bytearray):
        body = _json_or_text(bytes(body), result.media_type, binary_ok=True)
        if isinstance(body, types.ImageContent | types.AudioContent | types.EmbeddedResource):
            return _result([body], meta=meta)
    structured = body if isinstance(body, dict) else None
    return _result([_text(body)], structured=structured, meta=meta)


def _json_or_text(raw: bytes, media_type: str, *, binary_ok: bool = False) -> Any:
    """Bytes a skill or an upstream answered: JSON as a value, text as text, an image or audio as
    MCP's image/audio content, anything else as an embedded blob (base64)."""
    kind = media_type.split(";", 1)[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json"):
        try:
            return json_value(raw)
        except ValueError:
            pass
    if kind.startswith("text/") or not binary_ok:
        return raw.decode("utf-8", errors="replace")
    data = base64.b64encode(raw).decode()
    if kind.startswith("image/"):
        return types.ImageContent(type="image", data=data, mimeType=kind)
    if kind.startswith("audio/"):
        return types.AudioContent(type="audio", data=data, mimeType=kind)
    return types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
        uri="paywire://result", blob=data, mimeType=kind or "application/octet-stream"))
