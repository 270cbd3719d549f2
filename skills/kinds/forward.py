"""Kind `forward`: the caller's JSON body goes to an HTTP upstream unchanged, with the operator's
key added; the upstream's answer comes back as it is (status, body, content type).

    "kind": "forward",
    "upstream": {
      "base_url": "https://api.example.com",   (overridden by the variable in base_url_env)
      "base_url_env": "EXAMPLE_BASE_URL",
      "path": "/api/v1beta1/things",
      "api_key_env": "EXAMPLE_API_KEY",         (required: the call is refused until it is set)
      "api_key_header": "apiKey",               (default Authorization)
      "api_key_prefix": "",                     (e.g. "Bearer "; default "" for custom headers)
      "timeout_seconds": 30,
      "max_response_bytes": 10485760
    }

A 2xx answer is delivered and charged; any other answer is passed on as it is and not charged
(a 402 from the upstream becomes a 502: it is not paywire asking the caller to pay).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from ..errors import UpstreamAnswer, UpstreamError, UpstreamTimeout
from ..resource_context import ResourceContext, unavailable
from ..skill import Payload, SkillResult
from .base import Behaviour, need_str, positive_number

WHERE = "upstream"
DEFAULT_MAX_RESPONSE = 10 * 1024 * 1024


def check(data: dict[str, Any]) -> list[str]:
    upstream = data.get(WHERE)
    if not isinstance(upstream, dict):
        return ["kind 'forward' needs field 'upstream': {base_url, path, api_key_env, ...}"]
    problems: list[str] = []
    base = need_str(upstream, "base_url", WHERE, problems)
    if base is not None and urlsplit(base).scheme not in ("http", "https"):
        problems.append(f"field 'upstream.base_url' must be an http(s) URL, got {base!r}")
    path = need_str(upstream, "path", WHERE, problems)
    if path is not None and not path.startswith("/"):
        problems.append(f"field 'upstream.path' must start with '/', got {path!r}")
    need_str(upstream, "api_key_env", WHERE, problems)
    for key in ("base_url_env", "api_key_header"):
        need_str(upstream, key, WHERE, problems, required=False)
    prefix = upstream.get("api_key_prefix", "")
    if not isinstance(prefix, str):
        problems.append("field 'upstream.api_key_prefix' must be a string such as 'Bearer '")
    positive_number(upstream, "timeout_seconds", WHERE, problems, 30, most=600)
    positive_number(upstream, "max_response_bytes", WHERE, problems, DEFAULT_MAX_RESPONSE,
                    most=100 * 1024 * 1024)
    return problems


def build(data: dict[str, Any], context: ResourceContext) -> Behaviour:
    upstream = data[WHERE]
    key_env = upstream["api_key_env"]
    header = upstream.get("api_key_header") or "Authorization"
    prefix = upstream.get("api_key_prefix", "Bearer " if header == "Authorization" else "")
    timeout = aiohttp.ClientTimeout(total=float(upstream.get("timeout_seconds", 30)))
    limit = int(upstream.get("max_response_bytes", DEFAULT_MAX_RESPONSE))
    method = data["method"]
    name = data["id"]

    def url() -> str:
        base = context.env(upstream.get("base_url_env") or "") or upstream["base_url"]
        return base.rstrip("/") + upstream["path"]

    def ready() -> None:
        if not context.env(key_env):
            raise unavailable(f"resource '{name}'", key_env)

    async def run(payload: Payload) -> SkillResult:
        ready()
        headers = {header: prefix + context.env(key_env), "Accept": "application/json"}
        request: dict[str, Any] = {"headers": headers, "timeout": timeout}
        if method == "GET":
            request["params"] = {k: v if isinstance(v, str) else json.dumps(v)
                                 for k, v in payload.items()}
        else:
            request["json"] = payload
        try:
            async with context.http().request(method, url(), **request) as response:
                body = await _read_bounded(response, limit)
                media_type = response.headers.get("Content-Type", "application/octet-stream")
                status = response.status
        except TimeoutError:
            raise UpstreamTimeout(f"the upstream of '{name}' did not answer in time") from None
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"the upstream of '{name}' is unreachable ({type(exc).__name__})") from None
        if 200 <= status < 300:
            return SkillResult(body=body, status=status, media_type=media_type)
        if status == 402:
            raise UpstreamError(f"the upstream of '{name}' asked paywire for payment (402); "
                                "the operator's account needs attention")
        if status in (401, 403):  # the operator's key, not the caller's request
            raise UpstreamError(f"the upstream of '{name}' refused paywire's key ({status}); the "
                                f"operator's {key_env} is missing rights or wrong")
        raise UpstreamAnswer(status, body, media_type,
                             f"the upstream of '{name}' answered {status}: {_excerpt(body)}")

    return Behaviour(run=run, ready=ready)


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise UpstreamError(f"the upstream answered more than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _excerpt(body: bytes) -> str:
    return body[:300].decode("utf-8", "replace").strip() or "(empty body)"


