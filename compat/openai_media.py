"""OpenAI-compatible routes for audio (speech, transcriptions, translations, generations) and images.

Translation only, as in the chat route: a body becomes a CallRequest on the model skill and the Outcome
becomes the answer (raw audio bytes, text, or OpenAI's JSON). JSON routes read the body under the
gateway's JSON limit; multipart routes (transcriptions, translations, image edits) under the upload
limit (413 above it), parsed here into the payload: text fields typed as OpenAI documents them, repeated
`name[]` fields as arrays, and files as `UploadedFile` values (bytes alongside a hashable description).
"""

from __future__ import annotations

import email.message
import email.policy
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.parser import HeaderParser
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent.gateway import CallRequest, Gateway
from agent.http_io import BodyTooLarge, payment_from, read_body
from skills.models.media_ops import UploadedFile

from .openai_common import error, json_body, json_model_route, model_skill, respond

MAX_UPLOAD_BYTES = 25 * 1024 * 1024  # OpenAI's own limit for audio and image uploads
MAX_PARTS = 64  # far above any OpenAI form; a bound on work for a hostile one
DEFAULT_IMAGE_MODEL = "dall-e-2"  # OpenAI's default when an images request names no model

# Multipart sends everything as text; these fields are numbers or booleans in OpenAI's reference.
_INTEGER_FIELDS = frozenset({"n", "output_compression", "partial_images"})
_NUMBER_FIELDS = frozenset({"temperature"})
_BOOLEAN_FIELDS = frozenset({"stream"})

# path -> operation (JSON bodies); the images routes default the model as OpenAI does
JSON_ROUTES = {"/v1/audio/speech": "audio.speech", "/v1/audio/generations": "audio.generations"}
IMAGES_JSON_ROUTE = ("/v1/images/generations", "images.generations")
# path -> (operation, the field an oversized or missing upload is blamed on)
FORM_ROUTES = {"/v1/audio/transcriptions": ("audio.transcriptions", "file"),
               "/v1/audio/translations": ("audio.translations", "file"),
               "/v1/images/edits": ("images.edits", "image")}


@dataclass
class Part:
    name: str
    filename: str | None  # None: a text field
    content_type: str
    data: bytes


class FormError(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def parse_multipart(content_type: str, body: bytes, max_parts: int = MAX_PARTS) -> list[Part]:
    """multipart/form-data (RFC 7578) -> its parts; FormError when it is not well formed. The body is
    already bounded, so this works on bytes with `find` (no per-line Python loop over a 25 MB file)."""
    header = email.message.Message()
    header["content-type"] = content_type
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str) or not boundary:
        raise FormError("send multipart/form-data (with a boundary) on this route")
    delimiter = b"--" + boundary.encode("latin-1")
    pos = body.find(delimiter)
    if pos < 0:
        raise FormError("the multipart body has no part")
    pos += len(delimiter)
    parts: list[Part] = []
    while not body.startswith(b"--", pos):  # "--" after a delimiter closes the body
        line_end = body.find(b"\r\n", pos)
        head_end = body.find(b"\r\n\r\n", line_end)
        if line_end < 0 or head_end < 0 or body[pos:line_end].strip(b" \t"):
            raise FormError("a multipart part has malformed headers")
        next_delimiter = body.find(b"\r\n" + delimiter, head_end + 4)
        if next_delimiter < 0:
            raise FormError("the multipart body is cut short (no closing boundary)")
        if len(parts) == max_parts:
            raise FormError(f"the form has more than {max_parts} parts")
        parts.append(_part(body[line_end + 2:head_end], body[head_end + 4:next_delimiter]))
        pos = next_delimiter + 2 + len(delimiter)
    return parts


def _part(raw_headers: bytes, data: bytes) -> Part:
    headers = HeaderParser(policy=email.policy.HTTP).parsestr(raw_headers.decode("utf-8", "replace"))
    name = headers.get_param("name", header="content-disposition")
    if headers.get_content_disposition() != "form-data" or not isinstance(name, str) or not name:
        raise FormError("every multipart part needs Content-Disposition: form-data; name=\"...\"")
    filename = headers.get_filename()
    content_type = headers.get_content_type() if headers.get("content-type") else "application/octet-stream"
    return Part(name, filename, content_type, data)


def form_payload(parts: list[Part]) -> dict[str, Any]:
    """The parts as a call payload: files as UploadedFile, text fields typed, `name[]` as arrays."""
    payload: dict[str, Any] = {}
    for part in parts:
        key = part.name.removesuffix("[]")
        value: Any
        if part.filename is not None:
            value = UploadedFile(part.data, part.filename or key, part.content_type)
        else:
            try:
                value = _typed(key, part.data.decode("utf-8"))
            except UnicodeDecodeError:
                raise FormError(f"field '{key}' is not UTF-8 text", key) from None
        if part.name.endswith("[]"):
            current = payload.get(key)
            payload[key] = [*(current if isinstance(current, list) else [] if current is None else [current]),
                            value]
        else:
            payload[key] = value
    return payload


def _typed(name: str, text: str) -> Any:
    try:
        if name in _INTEGER_FIELDS:
            return int(text)
        if name in _NUMBER_FIELDS:
            return float(text)
    except ValueError:
        kind = "a whole number" if name in _INTEGER_FIELDS else "a number"
        raise FormError(f"'{name}' must be {kind}, got {text!r}", name) from None
    if name in _BOOLEAN_FIELDS:
        if text not in ("true", "false"):
            raise FormError(f"'{name}' must be true or false, got {text!r}", name)
        return text == "true"
    return text


async def read_form(request: Request, limit: int, blame: str) -> dict[str, Any] | Response:
    """The multipart body as a payload, or the error response (413 above `limit` bytes, 400)."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "multipart/form-data":
        return error(400, "invalid_content_type", "send multipart/form-data on this route, with the upload "
                     f"in the '{blame}' field", None)
    try:
        raw = await read_body(request, limit)
    except BodyTooLarge:
        return error(413, "upload_too_large", f"the upload is larger than {limit // (1024 * 1024)} MB "
                     f"({limit} bytes); send a smaller file", blame)
    try:
        return form_payload(parse_multipart(request.headers["content-type"], raw))
    except FormError as exc:
        return error(400, "invalid_form", exc.message, exc.param)


def routes(gateway: Gateway, max_body_bytes: int, base_url: str,
           max_upload_bytes: int = MAX_UPLOAD_BYTES) -> list[Route]:
    async def call(request: Request, path: str, operation: str, payload: dict[str, Any]) -> Response:
        if operation.startswith("images.") and "model" not in payload:
            payload["model"] = DEFAULT_IMAGE_MODEL
        skill = model_skill(gateway, payload, operation)
        if isinstance(skill, Response):
            return skill
        return respond(await gateway.call(CallRequest(
            skill_id=skill.id, payload=payload, resource_url=f"{base_url}{path}",
            payment=payment_from(request), operation=operation)))

    async def image_generations(request: Request) -> Response:
        body = await json_body(request, max_body_bytes)
        if isinstance(body, Response):
            return body
        return await call(request, *IMAGES_JSON_ROUTE, body)

    def form_route(path: str, operation: str, blame: str) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            payload = await read_form(request, max_upload_bytes, blame)
            if isinstance(payload, Response):
                return payload
            return await call(request, path, operation, payload)

        return handle

    return [
        *(json_model_route(gateway, path, op, max_body_bytes, base_url) for path, op in JSON_ROUTES.items()),
        Route(IMAGES_JSON_ROUTE[0], image_generations, methods=["POST"]),
        *(Route(path, form_route(path, op, blame), methods=["POST"])
          for path, (op, blame) in FORM_ROUTES.items()),
    ]
