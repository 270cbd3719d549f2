"""OpenAI-compatible routes for completions (legacy), edits and embeddings.

Each is the chat route's translation with another path and operation: body -> CallRequest on the
model skill, Outcome -> OpenAI JSON, or SSE chunks for a streamed completion.
"""

from __future__ import annotations

from starlette.routing import Route

from agent.pipeline.gateway import Gateway

from .openai_common import json_model_route

# path -> the model operation it runs (only completions streams; the others have no streamer)
OPERATIONS = {"/v1/completions": "completions", "/v1/edits": "edits", "/v1/embeddings": "embeddings"}


def routes(gateway: Gateway, max_body_bytes: int, base_url: str) -> list[Route]:
    return [json_model_route(gateway, path, op, max_body_bytes, base_url)
            for path, op in OPERATIONS.items()]
