"""OpenAI-compatible routes for audio (speech, transcriptions, translations, generations) and images.

Translation only, as in the chat route: a body becomes a CallRequest on the model skill and the Outcome
becomes the answer (raw audio bytes, text, or OpenAI's JSON). JSON routes read the body under the
gateway's JSON limit; multipart routes (transcriptions, translations, image edits) under the upload
limit (413 above it), then parsed by python-multipart (Starlette's own form parser) into the payload:
text fields typed as OpenAI documents them, repeated `name[]` fields as arrays, and files as
`UploadedFile` values (bytes alongside a hashable description).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from python_multipart import MultipartParser
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartState, parse_options_header
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent.edge.http_io import (
    BodyTooLarge,
    HttpProblem,
    client_address,
    payment_from,
    read_body,
    read_json_object,
)
from agent.pipeline.gateway import Gateway
from agent.pipeline.payloads import UploadedFile
from agent.pipeline.requests import CallRequest

from .openai_common import answer_call, empty, json_model_route, model_route, model_skill, respond

MAX_UPLOAD_BYTES = 25 * 1024 * 1024  # OpenAI's own limit for audio and image uploads
MAX_PARTS = 64  # far above any OpenAI form; a bound on work for a hostile one

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
    """multipart/form-data (RFC 7578) -> its parts; FormError when it is not well formed, has more than
    `max_parts` parts or ends before its closing boundary. The body is already bounded (read_body)."""
    kind, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise FormError("send multipart/form-data (with a boundary) on this route")
    form = _Form(max_parts)
    try:
        parser = MultipartParser(boundary, form.callbacks())
        parser.write(body)
    except FormParserError as exc:  # python-multipart's own words, e.g. "Did not find CR at end of boundary"
        where = f" at byte {exc.offset}" if isinstance(getattr(exc, "offset", None), int) else ""
        raise FormError(f"the multipart body is not well formed{where}: {exc}") from None
    if parser.state != MultipartState.END:
        raise FormError("the multipart body has no part" if parser.state == MultipartState.START
                        else "the multipart body is cut short (no closing boundary)")
    return form.parts


@dataclass
class _Form:
    """Collects python-multipart's callbacks (one part at a time) into Parts."""

    max_parts: int
    parts: list[Part] = field(default_factory=list)
    _headers: dict[bytes, bytes] = field(default_factory=dict)
    _header: tuple[bytes, bytes] = (b"", b"")
    _data: list[bytes] = field(default_factory=list)
    _part: Part | None = None

    def callbacks(self) -> Any:
        return {"on_part_begin": self.part_begin, "on_header_field": self.header_field,
                "on_header_value": self.header_value, "on_header_end": self.header_end,
                "on_headers_finished": self.headers_finished, "on_part_data": self.part_data,
                "on_part_end": self.part_end}

    def part_begin(self) -> None:
        if len(self.parts) == self.max_parts:
            raise FormError(f"the form has more than {self.max_parts} parts")
        self._headers, self._data, self._part = {}, [], None

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self._header = (self._header[0] + data[start:end], self._header[1])

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self._header = (self._header[0], self._header[1] + data[start:end])

    def header_end(self) -> None:
        name, value = self._header
        self._headers[name.lower()] = value
        self._header = (b"", b"")

    def headers_finished(self) -> None:
        disposition, options = parse_options_header(self._headers.get(b"content-disposition"))
        name = options.get(b"name")
        if disposition != b"form-data" or not name:
            raise FormError("every multipart part needs Content-Disposition: form-data; name=\"...\"")
        filename = options.get(b"filename")
        content_type = parse_options_header(self._headers.get(b"content-type"))[0]
        self._part = Part(name.decode("utf-8", "replace"),
                          None if filename is None else filename.decode("utf-8", "replace"),
                          content_type.decode("latin-1") or "application/octet-stream", b"")

    def part_data(self, data: bytes, start: int, end: int) -> None:
        self._data.append(data[start:end])

    def part_end(self) -> None:
        if self._part is not None:
            self._part.data = b"".join(self._data)
            self.parts.append(self._part)


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


def _multipart(request: Request) -> bool:
    return request.headers.get("content-type", "").split(";")[0].strip().lower() == "multipart/form-data"


async def read_form(request: Request, limit: int, blame: str) -> dict[str, Any]:
    """The multipart body as a payload; HttpProblem 413 above `limit` bytes, 400 if malformed."""
    if not _multipart(request):
        raise HttpProblem(400, "invalid_content_type", "send multipart/form-data on this route, with "
                          f"the upload in the '{blame}' field", blame)
    try:
        raw = await read_body(request, limit)
    except BodyTooLarge:
        raise HttpProblem(413, "upload_too_large", f"the upload is larger than {limit // (1024 * 1024)} "
                          f"MB ({limit} bytes); send a smaller file", blame) from None
    try:
        return form_payload(parse_multipart(request.headers["content-type"], raw))
    except FormError as exc:
        raise HttpProblem(400, "invalid_form", exc.message, exc.param) from None


def routes(gateway: Gateway, max_body_bytes: int, base_url: str,
           max_upload_bytes: int = MAX_UPLOAD_BYTES) -> list[Route]:
    described = {IMAGES_JSON_ROUTE[0]: model_route(gateway, *IMAGES_JSON_ROUTE),
                 **{path: model_route(gateway, path, op, "form-data")
                    for path, (op, _) in FORM_ROUTES.items()}}

    async def call(request: Request, path: str, operation: str, payload: dict[str, Any]) -> Response:
        skill = model_skill(gateway, payload, operation)
        return await answer_call(gateway, CallRequest(
            skill_id=skill.id, skill=skill, payload=payload, resource_url=f"{base_url}{path}",
            payment=payment_from(request.headers), operation=operation,
            client=client_address(request), route=described[path]))

    async def probe(request: Request, path: str) -> Response:
        """An empty request without payment (an indexer's probe): the route's quote."""
        return respond(await gateway.quote_route(described[path], f"{base_url}{path}",
                                                 client_address(request)))

    async def image_generations(request: Request) -> Response:
        body = await read_json_object(request, max_body_bytes)
        if not body and payment_from(request.headers) is None:
            return await probe(request, IMAGES_JSON_ROUTE[0])
        if not body:  # a payment and no request: the pipeline says what it is for
            path, operation = IMAGES_JSON_ROUTE
            return await answer_call(gateway, CallRequest(
                skill_id="", payload={}, resource_url=f"{base_url}{path}",
                payment=payment_from(request.headers), operation=operation,
                client=client_address(request), route=described[path]))
        return await call(request, *IMAGES_JSON_ROUTE, body)

    def form_route(path: str, operation: str, blame: str) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            if payment_from(request.headers) is None and (empty(request) or (
                    not _multipart(request) and not await read_json_object(request, max_body_bytes))):
                return await probe(request, path)  # no body, or `{}`: the route's quote
            return await call(request, path, operation, await read_form(request, max_upload_bytes, blame))

        return handle

    return [
        *(json_model_route(gateway, path, op, max_body_bytes, base_url) for path, op in JSON_ROUTES.items()),
        Route(IMAGES_JSON_ROUTE[0], image_generations, methods=["POST"]),
        *(Route(path, form_route(path, op, blame), methods=["POST"])
          for path, (op, blame) in FORM_ROUTES.items()),
    ]
