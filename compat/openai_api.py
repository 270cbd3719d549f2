"""The OpenAI-compatible face: /v1 routes with bodies and errors exactly as OpenAI defines them.

Only translation lives here: a request body becomes a CallRequest on the model skill, an Outcome
becomes OpenAI's JSON, SSE chunks (`data: [DONE]` at the end, an error event if the upstream
breaks mid-stream), or `{"error": {message, type, param, code}}`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.pipeline.bazaar import HttpRoute
from agent.pipeline.gateway import Gateway

from . import openai_media, openai_text
from .openai_common import find_model, json_model_route, model_route

if TYPE_CHECKING:
    from skills.skill import Skill


def _model_object(skill: Skill) -> dict[str, Any]:
    """OpenAI's model object plus paywire's price and availability fields."""
    info = skill.info() if skill.info else {}
    return {"id": skill.id, "object": "model", "created": 0,
            "owned_by": info.get("family", "paywire"), **info}


CHAT_ROUTE = ("/v1/chat/completions", "chat.completions")


def model_routes() -> dict[str, tuple[str, bool]]:
    """path -> (model operation, multipart body?) of every model route `routes` mounts: what the
    OpenAPI document (wellknown/openapi.py) describes."""
    return {CHAT_ROUTE[0]: (CHAT_ROUTE[1], False),
            **{path: (op, False) for path, op in openai_text.OPERATIONS.items()},
            **{path: (op, False) for path, op in openai_media.JSON_ROUTES.items()},
            openai_media.IMAGES_JSON_ROUTE[0]: (openai_media.IMAGES_JSON_ROUTE[1], False),
            **{path: (op, True) for path, (op, _) in openai_media.FORM_ROUTES.items()}}


def described_routes(gateway: Gateway) -> list[HttpRoute]:
    """Every model route as its 402s describe it (x402 bazaar): what GET /discovery/resources lists."""
    return [model_route(gateway, path, op, "form-data" if form else "json")
            for path, (op, form) in model_routes().items()]


def routes(gateway: Gateway, max_body_bytes: int, base_url: str,
           max_upload_bytes: int = openai_media.MAX_UPLOAD_BYTES) -> list[Route]:
    async def list_models(request: Request) -> Response:
        data = [_model_object(skill) for skill in gateway.catalogue.of_kind("model")]
        return JSONResponse({"object": "list", "data": data})

    async def retrieve_model(request: Request) -> Response:
        skill = find_model(gateway, request.path_params["model"])
        return JSONResponse(_model_object(skill))

    return [
        json_model_route(gateway, *CHAT_ROUTE, max_body_bytes, base_url),
        Route("/v1/models", list_models, methods=["GET"]),
        # model ids may hold a slash (an OpenRouter-style "vendor/model"), as OpenAI's client sends them
        Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
        *openai_text.routes(gateway, max_body_bytes, base_url),
        *openai_media.routes(gateway, max_body_bytes, base_url, max_upload_bytes),
    ]
