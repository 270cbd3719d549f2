"""OpenAI-compatible routes for completions (legacy), edits and embeddings."""

from __future__ import annotations

from starlette.routing import Route

from agent.gateway import Gateway


def routes(gateway: Gateway, max_body_bytes: int, base_url: str) -> list[Route]:
    return []
