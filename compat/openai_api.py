"""The OpenAI-compatible face: /v1 routes with bodies and errors exactly as OpenAI defines them.

Only translation lives here: a request body becomes a CallRequest on the model skill, an Outcome
becomes OpenAI's JSON, SSE chunks (`data: [DONE]` at the end, an error event if the upstream
breaks mid-stream), or `{"error": {message, type, param, code}}`.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.gateway import CallRequest, Delivered, Gateway
from agent.http_io import payment_from, receipt_headers, render, timing_headers

from . import openai_media, openai_text
from .openai_common import NO_RETRY, UpstreamTiedStream, json_body, model_skill, sse


def routes(gateway: Gateway, max_body_bytes: int, base_url: str) -> list[Route]:
    async def chat_completions(request: Request) -> Response:
        body = await json_body(request, max_body_bytes)
        if isinstance(body, Response):
            return body
        skill = model_skill(gateway, body, "chat.completions")
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
            return UpstreamTiedStream(sse(outcome.stream), headers=headers,
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
        *openai_text.routes(gateway, max_body_bytes, base_url),
        *openai_media.routes(gateway, max_body_bytes, base_url),
    ]
