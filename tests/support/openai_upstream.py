"""A real OpenAI-compatible upstream for tests: an aiohttp server on a free loopback port.

It answers the routes the model gateway proxies with the shapes of the OpenAI API reference, plus
ElevenLabs' `POST /v1/sound-generation` (the non-OpenAI audio-generation provider), with fixed data
derived from the request, so tests can predict every text, vector and usage count:

- chat / completions: the answer is `reply_text(name, chunks)` ("Hello from <name>. 1 2 3" for 4
  chunks), one token per chunk, cut to `max_tokens` (finish_reason "length"); prompt tokens are
  `word_tokens()` of the prompt text; `behaviour.replies` scripts the next non-stream chat answers
  instead (one token per word, see `scripted_reply`); chat refuses `max_tokens` for the models of
  `behaviour.completion_cap_only` (OpenAI's reasoning models: use max_completion_tokens), as OpenAI does;
- embeddings: `embedding_vector(model, text, dimensions)`, values k/128, exact in float32;
- speech / sound generation: silent audio whose length follows the input text / duration_seconds.

Knobs in `UpstreamBehaviour` make it fail, hang, stream slowly, hold a stream at a gate or drop
it half way, report other token counts than its own or no usage at all. The server runs in its own
thread and event loop so sync and async tests can share it; `cancelled` is set when the handler
really sees its client go away (aiohttp cancels the handler, or a write raises
ConnectionResetError), which is how the gateway's cancel-on-disconnect is tested.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import math
import re
import socket
import struct
import threading
import time
import wave
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import BodyPartReader, MultipartReader, StreamReader, hdrs, web
from aiohttp.base_protocol import BaseProtocol

CREATED = 1_700_000_000  # every `created` field: fixed so answers are deterministic
DEFAULT_MODELS = (
    "gpt-4o-mini", "gpt-4o", "gpt-3.5-turbo-instruct", "text-embedding-3-small", "tts-1",
    "whisper-1", "dall-e-2", "dall-e-3", "gpt-image-1",
)
SPEECH_FORMATS = {
    "mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac", "flac": "audio/flac",
    "wav": "audio/wav", "pcm": "audio/pcm",
}
TRANSCRIPTION_EXTENSIONS = ("flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "oga", "ogg", "wav", "webm")
IMAGE_SIZES = {
    "dall-e-2": ("256x256", "512x512", "1024x1024"),
    "dall-e-3": ("1024x1024", "1792x1024", "1024x1792"),
    "gpt-image-1": ("auto", "1024x1024", "1536x1024", "1024x1536"),
}
SOUND_MODEL = "eleven_text_to_sound_v2"
SOUND_AUTO_DURATION = 2.0  # what this stand-in "guesses" when duration_seconds is absent/null
MAX_BODY = 64 * 1024 * 1024  # above the gateway's 25 MB upload limit, so the gateway is what refuses


# ---------------------------------------------------------------- deterministic data (public helpers)

def word_tokens(text: str) -> int:
    """The stand-in's token count: whitespace-separated words (at least 1)."""
    return max(1, len(text.split()))


def reply_pieces(name: str, chunks: int) -> list[str]:
    """The streamed pieces of a chat/completion answer; one token each."""
    return [f"Hello from {name}."] + [f" {i}" for i in range(1, max(1, chunks))]


def reply_text(name: str, chunks: int) -> str:
    return "".join(reply_pieces(name, chunks))


def scripted_reply(text: str, limit: int | None) -> tuple[str, int, str]:
    """(content, completion tokens, finish_reason) of a scripted chat answer: one token per word,
    cut after `limit` words (finish_reason "length") with the original spacing kept."""
    words = list(re.finditer(r"\S+", text))
    if limit is None or len(words) <= limit:
        return text, word_tokens(text), "stop"
    return text[:words[limit - 1].end()], limit, "length"


def embedding_vector(model: str, text: str, dimensions: int) -> list[float]:
    """A vector from SHA-256 of (model, text); values k/128 in [-1, 1) are exact in float32."""
    out: list[float] = []
    counter = 0
    while len(out) < dimensions:
        digest = hashlib.sha256(f"{model}\0{text}\0{counter}".encode()).digest()
        out.extend((b - 128) / 128 for b in digest)
        counter += 1
    return out[:dimensions]


def speech_seconds(text: str) -> float:
    """Length of the synthesized audio: 15 characters per second, at least half a second."""
    return max(0.5, len(text) / 15)


def silent_mp3(seconds: float) -> bytes:
    """MPEG-1 Layer III frames (128 kbit/s, 44.1 kHz, mono) with empty side info: decodes as silence,
    and a reader can count frames (1152 samples each) to get the duration back."""
    frames = max(1, math.ceil(seconds * 44100 / 1152))
    frame = b"\xff\xfb\x90\xc0" + bytes(417 - 4)
    return frame * frames


def silent_wav(seconds: float, rate: int = 24000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(2 * round(seconds * rate)))
    return buf.getvalue()


def speech_audio(fmt: str, seconds: float) -> bytes:
    """Audio bytes for a speech `response_format`. mp3, wav and pcm (24 kHz 16-bit LE mono, as OpenAI
    sends it) are real silent audio; opus, aac and flac carry the right magic bytes only."""
    if fmt == "mp3":
        return silent_mp3(seconds)
    if fmt == "wav":
        return silent_wav(seconds)
    if fmt == "pcm":
        return bytes(2 * round(seconds * 24000))
    filler = bytes(max(16, round(seconds * 1000)))
    magic = {"opus": b"OggS\x00\x02" + bytes(20) + b"OpusHead", "aac": b"\xff\xf1\x50\x80",
             "flac": b"fLaC\x00\x00\x00\x22"}[fmt]
    return magic + filler


def tiny_png(seed: str, width: int = 2, height: int = 2) -> bytes:
    """A valid PNG (2x2 unless told) whose colour is derived from `seed`."""
    rgb = hashlib.sha256(seed.encode()).digest()[:3]
    raw = b"".join(b"\x00" + rgb * width for _ in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def audio_seconds(data: bytes) -> float:
    """Duration of an uploaded audio file: exact for WAV, else estimated at 128 kbit/s."""
    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            return w.getnframes() / w.getframerate()
    except (wave.Error, EOFError):
        return len(data) / 16000


# ---------------------------------------------------------------- knobs and records

@dataclass
class UploadedFile:
    field: str
    filename: str
    content_type: str
    data: bytes


@dataclass
class RecordedRequest:
    """One request as the upstream received it. `finished_at`, `status` and `cancelled` are filled in
    when the handler ends (status None when it never answered)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # keys lower-cased
    body: bytes  # raw body, as received
    json: Any  # parsed JSON body, or None
    form: dict[str, str]  # multipart text fields
    files: list[UploadedFile]
    received_at: float  # time.monotonic()
    finished_at: float | None = None
    status: int | None = None
    cancelled: bool = False

    def file(self, field_name: str) -> UploadedFile | None:
        return next((f for f in self.files if f.field == field_name), None)


async def parse_multipart(headers: Any, body: bytes) -> tuple[dict[str, str], list[UploadedFile]]:
    """multipart/form-data -> (text fields, files), with aiohttp's own MultipartReader over the body
    already read (fed into a StreamReader), so the raw body stays available for the record."""
    # a buffer limit above the body's size: the whole body is buffered at once, nothing to pause
    content = StreamReader(BaseProtocol(asyncio.get_running_loop()), len(body) + 1)
    content.feed_data(body)
    content.feed_eof()
    form: dict[str, str] = {}
    files: list[UploadedFile] = []
    async for part in MultipartReader(headers, content):
        if not isinstance(part, BodyPartReader) or not part.name:
            continue
        data = bytes(await part.read(decode=True))
        if part.filename is None:
            form[part.name] = data.decode("utf-8", "replace")
        else:
            content_type = part.headers.get(hdrs.CONTENT_TYPE, "text/plain").split(";")[0].strip()
            files.append(UploadedFile(part.name, part.filename, content_type, data))
    return form, files


@dataclass
class UpstreamBehaviour:
    """Knobs tests set between (or during) calls; read by the server thread at each request.

    Plain attribute assignment is atomic; use `fail()` (or assign a new list) to queue failures, since
    the server pops `fail_next` under the lock.
    """

    fail_next: list[int] = field(default_factory=list)  # statuses for the next N requests, any route
    hang: bool = False  # accept the request, never answer; the connection is dropped at stop()
    delay: float = 0.0  # seconds before any answer (headers included)
    chunk_delay: float = 0.0  # seconds between content chunks of a stream
    gate: threading.Event | None = None  # streams send their first content chunk, then wait for it
    chunks: int = 4  # content chunks of an answer (one token each)
    break_after: int | None = None  # streams: drop the connection after this many content chunks
    malformed_next: int = 0  # answer the next N requests 200 with a body that is not valid JSON
    require_key: str | None = None  # OpenAI routes: Bearer <key>; ElevenLabs route: xi-api-key
    models: list[str] = field(default_factory=lambda: list(DEFAULT_MODELS))  # GET /v1/models
    strict_models: bool = False  # when True a model not in `models` answers 404 model_not_found
    # chat models (name prefixes) that refuse max_tokens, as OpenAI's reasoning models do
    completion_cap_only: tuple[str, ...] = ("o1", "o3", "o4", "gpt-5")
    # non-stream chat completions answer these texts, one per request in order, then the fixed text
    replies: list[str] = field(default_factory=list)
    # False: answers and streams carry no usage report, asked or not (a provider that does not report)
    report_usage: bool = True
    # token counts reported instead of the stand-in's own (prompt_tokens, completion_tokens): an
    # upstream that counts differently from the gateway
    reported_usage: dict[str, int] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def fail(self, *statuses: int) -> None:
        with self._lock:
            self.fail_next.extend(statuses)

    def take_failure(self) -> int | None:
        with self._lock:
            return self.fail_next.pop(0) if self.fail_next else None

    def reply(self, *texts: str) -> None:
        """Script the next non-stream chat answers (JSON text, prose, anything), in order."""
        with self._lock:
            self.replies.extend(texts)

    def take_reply(self) -> str | None:
        with self._lock:
            return self.replies.pop(0) if self.replies else None

    def take_malformed(self) -> bool:
        with self._lock:
            if self.malformed_next > 0:
                self.malformed_next -= 1
                return True
            return False

    def restore_defaults(self) -> None:
        fresh = UpstreamBehaviour()
        with self._lock:
            for name in ("fail_next", "hang", "delay", "chunk_delay", "gate", "chunks", "break_after",
                         "malformed_next", "require_key", "models", "strict_models", "replies",
                         "completion_cap_only", "report_usage", "reported_usage"):
                setattr(self, name, getattr(fresh, name))


class _Answer(Exception):
    """Raised by validation to answer right away with `response`."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__(response.status)
        self.response = response


class _Dropped(Exception):
    """The stand-in closed the connection on purpose (break_after, or stop() during hang/gate)."""


_ERROR_TYPES = {
    400: ("invalid_request_error", None, "Bad request (injected by the test upstream)."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("invalid_request_error", "unsupported_country_region_territory",
          "Country, region, or territory not supported."),
    404: ("invalid_request_error", "model_not_found",
          "The model does not exist or you do not have access to it."),
    409: ("invalid_request_error", None, "Conflict (injected by the test upstream)."),
    422: ("invalid_request_error", None, "Unprocessable entity (injected by the test upstream)."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests."),
    500: ("server_error", None, "The server had an error while processing your request. Sorry about that!"),
    502: ("server_error", None, "Bad gateway."),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
    504: ("server_error", None, "Gateway timeout."),
}
_ELEVEN_STATUS = {400: "bad_request", 401: "invalid_api_key", 404: "not_found", 422: "invalid_request",
                  429: "too_many_concurrent_requests", 500: "internal_server_error",
                  503: "service_unavailable"}


def openai_error(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status)


def _bad(message: str, param: str | None = None, code: str | None = None, status: int = 400) -> _Answer:
    return _Answer(openai_error(status, message, param=param, code=code))


def _missing(param: str) -> _Answer:
    return _bad(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


def _eleven_error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"detail": {"status": code, "message": message}}, status=status)


def _eleven_invalid(loc: str, msg: str, type_: str) -> _Answer:
    # ElevenLabs (FastAPI) validation errors: 422 {"detail": [{"loc", "msg", "type"}]}
    return _Answer(web.json_response({"detail": [{"loc": ["body", loc], "msg": msg, "type": type_}]},
                                     status=422))


def _sse(event: dict[str, Any] | str) -> bytes:
    data = event if isinstance(event, str) else json.dumps(event, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


_REC = web.RequestKey("rec", RecordedRequest)


def _is_eleven(path: str) -> bool:
    return path == "/v1/sound-generation"


# ---------------------------------------------------------------- the server

class OpenAIUpstream:
    """`with OpenAIUpstream("a") as up:` starts it on a free loopback port; `up.url` ends in /v1."""

    def __init__(self, name: str = "upstream") -> None:
        self.name = name
        self.behaviour = UpstreamBehaviour()
        self.requests: list[RecordedRequest] = []
        self.cancelled = threading.Event()  # a client went away before its answer was complete
        self.stream_finished = threading.Event()  # a stream was sent to its end ([DONE] written)
        self.first_chunk_sent = threading.Event()  # a stream's first content chunk was written
        self.port = 0
        self._cond = threading.Condition()
        self._seq: dict[str, int] = {}
        self._images: dict[str, bytes] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # -- lifecycle

    @property
    def url(self) -> str:
        """Base URL for an OpenAI client (includes /v1)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def root_url(self) -> str:
        """Base URL without /v1, as an ElevenLabs client is configured (https://api.elevenlabs.io)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OpenAIUpstream:
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only then (else each answer waits ~40 ms
        # for the gateway's delayed ACK between its headers and its body)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))  # bound before the thread starts: the port is ours, no race
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._run, args=(sock,), name=f"upstream-{self.name}",
                                        daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"test upstream {self.name} did not start")
        if self._error is not None:
            raise RuntimeError(f"test upstream {self.name} failed to start") from self._error
        return self

    def stop(self) -> None:
        """Stop listening; hung or gated requests are dropped (their clients see a disconnect)."""
        loop, stopping, thread = self._loop, self._stopping, self._thread
        if loop is None or stopping is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):  # loop already closed
            loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> OpenAIUpstream:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def reset(self) -> None:
        """Back to defaults: knobs, recorded requests, id counters and events."""
        self.behaviour.restore_defaults()
        with self._cond:
            self.requests.clear()
            self._seq.clear()
            self._images.clear()
        self.cancelled.clear()
        self.stream_finished.clear()
        self.first_chunk_sent.clear()

    def wait_for_requests(self, count: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until `count` requests were received (for hang tests: the upstream has the call)."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.requests) >= count, timeout):
                raise TimeoutError(f"{self.name}: {len(self.requests)} requests, expected {count}")
            return list(self.requests)

    def requests_to(self, path: str) -> list[RecordedRequest]:
        """Requests whose path (after /v1) is `path`, e.g. "/chat/completions"."""
        with self._cond:
            return [r for r in self.requests if r.path == "/v1" + path]

    def _run(self, sock: socket.socket) -> None:
        loop = asyncio.new_event_loop()
        # gated streams each park a worker thread on gate.wait(); room for many concurrent ones
        loop.set_default_executor(ThreadPoolExecutor(max_workers=64,
                                                     thread_name_prefix=f"upstream-{self.name}"))
        self._loop = loop
        try:
            loop.run_until_complete(self._serve(sock))
        except BaseException as exc:  # reported to start() instead of dying silently in the thread
            self._error = exc
            self._ready.set()
        finally:
            loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()
            sock.close()

    async def _serve(self, sock: socket.socket) -> None:
        self._stopping = asyncio.Event()
        app = web.Application(middlewares=[self._middleware], client_max_size=MAX_BODY)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/audio/speech", self._speech)
        app.router.add_post("/v1/audio/transcriptions", self._transcriptions)
        app.router.add_post("/v1/audio/translations", self._translations)
        app.router.add_post("/v1/images/generations", self._image_generations)
        app.router.add_post("/v1/images/edits", self._image_edits)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model}", self._model)
        app.router.add_post("/v1/sound-generation", self._sound_generation)
        app.router.add_get("/files/{name}", self._file)
        # handler_cancellation: a client that disconnects cancels its handler, as a real provider
        # stops generating; that is what sets `cancelled` while a stream waits at its gate.
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            await runner.cleanup()

    # -- plumbing shared by every route

    async def _record(self, request: web.Request) -> RecordedRequest:
        body = await request.read()
        parsed, form, files = None, {}, []
        if request.content_type == "multipart/form-data":
            form, files = await parse_multipart(request.headers, body)
        elif body and request.content_type in ("application/json", ""):
            with contextlib.suppress(ValueError):
                parsed = json.loads(body)
        rec = RecordedRequest(
            method=request.method, path=request.path, query=dict(request.query),
            headers={k.lower(): v for k, v in request.headers.items()}, body=body, json=parsed,
            form=form, files=files, received_at=time.monotonic())
        with self._cond:
            self.requests.append(rec)
            self._cond.notify_all()
        return rec

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            rec = await self._record(request)
        except web.HTTPRequestEntityTooLarge:
            return openai_error(413, "Request body too large.", code="request_too_large")
        request[_REC] = rec
        try:
            response = await self._answer(request, handler, rec)
        except _Dropped:
            rec.finished_at = time.monotonic()
            # the transport is closed: aiohttp's attempt to send this fails quietly (ConnectionError)
            return web.Response(status=500)
        except (asyncio.CancelledError, ConnectionResetError):
            rec.cancelled = True
            rec.finished_at = time.monotonic()
            self.cancelled.set()
            raise
        if rec.finished_at is None:  # streams record themselves before their last byte
            rec.status, rec.finished_at = response.status, time.monotonic()
        return response

    async def _answer(self, request: web.Request, handler: Any, rec: RecordedRequest) -> web.StreamResponse:
        b = self.behaviour
        eleven = _is_eleven(request.path)
        if b.hang:
            assert self._stopping is not None
            await self._stopping.wait()
            self._drop(request)
        if b.delay:
            await asyncio.sleep(b.delay)
        status = b.take_failure()
        if status is not None:
            type_, code, message = _ERROR_TYPES.get(status, ("server_error" if status >= 500
                                                             else "invalid_request_error", None,
                                                             f"Injected HTTP {status}."))
            if eleven:
                return _eleven_error(status, _ELEVEN_STATUS.get(status, "error"), message)
            return openai_error(status, message, type_, None, code)
        if b.take_malformed():
            return web.Response(status=200, body=b'{"object": "chat.comp', content_type="application/json")
        if b.require_key is not None and not request.path.startswith("/files/"):
            refused = self._check_key(request, b.require_key, eleven)
            if refused is not None:
                return refused
        try:
            return await handler(request)
        except _Answer as answer:
            return answer.response
        except web.HTTPException as exc:
            if exc.status == 413:
                return openai_error(413, "Request body too large.", code="request_too_large")
            if exc.status in (404, 405):
                return openai_error(404, f"Invalid URL ({request.method} {request.path})")
            raise

    def _check_key(self, request: web.Request, key: str, eleven: bool) -> web.Response | None:
        if eleven:
            given = request.headers.get("xi-api-key")
            if given is None:
                return _eleven_error(401, "needs_authorization",
                                     "Neither authorization header nor xi-api-key received, please "
                                     "provide one.")
            return None if given == key else _eleven_error(401, "invalid_api_key", "Invalid API key")
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            return openai_error(401, "You didn't provide an API key. You need to provide your API key in an "
                                     "Authorization header using Bearer auth (i.e. Authorization: Bearer "
                                     "YOUR_KEY).")
        if auth[7:].strip() != key:
            return openai_error(401, f"Incorrect API key provided: {auth[7:11]}****.", code="invalid_api_key")
        return None

    def _drop(self, request: web.Request) -> None:
        """Close the connection without finishing the answer: a dead or failing upstream."""
        if request.transport is not None:
            request.transport.close()
        raise _Dropped

    def _next_id(self, prefix: str) -> str:
        """Ids count per prefix, so the Nth chat answer of upstream "a" is always chatcmpl-a-N."""
        with self._cond:
            self._seq[prefix] = self._seq.get(prefix, 0) + 1
            return f"{prefix}-{self.name}-{self._seq[prefix]}"

    def _json_body(self, request: web.Request) -> dict[str, Any]:
        rec: RecordedRequest = request[_REC]
        if not isinstance(rec.json, dict):
            raise _bad("We could not parse the JSON body of your request. (HINT: This likely means you "
                       "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)")
        return rec.json

    def _model_of(self, body: dict[str, Any], default: str | None = None) -> str:
        model = body.get("model", default)
        if not isinstance(model, str) or not model:
            raise _bad("you must provide a model parameter")
        if self.behaviour.strict_models and model not in self.behaviour.models:
            raise _bad(f"The model `{model}` does not exist or you do not have access to it.",
                       code="model_not_found", status=404)
        return model

    async def _wait_gate(self, request: web.Request, gate: threading.Event) -> None:
        # a threading.Event cannot be awaited; short waits in a worker thread keep the loop free and
        # wake as soon as the test sets it (cancellation interrupts the await, not the thread)
        assert self._stopping is not None
        while not await asyncio.to_thread(gate.wait, 0.05):
            if self._stopping.is_set():
                self._drop(request)

    async def _stream(self, request: web.Request, head: list[dict[str, Any]], body: list[dict[str, Any]],
                      tail: list[dict[str, Any]]) -> web.StreamResponse:
        """SSE: head events, content events (gate after the first, chunk_delay between, break_after),
        tail events, then `data: [DONE]`."""
        b = self.behaviour
        gate, delay, break_after = b.gate, b.chunk_delay, b.break_after
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                               "Cache-Control": "no-cache",
                                               "x-request-id": self._next_id("req")})
        await response.prepare(request)
        for event in head:
            await response.write(_sse(event))
        for i, event in enumerate(body):
            if break_after is not None and i >= break_after:
                self._drop(request)
            if i and delay:
                await asyncio.sleep(delay)
            await response.write(_sse(event))
            if i == 0:
                self.first_chunk_sent.set()
                if gate is not None:
                    await self._wait_gate(request, gate)
        for event in tail:
            await response.write(_sse(event))
        await response.write(_sse("[DONE]"))
        # recorded before the terminating chunk goes out: a client that has read the whole body can
        # rely on seeing the record finished and `stream_finished` set
        rec = request[_REC]
        rec.status, rec.finished_at = response.status, time.monotonic()
        self.stream_finished.set()
        await response.write_eof()
        return response

    def _usage_field(self, usage: dict[str, Any]) -> dict[str, Any]:
        """An answer's `usage`, or nothing for a provider that does not report."""
        return {"usage": usage} if self.behaviour.report_usage else {}

    def _json(self, payload: dict[str, Any]) -> web.Response:
        return web.json_response(payload, headers={"x-request-id": self._next_id("req")})

    # -- chat and completions

    def _stream_flags(self, body: dict[str, Any]) -> tuple[bool, bool]:
        stream = body.get("stream") is True
        options = body.get("stream_options")
        if options is not None and not stream:
            raise _bad("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                       param="stream_options", code="invalid_value")
        return stream, (stream and isinstance(options, dict) and options.get("include_usage") is True
                        and self.behaviour.report_usage)

    def _common_sampling(self, body: dict[str, Any]) -> tuple[int, int]:
        """(n, tokens per choice) after validating temperature, n and max_tokens."""
        temperature = body.get("temperature")
        if temperature is not None:
            if not isinstance(temperature, int | float) or isinstance(temperature, bool):
                raise _bad("Invalid type for 'temperature': expected a decimal.", param="temperature",
                           code="invalid_type")
            if temperature > 2:
                raise _bad(f"Invalid 'temperature': decimal above maximum value. Expected a value <= 2, "
                           f"but got {temperature} instead.", param="temperature",
                           code="decimal_above_max_value")
            if temperature < 0:
                raise _bad(f"Invalid 'temperature': decimal below minimum value. Expected a value >= 0, "
                           f"but got {temperature} instead.", param="temperature",
                           code="decimal_below_min_value")
        n = body.get("n", 1)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 128:
            raise _bad("Invalid 'n': expected an integer between 1 and 128.", param="n", code="invalid_value")
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise _bad("Invalid 'max_tokens': integer below minimum value. Expected a value >= 1.",
                       param="max_tokens", code="integer_below_min_value")
        tokens = max(1, self.behaviour.chunks)
        return n, tokens if limit is None else min(tokens, limit)

    def _usage(self, prompt: int, completion: int) -> dict[str, Any]:
        reported = self.behaviour.reported_usage or {}
        prompt = reported.get("prompt_tokens", prompt)
        completion = reported.get("completion_tokens", completion)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                              "accepted_prediction_tokens": 0,
                                              "rejected_prediction_tokens": 0}}

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = self._json_body(request)
        model = self._model_of(body)
        if "max_tokens" in body and model.startswith(self.behaviour.completion_cap_only):
            raise _bad("Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                       "'max_completion_tokens' instead.", param="max_tokens", code="unsupported_parameter")
        if "messages" not in body:
            raise _bad("Missing required parameter: 'messages'.", param="messages",
                       code="missing_required_parameter")
        messages = body["messages"]
        if not isinstance(messages, list):
            raise _bad("Invalid type for 'messages': expected an array of objects.", param="messages",
                       code="invalid_type")
        if not messages:
            raise _bad("Invalid 'messages': empty array. Expected an array with minimum length 1, but got "
                       "an empty array instead.", param="messages", code="empty_array")
        texts: list[str] = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise _bad(f"Missing required parameter: 'messages[{i}].role'.", param=f"messages[{i}].role",
                           code="missing_required_parameter")
            content = message.get("content")
            if isinstance(content, list):  # content parts: count the text ones
                texts.extend(p.get("text", "") for p in content if isinstance(p, dict))
            elif isinstance(content, str):
                texts.append(content)
        stream, include_usage = self._stream_flags(body)
        n, tokens = self._common_sampling(body)
        finish = "length" if tokens < max(1, self.behaviour.chunks) else "stop"
        pieces = reply_pieces(self.name, self.behaviour.chunks)[:tokens]
        usage = self._usage(word_tokens(" ".join(texts)), tokens * n)
        base = {"id": self._next_id("chatcmpl"), "created": CREATED, "model": model,
                "service_tier": "default", "system_fingerprint": f"fp_{self.name}"}
        if not stream:
            text = "".join(pieces)
            scripted = self.behaviour.take_reply()
            if scripted is not None:
                text, tokens, finish = scripted_reply(scripted, body.get("max_completion_tokens",
                                                                         body.get("max_tokens")))
                usage = self._usage(usage["prompt_tokens"], tokens * n)
            choices = [{"index": i, "message": {"role": "assistant", "content": text,
                                                "refusal": None, "annotations": []},
                        "logprobs": None, "finish_reason": finish} for i in range(n)]
            return self._json({**base, "object": "chat.completion", "choices": choices,
                               **self._usage_field(usage)})

        def chunk(delta: dict[str, Any], finish_reason: str | None, i: int) -> dict[str, Any]:
            event = {**base, "object": "chat.completion.chunk",
                     "choices": [{"index": i, "delta": delta, "logprobs": None,
                                  "finish_reason": finish_reason}]}
            if include_usage:
                event["usage"] = None  # every chunk but the last carries usage: null
            return event

        head = [chunk({"role": "assistant", "content": "", "refusal": None}, None, i) for i in range(n)]
        content = [chunk({"content": p}, None, i) for p in pieces for i in range(n)]
        tail = [chunk({}, finish, i) for i in range(n)]
        if include_usage:
            tail.append({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        return await self._stream(request, head, content, tail)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = self._json_body(request)
        model = self._model_of(body)
        prompt = body.get("prompt")
        if prompt is None:
            raise _missing("prompt")
        if isinstance(prompt, str):
            prompts = [prompt]
        elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            prompts = prompt
        elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
            prompts = [" ".join(map(str, prompt))]  # one prompt given as token ids: one token per id
        else:
            raise _bad("Invalid 'prompt': expected a string, an array of strings or of tokens.",
                       param="prompt", code="invalid_type")
        stream, include_usage = self._stream_flags(body)
        n, tokens = self._common_sampling(body)
        finish = "length" if tokens < max(1, self.behaviour.chunks) else "stop"
        pieces = reply_pieces(self.name, self.behaviour.chunks)[:tokens]
        echo = body.get("echo") is True
        count = len(prompts) * n  # choice index = prompt index * n + sample index
        usage = self._usage(sum(word_tokens(p) for p in prompts), tokens * count)
        usage.pop("prompt_tokens_details")  # the legacy endpoint reports only the totals and reasoning
        base = {"id": self._next_id("cmpl"), "object": "text_completion", "created": CREATED, "model": model,
                "system_fingerprint": f"fp_{self.name}"}
        if not stream:
            choices = [{"text": (prompts[i // n] if echo else "") + "".join(pieces), "index": i,
                        "logprobs": None, "finish_reason": finish} for i in range(count)]
            return self._json({**base, "choices": choices, **self._usage_field(usage)})

        def chunk(text: str, finish_reason: str | None, i: int) -> dict[str, Any]:
            event = {**base, "choices": [{"text": text, "index": i, "logprobs": None,
                                          "finish_reason": finish_reason}]}
            if include_usage:
                event["usage"] = None
            return event

        head = [chunk(prompts[i // n], None, i) for i in range(count)] if echo else []
        content = [chunk(p, None, i) for p in pieces for i in range(count)]
        tail = [chunk("", finish, i) for i in range(count)]
        if include_usage:
            tail.append({**base, "choices": [], "usage": usage})
        return await self._stream(request, head, content, tail)

    # -- embeddings

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        body = self._json_body(request)
        model = self._model_of(body)
        raw = body.get("input")
        if raw is None:
            raise _missing("input")
        if isinstance(raw, str):
            inputs = [raw]
        elif isinstance(raw, list) and raw and all(isinstance(x, str) for x in raw):
            inputs = raw
        elif isinstance(raw, list) and raw and all(isinstance(x, int) for x in raw):
            inputs = [" ".join(map(str, raw))]
        elif isinstance(raw, list) and raw and all(isinstance(x, list) for x in raw):
            inputs = [" ".join(map(str, x)) for x in raw]
        else:
            raise _bad("'$.input' is invalid. Please check the API reference: "
                       "https://platform.openai.com/docs/api-reference.", param="input", code="invalid_value")
        if any(x == "" for x in inputs):
            raise _bad("'$.input' is invalid. Please check the API reference: "
                       "https://platform.openai.com/docs/api-reference.", param="input", code="invalid_value")
        dimensions = body.get("dimensions", 16)
        if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1:
            raise _bad("Invalid 'dimensions': integer below minimum value.", param="dimensions",
                       code="integer_below_min_value")
        encoding = body.get("encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise _bad(f"Invalid value for 'encoding_format': expected 'float' or 'base64', got "
                       f"'{encoding}'.", param="encoding_format", code="invalid_value")
        data = []
        for i, text in enumerate(inputs):
            vector = embedding_vector(model, text, dimensions)
            encoded: Any = vector
            if encoding == "base64":  # little-endian float32, as OpenAI sends it
                encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        tokens = sum(word_tokens(t) for t in inputs)
        tokens = (self.behaviour.reported_usage or {}).get("prompt_tokens", tokens)
        return self._json({"object": "list", "data": data, "model": model,
                           **self._usage_field({"prompt_tokens": tokens, "total_tokens": tokens})})

    # -- audio

    async def _speech(self, request: web.Request) -> web.StreamResponse:
        body = self._json_body(request)
        self._model_of(body)
        text = body.get("input")
        if not isinstance(text, str) or not text:
            raise _missing("input")
        if len(text) > 4096:
            raise _bad(f"Invalid 'input': string too long. Expected a string with maximum length 4096, but "
                       f"got a string with length {len(text)} instead.", param="input",
                       code="string_above_max_length")
        if not isinstance(body.get("voice"), str | dict):
            raise _missing("voice")
        fmt = body.get("response_format", "mp3")
        if fmt not in SPEECH_FORMATS:
            raise _bad(f"Invalid value: '{fmt}'. Supported values are: 'mp3', 'opus', 'aac', 'flac', 'wav', "
                       f"and 'pcm'.", param="response_format", code="invalid_value")
        speed = body.get("speed", 1.0)
        if not isinstance(speed, int | float) or not 0.25 <= speed <= 4.0:
            raise _bad("Invalid 'speed': expected a number between 0.25 and 4.0.", param="speed",
                       code="invalid_value")
        audio = speech_audio(fmt, speech_seconds(text) / speed)
        return web.Response(body=audio, headers={"Content-Type": SPEECH_FORMATS[fmt],
                                                 "x-request-id": self._next_id("req")})

    def _audio_upload(self, request: web.Request) -> tuple[RecordedRequest, UploadedFile, str, str]:
        rec: RecordedRequest = request[_REC]
        if request.content_type != "multipart/form-data":
            raise _bad("Invalid Content-Type header (expected multipart/form-data).")
        upload = rec.file("file")
        if upload is None:
            raise _missing("file")
        model = rec.form.get("model")
        if not model:
            raise _bad("you must provide a model parameter")
        if self.behaviour.strict_models and model not in self.behaviour.models:
            raise _bad(f"The model `{model}` does not exist or you do not have access to it.",
                       code="model_not_found", status=404)
        ext = upload.filename.rsplit(".", 1)[-1].lower() if "." in upload.filename else ""
        if ext not in TRANSCRIPTION_EXTENSIONS:
            raise _bad(f"Invalid file format. Supported formats: {list(TRANSCRIPTION_EXTENSIONS)}",
                       param="file", code="invalid_value")
        fmt = rec.form.get("response_format", "json")
        if fmt not in ("json", "text", "srt", "verbose_json", "vtt"):
            raise _bad(f"Invalid value: '{fmt}'. Supported values are: 'json', 'text', 'srt', "
                       f"'verbose_json', and 'vtt'.", param="response_format", code="invalid_value")
        return rec, upload, model, fmt

    def _audio_answer(self, task: str, model: str, fmt: str, text: str, seconds: float,
                      language: str) -> web.StreamResponse:
        headers = {"x-request-id": self._next_id("req")}
        if fmt == "text":
            return web.Response(text=text + "\n", content_type="text/plain", headers=headers)
        stamp = time.strftime("%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds * 1000) % 1000:03d}"
        if fmt == "srt":
            return web.Response(text=f"1\n00:00:00,000 --> {stamp.replace('.', ',')}\n{text}\n\n",
                                content_type="text/plain", headers=headers)
        if fmt == "vtt":
            return web.Response(text=f"WEBVTT\n\n00:00:00.000 --> {stamp}\n{text}\n\n",
                                content_type="text/plain", headers=headers)
        if model.startswith("whisper"):
            usage: dict[str, Any] = {"type": "duration", "seconds": math.ceil(seconds)}
        else:
            audio_tokens, out = max(1, round(seconds * 10)), word_tokens(text)
            usage = {"type": "tokens", "input_tokens": audio_tokens, "output_tokens": out,
                     "total_tokens": audio_tokens + out,
                     "input_token_details": {"audio_tokens": audio_tokens, "text_tokens": 0}}
        if fmt == "verbose_json":
            segment = {"id": 0, "seek": 0, "start": 0.0, "end": round(seconds, 3), "text": text,
                       "tokens": [50364, 50414], "temperature": 0.0, "avg_logprob": -0.2,
                       "compression_ratio": 1.0, "no_speech_prob": 0.01}
            payload = {"task": task, "language": language, "duration": round(seconds, 3), "text": text,
                       "segments": [segment]}
            if task == "transcribe":
                payload["usage"] = usage
            return web.json_response(payload, headers=headers)
        if task == "translate":
            return web.json_response({"text": text}, headers=headers)
        return web.json_response({"text": text, "usage": usage}, headers=headers)

    async def _transcriptions(self, request: web.Request) -> web.StreamResponse:
        rec, upload, model, fmt = self._audio_upload(request)
        seconds = audio_seconds(upload.data)
        text = f"Transcript by {self.name} of {upload.filename}: {seconds:.2f} seconds of audio."
        language = rec.form.get("language", "english")
        return self._audio_answer("transcribe", model, fmt, text, seconds, language)

    async def _translations(self, request: web.Request) -> web.StreamResponse:
        _, upload, model, fmt = self._audio_upload(request)
        seconds = audio_seconds(upload.data)
        text = f"Translation by {self.name} of {upload.filename}: {seconds:.2f} seconds of audio."
        return self._audio_answer("translate", model, fmt, text, seconds, "english")

    # -- images

    def _image_params(self, params: dict[str, Any], default_model: str) -> tuple[str, str, int, str, str]:
        model = params.get("model") or default_model
        if self.behaviour.strict_models and model not in self.behaviour.models:
            raise _bad(f"The model `{model}` does not exist or you do not have access to it.",
                       code="model_not_found", status=404)
        prompt = params.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise _missing("prompt")
        try:
            n = int(params.get("n", 1))
        except (TypeError, ValueError):
            raise _bad("Invalid type for 'n': expected an integer.", param="n", code="invalid_type") from None
        if not 1 <= n <= 10 or (model == "dall-e-3" and n != 1):
            raise _bad(f"Invalid 'n': {n} images is not supported for model {model}.", param="n",
                       code="invalid_value")
        size = str(params.get("size") or ("auto" if model.startswith("gpt-image") else "1024x1024"))
        allowed = IMAGE_SIZES.get(model)
        if (allowed is not None and size not in allowed) or (allowed is None and size != "auto"
                                                               and not re.fullmatch(r"\d+x\d+", size)):
            raise _bad(f"'{size}' is not one of {list(allowed or ['<width>x<height>'])} - 'size'",
                       param="size", code="invalid_value")
        fmt = str(params.get("response_format") or "url")
        if fmt not in ("url", "b64_json"):
            raise _bad(f"'{fmt}' is not one of ['url', 'b64_json'] - 'response_format'",
                       param="response_format", code="invalid_value")
        if model.startswith("gpt-image"):
            fmt = "b64_json"  # the GPT image models always answer base64
        return model, prompt, n, size, fmt

    def _images_answer(self, model: str, prompt: str, n: int, size: str, fmt: str) -> web.StreamResponse:
        data = []
        for i in range(n):
            png = tiny_png(f"{model}\0{prompt}\0{size}\0{i}")
            item: dict[str, Any]
            if fmt == "b64_json":
                item = {"b64_json": base64.b64encode(png).decode()}
            else:
                name = f"{self._next_id('img')}.png"
                self._images[name] = png
                item = {"url": f"{self.root_url}/files/{name}"}
            if model == "dall-e-3":
                item["revised_prompt"] = f"{prompt} (revised by {self.name})"
            data.append(item)
        payload: dict[str, Any] = {"created": CREATED, "data": data}
        if model.startswith("gpt-image"):
            text_tokens = word_tokens(prompt)
            payload.update(background="opaque", output_format="png", quality="medium",
                           size="1024x1024" if size == "auto" else size,
                           usage={"input_tokens": text_tokens, "output_tokens": 1056 * n,
                                  "total_tokens": text_tokens + 1056 * n,
                                  "input_tokens_details": {"image_tokens": 0, "text_tokens": text_tokens}})
        return self._json(payload)

    async def _image_generations(self, request: web.Request) -> web.StreamResponse:
        body = self._json_body(request)
        return self._images_answer(*self._image_params(body, "dall-e-2"))

    async def _image_edits(self, request: web.Request) -> web.StreamResponse:
        rec: RecordedRequest = request[_REC]
        if request.content_type != "multipart/form-data":
            raise _bad("Invalid Content-Type header (expected multipart/form-data).")
        images = [f for f in rec.files if f.field in ("image", "image[]")]
        if not images:
            raise _missing("image")
        for f in images + [f for f in rec.files if f.field == "mask"]:
            if not f.data.startswith(b"\x89PNG") and not f.filename.lower().endswith((".png", ".jpg", ".jpeg",
                                                                                       ".webp")):
                raise _bad(f"Invalid file '{f.field}': unsupported mimetype ('{f.content_type}'). Supported "
                           f"file formats are 'image/png', 'image/jpeg', and 'image/webp'.", param=f.field,
                           code="invalid_image_format")
        return self._images_answer(*self._image_params(rec.form, "dall-e-2"))

    async def _file(self, request: web.Request) -> web.StreamResponse:
        png = self._images.get(request.match_info["name"])
        if png is None:
            raise web.HTTPNotFound()
        return web.Response(body=png, content_type="image/png")

    # -- models

    def _model_object(self, model: str) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": CREATED, "owned_by": self.name}

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return self._json({"object": "list", "data": [self._model_object(m) for m in self.behaviour.models]})

    async def _model(self, request: web.Request) -> web.StreamResponse:
        model = request.match_info["model"]
        if model not in self.behaviour.models:
            raise _bad(f"The model '{model}' does not exist", param="model", code="model_not_found",
                       status=404)
        return self._json(self._model_object(model))

    # -- ElevenLabs sound effects

    async def _sound_generation(self, request: web.Request) -> web.StreamResponse:
        """ElevenLabs `POST /v1/sound-generation?output_format=mp3_44100_128`, header `xi-api-key`, JSON
        {"text" (required), "duration_seconds" (0.5..30 or null: auto), "prompt_influence" (0..1, default
        0.3), "loop" (bool), "model_id" (default eleven_text_to_sound_v2)}; answers the audio bytes."""
        rec: RecordedRequest = request[_REC]
        body = rec.json
        if not isinstance(body, dict):
            raise _eleven_invalid("text", "Input should be a valid dictionary or object",
                                  "model_attributes_type")
        text = body.get("text")
        if not isinstance(text, str) or not text:
            raise _eleven_invalid("text", "Field required", "missing")
        duration = body.get("duration_seconds")
        if duration is not None and (not isinstance(duration, int | float) or not 0.5 <= duration <= 30):
            raise _eleven_invalid("duration_seconds", "Duration must be between 0.5 and 30 seconds",
                                  "value_error")
        influence = body.get("prompt_influence", 0.3)
        if influence is not None and (not isinstance(influence, int | float) or not 0 <= influence <= 1):
            raise _eleven_invalid("prompt_influence", "Prompt influence must be between 0 and 1",
                                  "value_error")
        if not isinstance(body.get("loop", False), bool):
            raise _eleven_invalid("loop", "Input should be a valid boolean", "bool_type")
        output = rec.query.get("output_format", "mp3_44100_128")
        seconds = SOUND_AUTO_DURATION if duration is None else float(duration)
        if re.fullmatch(r"mp3_\d+_\d+", output):
            audio, content_type = silent_mp3(seconds), "audio/mpeg"
        elif m := re.fullmatch(r"pcm_(\d+)", output):
            audio, content_type = bytes(2 * round(seconds * int(m.group(1)))), "audio/pcm"
        else:
            raise _Answer(web.json_response(
                {"detail": [{"loc": ["query", "output_format"], "msg": f"Invalid output format: {output}",
                             "type": "value_error"}]}, status=422))
        return web.Response(body=audio, headers={"Content-Type": content_type,
                                                 "request-id": self._next_id("req")})


@contextlib.contextmanager
def running_upstream(name: str = "upstream") -> Iterator[OpenAIUpstream]:
    """`with running_upstream("a") as up:`, or `yield from` it in a pytest fixture."""
    upstream = OpenAIUpstream(name).start()
    try:
        yield upstream
    finally:
        upstream.stop()
