"""Shared pieces of the OpenAI-compatible routes: body reading, model lookup, errors, SSE; and
the paid answer every REST route makes (`answer_call`, `PaidAnswer`: the marketplace's too)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agent.edge.http_io import (
    HttpProblem,
    client_address,
    error_body,
    json_bytes,
    payment_from,
    read_json_object,
    receipt_headers,
    render,
    timing_headers,
)
from agent.pipeline.bazaar import BodyType, HttpRoute
from agent.pipeline.gateway import Gateway
from agent.pipeline.outcomes import Delivered, Outcome
from agent.pipeline.requests import CallRequest
from agent.pipeline.streams import StreamFailed

NO_RETRY = {"x-should-retry": "false"}

# What a model route's 402 tells x402 indexers besides its body schema (agent/pipeline/bazaar.py): an
# example body (the route's first available model is added) and what comes back.
ROUTE_DOCS: dict[str, tuple[dict[str, Any] | None, str, str]] = {
    "chat.completions": ({"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 64},
                         "json", "an OpenAI chat.completion object; server-sent chat.completion.chunk "
                                 "events when stream is true"),
    "completions": ({"prompt": "Say hello.", "max_tokens": 16}, "json",
                    "an OpenAI text_completion object; server-sent events when stream is true"),
    "edits": ({"input": "helo wrld", "instruction": "Fix the spelling."}, "json",
              "an OpenAI edit object"),
    "embeddings": ({"input": "The quick brown fox."}, "json", "an OpenAI list of embeddings"),
    "audio.speech": ({"input": "Hello!", "voice": "alloy"}, "binary",
                     "the audio, audio/mpeg unless response_format names another"),
    "audio.generations": ({"prompt": "Rain on a tin roof"}, "binary", "the audio, audio/mpeg"),
    "images.generations": ({"prompt": "A red bicycle"}, "json", "an OpenAI images response"),
    # multipart forms: the upload stands for the file sent in that field
    "images.edits": ({"image": "(a PNG image)", "prompt": "Add a red hat"}, "json",
                     "an OpenAI images response"),
    "audio.transcriptions": ({"file": "(an audio file)"}, "json", "an OpenAI transcription object"),
    "audio.translations": ({"file": "(an audio file)"}, "json", "an OpenAI translation object"),
}


def model_route(gateway: Gateway, path: str, operation: str, body_type: BodyType = "json") -> HttpRoute:
    """A /v1 model route as its 402s describe it: one description for all its models."""
    example, output, output_format = ROUTE_DOCS.get(operation, (None, "json", ""))
    return HttpRoute(path, operation=operation, body_type=body_type, example=example,
                     output_type=output, output_format=output_format, shared=True,
                     model_required=gateway.default_model(operation) is None,
                     description=f"OpenAI-compatible {operation} on any model of GET /v1/models, "
                                 "paid per call with x402")


def empty(request: Request) -> bool:
    """The request has no body at all (no Content-Length or 0, not chunked): with no payment, an
    indexer's probe, answered with the route's quote before any body is read or checked."""
    return (request.headers.get("content-length", "0").strip() in ("", "0")
            and "transfer-encoding" not in request.headers)


DONE = b"data: [DONE]\n\n"  # an OpenAI stream's last event
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a request whose client left before its answer


class EventStream(StreamingResponse):
    """The SSE answer of a delivered stream, tied to its client: a client that leaves cancels the
    stream at once, and the pipeline is told whether the last byte went to a client still there
    (`Delivered.handed_over`: a stream nobody received is not delivered; a retry of its payment
    gets it). The `DONE` event goes out with the end of the body: one socket write less.
    """

    def __init__(self, content: AsyncIterator[bytes], *, outcome: Delivered | None = None,
                 headers: dict[str, str] | None = None, media_type: str = "text/event-stream",
                 ) -> None:
        super().__init__(content, headers=headers, media_type=media_type)
        self.outcome = outcome  # the pipeline's stream these events carry (None: nothing to tell)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async with _watching(receive) as client:  # (a free stream: watched from its first byte)
            await self.answer(send, client)

    async def answer(self, send: Any, client: _ClientWatch) -> None:
        reached = False
        try:
            reached = await self._send_events(send, client)
        finally:
            if self.outcome is not None:
                self.outcome.handed_over(reached)

    async def _send_events(self, send: Any, client: _ClientWatch) -> bool:
        """Send every event; the body's end only to a client still there. True when it was."""
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        last = b""
        try:
            async for chunk in self.body_iterator:
                if chunk is DONE:
                    last = chunk  # goes out with the end of the body
                    continue
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:  # cancelled while sending: close the chain down to the upstream request now
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
        # A stream that came in one burst was written without a pause, to a connection that may
        # have died meanwhile (the server's sends to it are silently dropped): it counts as
        # received only if no disconnect is pending once the loop has heard of the connection.
        if not await client.present():
            return False
        await send({"type": "http.response.body", "body": last, "more_body": False})
        return True


class PaidAnswer(Response):
    """A paid call, made as its answer is sent: its client is watched from the moment the call
    starts (not only once a stream begins). A client that leaves while the upstream works stops
    the call before settlement (nothing is charged); one that leaves while it settles, or before
    the answer's last byte, gets the result on a retry of the same payment (the pipeline is told
    it was not delivered). `render` writes the face's answer of the Outcome (OpenAI's by default;
    the marketplace wraps its errors)."""

    def __init__(self, gateway: Gateway, req: CallRequest,
                 render: Callable[[Outcome], Response] | None = None) -> None:  # (no body of its own)
        self.gateway, self.req, self.render = gateway, req, render or respond

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        answered = False
        async with _watching(receive) as client:
            outcome = await self.gateway.call(self.req)
            answered = True
            response = self.render(outcome)
            if isinstance(response, EventStream):
                await response.answer(send, client)
                return
            reached = False
            try:  # (written at once: no await between the call's end and the answer's bytes)
                await response(scope, receive, send)
                reached = True
            finally:
                if isinstance(outcome, Delivered):
                    outcome.handed_over(reached)
        if not answered:  # the client left during the call: nobody reads an answer (the server
            # drops it); its status is what the request's metrics and log line count
            with contextlib.suppress(OSError):
                await send({"type": "http.response.start", "status": CLIENT_CLOSED_REQUEST,
                            "headers": []})


@contextlib.asynccontextmanager
async def _watching(receive: Any) -> AsyncIterator[_ClientWatch]:
    """A request's client watched while the block runs: its leaving cancels the block, and that
    cancellation ends here (nobody is left to answer); any other is passed on."""
    client = _ClientWatch(receive)
    try:
        yield client
        client.complete = True
    except asyncio.CancelledError:
        if not client.left or client.task.uncancel() > 0:
            raise  # cancelled by someone else (e.g. the server shutting down)
    finally:
        client.stop()


class _ClientWatch:
    """Cancels the current task when its client disconnects before the response is complete.

    Under ASGI spec 2.4 Starlette only learns of a disconnect when its next send fails (uvicorn
    drops sends to a closed connection silently), i.e. when the upstream produces the next chunk;
    a slow or stuck upstream would keep its request open. So a task waits for `http.disconnect`
    beside the call and the answer and cancels them (Starlette's own way, cost ~100 µs of CPU).
    """

    # Loop turns `present` yields, enough for a peer's close the loop has not even polled yet:
    # the socket's EOF read, the connection's loss reported, this watcher woken, the caller
    # cancelled (a write that failed has already queued the loss: two turns).
    TURNS = 4

    def __init__(self, receive: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task, self.left, self.complete = task, False, False
        self._watcher: asyncio.Future[None] | None = asyncio.ensure_future(self._wait(receive))

    async def _wait(self, receive: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self.complete:  # (a completed response reads as a disconnect too)
            self.left = True
            self.task.cancel()

    async def present(self) -> bool:
        """Is the client still there, once what the event loop already knows of its connection
        has been processed? (A client seen leaving cancels the caller here.)"""
        for _ in range(self.TURNS):
            await asyncio.sleep(0)
        return not self.left

    def stop(self) -> None:
        # Dropped, not only cancelled: the watcher's frame holds this object, so keeping it here
        # is a reference cycle that holds the request's objects (uvicorn's RequestResponseCycle,
        # both tasks, buffers) until the next garbage collection.
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()


async def answer_call(gateway: Gateway, req: CallRequest,
                      render: Callable[[Outcome], Response] | None = None) -> Response:
    """The answer of a call on any REST route: a paid one is made inside its answer, its client
    watched (`PaidAnswer`); an unpaid one (a quote, a refusal, a free skill) is answered at once."""
    if req.payment is not None:
        return PaidAnswer(gateway, req, render)
    return (render or respond)(await gateway.call(req))


def find_model(gateway: Gateway, model: str) -> Any:
    """The model skill named `model`; HttpProblem 404 `model_not_found` if there is none."""
    skill = gateway.catalogue.get(model)
    if skill is None or skill.kind != "model":
        raise HttpProblem(404, "model_not_found", f"The model '{model}' does not exist; "
                          "GET /v1/models lists the models", "model")
    return skill


def model_skill(gateway: Gateway, body: dict[str, Any], operation: str) -> Any:
    """The model skill a body names (HttpProblem 400/404 otherwise)."""
    if "model" not in body and (default := gateway.default_model(operation)) is not None:
        body["model"] = default  # the pipeline's default, kept in the body the skill validates
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise HttpProblem(400, "missing_model",
                          "'model' is required: a model id from GET /v1/models", "model")
    skill = find_model(gateway, model)
    if operation not in skill.operations:
        raise HttpProblem(400, "unsupported_operation", f"'{model}' does not support {operation}; "
                          f"it supports {', '.join(skill.operations)}", "model")
    return skill


async def sse(chunks: Any, outcome: Delivered | None = None) -> AsyncIterator[bytes]:
    """The chunks as SSE events. A stream charged at its end (`upto`, a channel voucher or
    deposit) had no receipt of its charge when its headers went out (none, or a deposit's): its
    receipt follows the last chunk as an SSE comment (`: PAYMENT-RESPONSE <base64>`), which every
    SSE parser skips and an x402 client may read."""
    sent = outcome.receipt if outcome is not None else None
    try:
        async for chunk in chunks:
            yield b"data: " + json_bytes(chunk) + b"\n\n"
    except StreamFailed as exc:
        error = error_body(exc.status, exc.code, exc.message, None)
        yield b"data: " + json_bytes(error) + b"\n\n"
        return
    finally:
        # A client that went away cancels this generator: close the chain down to the upstream
        # request now (not whenever the garbage collector gets to it).
        await chunks.aclose()
    if outcome is not None and outcome.receipt is not None and outcome.receipt is not sent:
        [encoded, *_] = receipt_headers(outcome.receipt).values()
        yield b": PAYMENT-RESPONSE " + encoded.encode() + b"\n\n"
    yield DONE


def respond(outcome: Outcome) -> Response:
    """An Outcome as OpenAI's answer: SSE for a stream, JSON otherwise; `x-should-retry: false`
    (OpenAI's clients honour it) where the pipeline says a client's own retry is not safe."""
    retry = {} if outcome.retry_safe else NO_RETRY
    if isinstance(outcome, Delivered) and outcome.stream is not None:
        headers = timing_headers(outcome) | retry
        if outcome.receipt is not None:
            headers |= receipt_headers(outcome.receipt)
        # X-Accel-Buffering: a reverse proxy that buffers answers (nginx's default) passes this
        # one on event by event (deploy/nginx/paywire.conf turns buffering off anyway).
        return EventStream(sse(outcome.stream, outcome), outcome=outcome,
                           headers=headers | {"X-Accel-Buffering": "no"})
    response = render(outcome, payment_help=True)  # a 402 says how to pay where OpenAI's clients look
    response.headers.update(retry)
    return response


def json_model_route(gateway: Gateway, path: str, operation: str, max_body_bytes: int,
                     base_url: str) -> Route:
    """POST `path` with a JSON body naming a model: the model's `operation`, paid per call. An
    empty body without payment (`{}` or none: an indexer's probe) gets the route's quote."""
    route = model_route(gateway, path, operation)

    async def handle(request: Request) -> Response:
        body = await read_json_object(request, max_body_bytes)
        payment = payment_from(request.headers)
        if not body and payment is None:
            return respond(await gateway.quote_route(route, f"{base_url}{path}",
                                                     client_address(request)))
        if not body:  # a payment and no request: the pipeline says what it is for
            return await answer_call(gateway, CallRequest(
                skill_id="", payload={}, resource_url=f"{base_url}{path}", payment=payment,
                operation=operation, client=client_address(request), route=route))
        skill = model_skill(gateway, body, operation)
        req = CallRequest(
            skill_id=skill.id, skill=skill, payload=body, resource_url=f"{base_url}{path}",
            payment=payment, stream=body.get("stream") is True, operation=operation,
            client=client_address(request), route=route)
        return await answer_call(gateway, req)

    return Route(path, handle, methods=["POST"])
