"""The OpenAI-compatible face: /v1 routes with bodies and errors exactly as OpenAI defines them.

Only translation lives here: a request body becomes a CallRequest on the model skill, an Outcome
becomes OpenAI's JSON, SSE chunks (`data: [DONE]` at the end, an error event if the upstream
breaks mid-stream), or `{"error": {message, type, param, code}}`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agent.gateway import CallRequest, Delivered, Gateway
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


def _error(status: int, code: str, message: str, param: str | None, **headers: str) -> Response:
    return JSONResponse(error_body(status, code, message, param), status, headers or None)


async def _json_body(request: Request, limit: int) -> dict[str, Any] | Response:
    try:
        raw = await read_body(request, limit)
    except BodyTooLarge as exc:
        return _error(413, "body_too_large", f"{exc}; send at most {exc.limit} bytes", None)
    try:
        body = json.loads(raw or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return _error(400, "invalid_json", f"the body is not valid JSON ({exc})", None)
    if not isinstance(body, dict):
        return _error(400, "invalid_body", "the body must be a JSON object", None)
    return body


def routes(gateway: Gateway, max_body_bytes: int, base_url: str) -> list[Route]:
    def model_skill(body: dict[str, Any], operation: str) -> Any:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            return _error(400, "missing_model", "'model' is required: a model id from GET /v1/models",
                          "model")
        skill = gateway.registry.get(model)
        if skill is None or skill.kind != "model":
            return _error(404, "model_not_found", f"The model '{model}' does not exist; "
                          "GET /v1/models lists the models", "model")
        if operation not in skill.operations:
            return _error(400, "unsupported_operation", f"'{model}' does not support {operation}; "
                          f"it supports {', '.join(skill.operations)}", "model")
        return skill

    async def chat_completions(request: Request) -> Response:
        body = await _json_body(request, max_body_bytes)
        if isinstance(body, Response):
            return body
        skill = model_skill(body, "chat.completions")
        if isinstance(skill, Response):
            return skill
        outcome = await gateway.call(CallRequest(
            skill_id=skill.id, payload=body, resource_url=f"{base_url}/v1/chat/completions",
            payment=payment_from(request), stream=bool(body.get("stream")),
            operation="chat.completions"))
        if isinstance(outcome, Delivered) and outcome.stream is not None:
            headers = timing_headers(outcome) | NO_RETRY
            if outcome.receipt is not None:
                headers |= receipt_headers(outcome.receipt)
            return UpstreamTiedStream(_sse(outcome.stream), headers=headers,
                                      media_type="text/event-stream")
        response = render(outcome)
        if response.status_code >= 500 or response.status_code == 402:
            response.headers.update(NO_RETRY)
        return response

    async def list_models(request: Request) -> Response:
        data = []
        for skill in gateway.registry.of_kind("model"):
            info = skill.info() if skill.info else {}
            data.append({"id": skill.id, "object": "model", "created": 0,
                         "owned_by": info.get("family", "paywire"), **info})
        return JSONResponse({"object": "list", "data": data})

    return [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
    ]


async def _sse(chunks: Any) -> AsyncIterator[bytes]:
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
