"""OpenAI-compatible routes for completions (legacy), edits and embeddings.

Each is the chat route's translation with another path and operation: body -> CallRequest on the
model skill, Outcome -> OpenAI JSON, or SSE chunks for a streamed completion.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent.gateway import CallRequest, Delivered, Gateway
from agent.http_io import payment_from, receipt_headers, render, timing_headers

from .openai_common import NO_RETRY, UpstreamTiedStream, json_body, model_skill, sse

# path -> the model operation it runs (only completions streams; the others have no streamer)
OPERATIONS = {"/v1/completions": "completions", "/v1/edits": "edits", "/v1/embeddings": "embeddings"}


def routes(gateway: Gateway, max_body_bytes: int, base_url: str) -> list[Route]:
    def endpoint(path: str, operation: str) -> Callable[[Request], Awaitable[Response]]:
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
            if isinstance(outcome, Delivered) and outcome.stream is not None:
                headers = timing_headers(outcome) | NO_RETRY
                if outcome.receipt is not None:
                    headers |= receipt_headers(outcome.receipt)
                return UpstreamTiedStream(sse(outcome.stream), headers=headers,
                                          media_type="text/event-stream")
            response = render(outcome)
            if response.status_code >= 500 or response.status_code == 402:
                response.headers.update(NO_RETRY)  # a client retry could pay twice
            return response

        return handle

    return [Route(path, endpoint(path, op), methods=["POST"]) for path, op in OPERATIONS.items()]
