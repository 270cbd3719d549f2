"""Shared pieces of the OpenAI-compatible routes: body reading, model lookup, errors, SSE."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agent.gateway import CallRequest, Delivered, Gateway, Outcome
from agent.http_io import (
    BodyTooLarge,
    error_body,
    payment_from,
    read_body,
    receipt_headers,
    render,
    timing_headers,
)
from skills.errors import UpstreamError

NO_RETRY = {"x-should-retry": "false"}


class UpstreamTiedStream(StreamingResponse):
    """A stream that notices a client leaving while it waits for the upstream.

    Under ASGI spec 2.4 Starlette only learns of a disconnect when its next send fails, i.e. when
    the upstream produces the next chunk; a slow or stuck upstream would keep its request open.
    Presenting spec 2.3 makes Starlette listen for `http.disconnect` and cancel the stream at once,
    which closes the upstream request.
    """

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        asgi = {**scope.get("asgi", {}), "spec_version": "2.3"}
        await super().__call__({**scope, "asgi": asgi}, receive, send)


def error(status: int, code: str, message: str, param: str | None, **headers: str) -> Response:
    return JSONResponse(error_body(status, code, message, param), status, headers or None)


async def json_body(request: Request, limit: int) -> dict[str, Any] | Response:
    try:
        raw = await read_body(request, limit)
    except BodyTooLarge as exc:
        return error(413, "body_too_large", f"{exc}; send at most {exc.limit} bytes", None)
    try:
        body = json.loads(raw or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return error(400, "invalid_json", f"the body is not valid JSON ({exc})", None)
    if not isinstance(body, dict):
        return error(400, "invalid_body", "the body must be a JSON object", None)
    return body




def model_skill(gateway: Gateway, body: dict[str, Any], operation: str) -> Any:
    """The model skill a body names, or the OpenAI-shaped error response (400/404)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return error(400, "missing_model", "'model' is required: a model id from GET /v1/models",
                     "model")
    skill = gateway.registry.get(model)
    if skill is None or skill.kind != "model":
        return error(404, "model_not_found", f"The model '{model}' does not exist; "
                     "GET /v1/models lists the models", "model")
    if operation not in skill.operations:
        return error(400, "unsupported_operation", f"'{model}' does not support {operation}; "
                     f"it supports {', '.join(skill.operations)}", "model")
    return skill


async def sse(chunks: Any) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    except UpstreamError as exc:
        error = error_body(exc.status, "upstream_error", exc.message, None)
        yield b"data: " + json.dumps(error).encode() + b"\n\n"
        return
    finally:
        # A client that went away cancels this generator: close the chain down to the upstream
        # request now (not whenever the garbage collector gets to it).
        await chunks.aclose()
    yield b"data: [DONE]\n\n"


def respond(outcome: Outcome) -> Response:
    """An Outcome as OpenAI's answer: SSE for a stream, JSON otherwise; no-retry where a client
    retry could pay twice."""
    if isinstance(outcome, Delivered) and outcome.stream is not None:
        headers = timing_headers(outcome) | NO_RETRY
        if outcome.receipt is not None:
            headers |= receipt_headers(outcome.receipt)
        return UpstreamTiedStream(sse(outcome.stream), headers=headers, media_type="text/event-stream")
    response = render(outcome)
    if response.status_code >= 500 or response.status_code == 402:
        response.headers.update(NO_RETRY)
    return response


def json_model_route(gateway: Gateway, path: str, operation: str, max_body_bytes: int,
                     base_url: str) -> Route:
    """POST `path` with a JSON body naming a model: the model's `operation`, paid per call."""

    async def handle(request: Request) -> Response:
        body = await json_body(request, max_body_bytes)
        if isinstance(body, Response):
            return body
        skill = model_skill(gateway, body, operation)
        if isinstance(skill, Response):
            return skill
        outcome = await gateway.call(CallRequest(
            skill_id=skill.id, payload=body, resource_url=f"{base_url}{path}",
            payment=payment_from(request), stream=body.get("stream") is True, operation=operation))
        return respond(outcome)

    return Route(path, handle, methods=["POST"])
