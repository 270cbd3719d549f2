"""OpenAI-compatible routes for audio (speech, transcriptions, translations, generations) and images."""

from __future__ import annotations

from starlette.routing import Route

from agent.gateway import Gateway


def routes(gateway: Gateway, max_body_bytes: int, base_url: str) -> list[Route]:
    return []
