"""The OpenAI-compatible face: /v1 routes with bodies and errors exactly as OpenAI defines them.

Only translation lives here: a request body becomes a CallRequest on the model skill, an Outcome
becomes OpenAI's JSON, SSE chunks (`data: [DONE]` at the end, an error event if the upstream
breaks mid-stream), or `{"error": {message, type, param, code}}`.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.gateway import Gateway

from . import openai_media, openai_text
from .openai_common import json_model_route


def routes(gateway: Gateway, max_body_bytes: int, base_url: str) -> list[Route]:
    async def list_models(request: Request) -> Response:
        data = []
        for skill in gateway.registry.of_kind("model"):
            info = skill.info() if skill.info else {}
            data.append({"id": skill.id, "object": "model", "created": 0,
                         "owned_by": info.get("family", "paywire"), **info})
        return JSONResponse({"object": "list", "data": data})

    return [
        json_model_route(gateway, "/v1/chat/completions", "chat.completions", max_body_bytes,
                         base_url),
        Route("/v1/models", list_models, methods=["GET"]),
        *openai_text.routes(gateway, max_body_bytes, base_url),
        *openai_media.routes(gateway, max_body_bytes, base_url),
    ]
