"""The OpenAI-compatible face: /v1 routes with bodies and errors exactly as OpenAI defines them.

Only translation lives here: a request body becomes a CallRequest on the model skill, an Outcome
becomes OpenAI's JSON, SSE chunks (`data: [DONE]` at the end, an error event if the upstream
breaks mid-stream), or `{"error": {message, type, param, code}}`. GET /v1/models lists the models
a call can buy now (agent/pipeline/catalogue.py's one availability rule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from agent.pipeline.bazaar import HttpRoute
from agent.pipeline.catalogue import Catalogue
from agent.pipeline.gateway import Gateway

from . import openai_media, openai_text
from .openai_common import find_model, json_model_route, model_route

if TYPE_CHECKING:
    from skills.skill import Skill


def _model_object(catalogue: Catalogue, skill: Skill) -> dict[str, Any]:
    """OpenAI's model object plus paywire's facts: prices, and availability by the one rule."""
    facts = catalogue.model_facts(skill)
    return {"id": skill.id, "object": "model", "created": 0,
            "owned_by": facts.get("family", "paywire"), **facts}


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
        # OpenAI lists the models a caller can use, and tools built on it (model pickers) offer
        # every one listed: a model a call cannot buy now (switched off, not configured) is left
        # out. GET /catalogue/models lists them all, each with `available` and `reason`.
        catalogue = gateway.catalogue
        data = [_model_object(catalogue, skill) for skill in catalogue.for_sale("model")]
        return JSONResponse({"object": "list", "data": data})

    async def retrieve_model(request: Request) -> Response:
        """Any model of the table, marked: `available` false with the `reason` its call's 503 gives."""
        skill = find_model(gateway, request.path_params["model"])
        return JSONResponse(_model_object(gateway.catalogue, skill))

    return [
        json_model_route(gateway, *CHAT_ROUTE, max_body_bytes, base_url),
        Route("/v1/models", list_models, methods=["GET"]),
        # model ids may hold a slash (an OpenRouter-style "vendor/model"), as OpenAI's client sends them
        Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
        *openai_text.routes(gateway, max_body_bytes, base_url),
        *openai_media.routes(gateway, max_body_bytes, base_url, max_upload_bytes),
    ]
