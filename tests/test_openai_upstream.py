"""The OpenAI-compatible test upstream itself: shapes, streaming, knobs, and the official client."""

from __future__ import annotations

import base64
import io
import json
import struct
import threading
import time
import wave
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.openai_upstream import (
    CREATED,
    OpenAIUpstream,
    embedding_vector,
    reply_text,
    running_upstream,
    silent_mp3,
    tiny_png,
)


@pytest.fixture(scope="module")
def shared() -> Iterator[OpenAIUpstream]:
    with running_upstream("up1") as upstream:
        yield upstream


@pytest.fixture
def up(shared: OpenAIUpstream) -> OpenAIUpstream:
    shared.reset()
    return shared


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5) as client:
        yield client


@pytest.fixture
def client(up: OpenAIUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=up.url, api_key="sk-test", max_retries=0, timeout=5) as c:
        yield c


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "say hello please"}], **extra}


def sse_events(lines: Iterator[str]) -> list[Any]:
    """Data payloads of an SSE stream, [DONE] kept as the string."""
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert line == "", line
    return out


def assert_error(response: httpx.Response, status: int, param: str | None = None,
                 code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param and error["code"] == code
    return error


def small_wav(seconds: float = 0.25, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x01" * int(seconds * rate))
    return buf.getvalue()


# ---------------------------------------------------------------- shapes over plain HTTP

def test_chat_completion_shape(up: OpenAIUpstream, http: httpx.Client) -> None:
    r = http.post(f"{up.url}/chat/completions", json=chat_body(), headers={"Authorization": "Bearer k"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["object"] == "chat.completion" and body["id"] == "chatcmpl-up1-1"
    assert body["model"] == "gpt-4o-mini" and body["created"] == CREATED
    message = {"role": "assistant", "content": "Hello from up1. 1 2 3", "refusal": None, "annotations": []}
    assert body["choices"] == [{"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}]
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (5, 4, 9)
    [rec] = up.requests
    assert rec.method == "POST" and rec.path == "/v1/chat/completions" and rec.json == chat_body()
    assert rec.headers["authorization"] == "Bearer k" and rec.status == 200 and not rec.cancelled
    assert rec.finished_at is not None and rec.finished_at >= rec.received_at


def test_chat_max_tokens_n_and_chunks(up: OpenAIUpstream, http: httpx.Client) -> None:
    up.behaviour.chunks = 6
    body = http.post(f"{up.url}/chat/completions", json=chat_body(max_tokens=2, n=2)).json()
    assert [c["message"]["content"] for c in body["choices"]] == ["Hello from up1. 1"] * 2
    assert {c["finish_reason"] for c in body["choices"]} == {"length"}
    assert body["usage"]["completion_tokens"] == 4
    assert reply_text("up1", 6) == "Hello from up1. 1 2 3 4 5"


def test_chat_validation_errors(up: OpenAIUpstream, http: httpx.Client) -> None:
    url = f"{up.url}/chat/completions"
    assert_error(http.post(url, json={"model": "m"}), 400, "messages", "missing_required_parameter")
    assert_error(http.post(url, json={"model": "m", "messages": []}), 400, "messages", "empty_array")
    assert_error(http.post(url, json=chat_body(temperature=3)), 400, "temperature", "decimal_above_max_value")
    assert_error(http.post(url, json={"messages": [{"role": "user", "content": "x"}]}), 400)
    assert_error(http.post(url, content=b"{nope", headers={"content-type": "application/json"}), 400)
    assert_error(http.post(url, json=chat_body(stream_options={"include_usage": True})), 400,
                 "stream_options", "invalid_value")
    error = assert_error(http.post(f"{up.url}/nothing/here", json={}), 404)
    assert error["message"] == "Invalid URL (POST /v1/nothing/here)"
    up.behaviour.strict_models = True
    assert_error(http.post(url, json=chat_body(model="nope")), 404, None, "model_not_found")


def test_chat_stream_with_usage(up: OpenAIUpstream, http: httpx.Client) -> None:
    body = chat_body(stream=True, stream_options={"include_usage": True})
    with http.stream("POST", f"{up.url}/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    content = [c["choices"][0]["delta"]["content"] for c in chunks[1:5]]
    assert "".join(content) == reply_text("up1", 4) and len(content) == 4
    assert chunks[5]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 9
    assert up.stream_finished.is_set() and up.first_chunk_sent.is_set() and not up.cancelled.is_set()


def test_chat_stream_without_usage(up: OpenAIUpstream, http: httpx.Client) -> None:
    up.behaviour.chunks = 2
    with http.stream("POST", f"{up.url}/chat/completions", json=chat_body(stream=True)) as r:
        events = sse_events(r.iter_lines())
    assert len(events) == 5 and events[-1] == "[DONE]"  # role, 2 content, finish, [DONE]
    assert all("usage" not in e for e in events[:-1])


def test_completions_plain_and_stream(up: OpenAIUpstream, http: httpx.Client) -> None:
    body = http.post(f"{up.url}/completions", json={"model": "gpt-3.5-turbo-instruct", "prompt": "one two",
                                                    "echo": True}).json()
    assert body["object"] == "text_completion" and body["id"] == "cmpl-up1-1"
    assert body["choices"] == [{"text": "one two" + reply_text("up1", 4), "index": 0, "logprobs": None,
                                "finish_reason": "stop"}]
    assert body["usage"]["prompt_tokens"] == 2 and body["usage"]["completion_tokens"] == 4
    req = {"model": "gpt-3.5-turbo-instruct", "prompt": "hi", "stream": True,
           "stream_options": {"include_usage": True}}
    with http.stream("POST", f"{up.url}/completions", json=req) as r:
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]" and events[-2]["choices"] == [] and events[-2]["usage"]["total_tokens"] == 5
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == reply_text("up1", 4)
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    assert all(e["object"] == "text_completion" for e in events[:-1])


def test_embeddings_float_and_base64(up: OpenAIUpstream, http: httpx.Client) -> None:
    req = {"model": "text-embedding-3-small", "input": ["a cat", "a dog sat"], "dimensions": 8}
    body = http.post(f"{up.url}/embeddings", json=req).json()
    assert body["object"] == "list" and body["model"] == "text-embedding-3-small"
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", 0), ("embedding", 1)]
    assert body["data"][1]["embedding"] == embedding_vector("text-embedding-3-small", "a dog sat", 8)
    b64 = http.post(f"{up.url}/embeddings", json={**req, "encoding_format": "base64"}).json()
    raw = base64.b64decode(b64["data"][1]["embedding"])
    assert list(struct.unpack("<8f", raw)) == body["data"][1]["embedding"]
    assert_error(http.post(f"{up.url}/embeddings", json={"model": "m"}), 400, "input",
                 "missing_required_parameter")


@pytest.mark.parametrize(("fmt", "content_type", "magic"), [
    ("mp3", "audio/mpeg", b"\xff\xfb"), ("wav", "audio/wav", b"RIFF"), ("opus", "audio/opus", b"OggS"),
    ("aac", "audio/aac", b"\xff\xf1"), ("flac", "audio/flac", b"fLaC"), ("pcm", "audio/pcm", b"\x00\x00"),
])
def test_speech_formats(up: OpenAIUpstream, http: httpx.Client, fmt: str, content_type: str,
                        magic: bytes) -> None:
    r = http.post(f"{up.url}/audio/speech", json={"model": "tts-1", "input": "Fifteen chars!!",
                                                  "voice": "alloy", "response_format": fmt})
    assert r.status_code == 200 and r.headers["content-type"] == content_type
    assert r.content.startswith(magic)
    if fmt == "wav":
        with wave.open(io.BytesIO(r.content)) as w:
            assert w.getnframes() / w.getframerate() == 1.0  # 15 characters per second
    if fmt == "pcm":
        assert len(r.content) == 48000  # 1 s of 24 kHz 16-bit mono


def test_speech_validation(up: OpenAIUpstream, http: httpx.Client) -> None:
    url = f"{up.url}/audio/speech"
    assert http.post(url, json={"model": "tts-1", "input": "x", "voice": "alloy"}).headers["content-type"] \
        == "audio/mpeg"
    assert_error(http.post(url, json={"model": "tts-1", "voice": "alloy"}), 400, "input",
                 "missing_required_parameter")
    assert_error(http.post(url, json={"model": "tts-1", "input": "x", "voice": "alloy",
                                      "response_format": "ogg"}), 400, "response_format", "invalid_value")


def test_transcriptions_and_translations(up: OpenAIUpstream, http: httpx.Client) -> None:
    files = {"file": ("clip.wav", small_wav(0.5), "audio/wav")}
    r = http.post(f"{up.url}/audio/transcriptions", files=files, data={"model": "whisper-1"})
    assert r.json() == {"text": "Transcript by up1 of clip.wav: 0.50 seconds of audio.",
                        "usage": {"type": "duration", "seconds": 1}}
    rec = up.requests[-1]
    assert rec.form == {"model": "whisper-1"} and rec.file("file") is not None
    assert rec.file("file").filename == "clip.wav" and rec.file("file").data == small_wav(0.5)
    r = http.post(f"{up.url}/audio/transcriptions", files=files,
                  data={"model": "whisper-1", "response_format": "text"})
    assert r.headers["content-type"].startswith("text/plain") and r.text.startswith("Transcript by up1")
    verbose = http.post(f"{up.url}/audio/translations", files=files,
                        data={"model": "whisper-1", "response_format": "verbose_json"}).json()
    assert verbose["task"] == "translate" and verbose["duration"] == 0.5 and verbose["language"] == "english"
    assert verbose["text"].startswith("Translation by up1") and verbose["segments"][0]["end"] == 0.5
    r = http.post(f"{up.url}/audio/translations", files=files, data={"model": "whisper-1"})
    assert set(r.json()) == {"text"}
    assert_error(http.post(f"{up.url}/audio/transcriptions", files=files), 400)
    assert_error(http.post(f"{up.url}/audio/transcriptions", data={"model": "whisper-1"},
                           files={"other": ("x.txt", b"x")}), 400, "file", "missing_required_parameter")
    assert_error(http.post(f"{up.url}/audio/transcriptions", data={"model": "whisper-1"},
                           files={"file": ("x.txt", b"x")}), 400, "file", "invalid_value")


def test_images_generations_and_edits(up: OpenAIUpstream, http: httpx.Client) -> None:
    r = http.post(f"{up.url}/images/generations", json={"model": "dall-e-3", "prompt": "a red fox",
                                                        "size": "1024x1792"})
    body = r.json()
    assert body["created"] == CREATED and len(body["data"]) == 1
    assert body["data"][0]["revised_prompt"] == "a red fox (revised by up1)"
    image = http.get(body["data"][0]["url"])
    assert image.headers["content-type"] == "image/png" and image.content == tiny_png(
        "dall-e-3\0a red fox\x001024x1792\x000")
    b64 = http.post(f"{up.url}/images/generations", json={"model": "dall-e-2", "prompt": "x", "n": 3,
                                                          "response_format": "b64_json"}).json()
    assert len(b64["data"]) == 3 and all(base64.b64decode(d["b64_json"]).startswith(b"\x89PNG")
                                         for d in b64["data"])
    assert "revised_prompt" not in b64["data"][0]
    bad_size = http.post(f"{up.url}/images/generations",
                         json={"model": "dall-e-2", "prompt": "x", "size": "7x7"})
    assert_error(bad_size, 400, "size", "invalid_value")
    edit = http.post(f"{up.url}/images/edits",
                     files=[("image", ("in.png", tiny_png("in"), "image/png")),
                            ("mask", ("mask.png", tiny_png("mask"), "image/png"))],
                     data={"prompt": "add a hat", "n": "2", "response_format": "b64_json"}).json()
    assert len(edit["data"]) == 2 and "b64_json" in edit["data"][0]
    rec = up.requests[-1]
    assert [f.field for f in rec.files] == ["image", "mask"] and rec.form["prompt"] == "add a hat"
    assert_error(http.post(f"{up.url}/images/edits", data={"prompt": "p"},
                           files={"mask": ("m.png", tiny_png("m"), "image/png")}), 400, "image",
                 "missing_required_parameter")


def test_models(up: OpenAIUpstream, http: httpx.Client) -> None:
    up.behaviour.models = ["m-1", "m-2"]
    assert http.get(f"{up.url}/models").json() == {"object": "list", "data": [
        {"id": "m-1", "object": "model", "created": CREATED, "owned_by": "up1"},
        {"id": "m-2", "object": "model", "created": CREATED, "owned_by": "up1"}]}
    assert http.get(f"{up.url}/models/m-2").json()["id"] == "m-2"
    assert_error(http.get(f"{up.url}/models/m-3"), 404, "model", "model_not_found")


def test_elevenlabs_sound_generation(up: OpenAIUpstream, http: httpx.Client) -> None:
    up.behaviour.require_key = "xi-secret"
    url = f"{up.root_url}/v1/sound-generation"
    req = {"text": "door creaks open", "duration_seconds": 1.5, "prompt_influence": 0.5}
    r = http.post(url, json=req, headers={"xi-api-key": "xi-secret"})
    assert r.status_code == 200 and r.headers["content-type"] == "audio/mpeg"
    assert r.content == silent_mp3(1.5) and len(r.content) == 58 * 417  # ceil(1.5 * 44100 / 1152) frames
    assert up.requests[-1].json == req and up.requests[-1].headers["xi-api-key"] == "xi-secret"
    pcm = http.post(url, params={"output_format": "pcm_16000"}, json={"text": "rain"},
                    headers={"xi-api-key": "xi-secret"})
    assert pcm.headers["content-type"] == "audio/pcm" and len(pcm.content) == 2 * 16000 * 2  # auto: 2 s
    missing = http.post(url, json={"duration_seconds": 1}, headers={"xi-api-key": "xi-secret"})
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["body", "text"]
    long = http.post(url, json={"text": "x", "duration_seconds": 31}, headers={"xi-api-key": "xi-secret"})
    assert long.status_code == 422 and long.json()["detail"][0]["loc"] == ["body", "duration_seconds"]
    assert http.post(url, json=req).json() == {"detail": {
        "status": "needs_authorization",
        "message": "Neither authorization header nor xi-api-key received, please provide one."}}
    wrong = http.post(url, json=req, headers={"xi-api-key": "nope"})
    assert wrong.status_code == 401 and wrong.json()["detail"]["status"] == "invalid_api_key"
    up.behaviour.fail(500)
    failed = http.post(url, json=req, headers={"xi-api-key": "xi-secret"})
    assert failed.status_code == 500 and failed.json()["detail"]["status"] == "internal_server_error"


# ---------------------------------------------------------------- knobs

def test_require_key(up: OpenAIUpstream, http: httpx.Client) -> None:
    up.behaviour.require_key = "sk-right"
    url = f"{up.url}/chat/completions"
    assert_error(http.post(url, json=chat_body()), 401)
    assert_error(http.post(url, json=chat_body(), headers={"Authorization": "Bearer sk-wrong"}), 401, None,
                 "invalid_api_key")
    assert http.post(url, json=chat_body(), headers={"Authorization": "Bearer sk-right"}).status_code == 200


def test_fail_next_then_serve(up: OpenAIUpstream, http: httpx.Client) -> None:
    up.behaviour.fail_next = [500, 429]
    up.behaviour.fail(400)
    url = f"{up.url}/chat/completions"
    assert assert_error(http.post(url, json=chat_body()), 500)["type"] == "server_error"
    limited = assert_error(http.post(url, json=chat_body()), 429, None, "rate_limit_exceeded")
    assert limited["type"] == "requests"
    assert_error(http.post(url, json=chat_body()), 400)
    assert http.post(url, json=chat_body()).status_code == 200
    assert [r.status for r in up.requests] == [500, 429, 400, 200]


def test_malformed_next(up: OpenAIUpstream, http: httpx.Client) -> None:
    up.behaviour.malformed_next = 1
    r = http.post(f"{up.url}/chat/completions", json=chat_body())
    assert r.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        r.json()
    assert http.post(f"{up.url}/chat/completions", json=chat_body()).json()["object"] == "chat.completion"


def test_hang_times_out_and_client_leaving_is_seen(up: OpenAIUpstream) -> None:
    up.behaviour.hang = True
    with httpx.Client(timeout=0.3) as slow, pytest.raises(httpx.ReadTimeout):
        slow.post(f"{up.url}/chat/completions", json=chat_body())
    assert up.wait_for_requests(1)[0].status is None
    assert up.cancelled.wait(2)  # the timed-out client closed its connection: the handler was cancelled
    assert up.requests[0].cancelled


def test_gate_holds_the_rest_of_the_stream(up: OpenAIUpstream, http: httpx.Client) -> None:
    gate = threading.Event()
    up.behaviour.gate = gate
    body = chat_body(stream=True, stream_options={"include_usage": True})
    with http.stream("POST", f"{up.url}/chat/completions", json=body) as r:
        lines = r.iter_lines()
        received: list[Any] = []
        while not any(e != "[DONE]" and e["choices"] and e["choices"][0]["delta"].get("content")
                      for e in received):
            received += sse_events(iter([next(lines)]))
        first_content_at = time.monotonic()
        assert not up.stream_finished.is_set() and up.requests[-1].finished_at is None
        gate_set_at = time.monotonic()
        gate.set()
        rest = sse_events(lines)
        done_at = time.monotonic()
    assert received[-1]["choices"][0]["delta"]["content"] == "Hello from up1."
    assert rest[-1] == "[DONE]" and up.stream_finished.wait(2)
    assert first_content_at <= gate_set_at <= up.requests[-1].finished_at <= done_at


def test_client_closing_mid_stream_sets_cancelled(up: OpenAIUpstream, http: httpx.Client) -> None:
    up.behaviour.gate = threading.Event()  # never set: the stream stays open after its first chunk
    with http.stream("POST", f"{up.url}/chat/completions", json=chat_body(stream=True)) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")  # the role chunk
        assert up.first_chunk_sent.wait(2)
    assert up.cancelled.wait(2)
    assert up.requests[-1].cancelled and up.requests[-1].status is None
    assert not up.stream_finished.is_set()


def test_chunk_delay_paces_the_stream(up: OpenAIUpstream, http: httpx.Client) -> None:
    up.behaviour.chunk_delay = 0.05
    up.behaviour.chunks = 3
    arrivals: list[float] = []
    with http.stream("POST", f"{up.url}/chat/completions", json=chat_body(stream=True)) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                arrivals.append(time.monotonic())
    assert len(arrivals) == 3, arrivals
    # the last chunk cannot arrive before the server slept twice (client-side gaps could be squeezed)
    assert arrivals[-1] - up.requests[-1].received_at >= 0.1


def test_break_after_drops_the_stream(up: OpenAIUpstream, http: httpx.Client) -> None:
    up.behaviour.break_after = 2
    got: list[str] = []
    with pytest.raises(httpx.RemoteProtocolError), \
            http.stream("POST", f"{up.url}/chat/completions", json=chat_body(stream=True)) as r:
        got.extend(line for line in r.iter_lines() if line)
    assert len(got) == 3  # role + 2 content chunks, no finish, no [DONE]
    assert not up.stream_finished.is_set() and not up.cancelled.is_set()


def test_reset_and_stop() -> None:
    outcome: list[BaseException] = []

    def hung_call(url: str) -> None:
        try:
            httpx.get(f"{url}/models", timeout=5)
        except httpx.HTTPError as exc:
            outcome.append(exc)

    with OpenAIUpstream("solo") as upstream:
        upstream.behaviour.fail_next = [503]
        upstream.behaviour.chunks = 9
        assert httpx.get(f"{upstream.url}/models").status_code == 503
        upstream.reset()
        assert upstream.requests == [] and upstream.behaviour.fail_next == []
        assert upstream.behaviour.chunks == 4
        upstream.behaviour.hang = True
        caller = threading.Thread(target=hung_call, args=(upstream.url,))
        caller.start()
        upstream.wait_for_requests(1)
        url = upstream.url
    caller.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], httpx.RemoteProtocolError)  # dropped at stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/models", timeout=1)


# ---------------------------------------------------------------- the official openai client

def test_openai_client_chat_and_stream(up: OpenAIUpstream, client: openai.OpenAI) -> None:
    done = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    assert done.choices[0].message.content == reply_text("up1", 4) and done.usage is not None
    assert done.usage.completion_tokens == 4
    stream = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}],
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == reply_text("up1", 4)
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 5
    assert up.requests[-1].headers["authorization"] == "Bearer sk-test"


def test_openai_client_completions_and_embeddings(up: OpenAIUpstream, client: openai.OpenAI) -> None:
    completion = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="say hi", max_tokens=2)
    assert completion.choices[0].text == "Hello from up1. 1"
    assert completion.choices[0].finish_reason == "length"
    embedded = client.embeddings.create(model="text-embedding-3-small", input="a cat", dimensions=8)
    assert up.requests[-1].json["encoding_format"] == "base64"  # the client asks for base64 and decodes it
    assert embedded.data[0].embedding == embedding_vector("text-embedding-3-small", "a cat", 8)
    assert embedded.usage.prompt_tokens == 2


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # openai 3.x marks translations so
def test_openai_client_audio(up: OpenAIUpstream, client: openai.OpenAI) -> None:
    speech = client.audio.speech.create(model="tts-1", voice="alloy", input="hello there",
                                        response_format="wav")
    assert speech.response.headers["content-type"] == "audio/wav" and speech.content.startswith(b"RIFF")
    transcript = client.audio.transcriptions.create(model="whisper-1", file=("hello.wav", small_wav(0.25)))
    assert transcript.text == "Transcript by up1 of hello.wav: 0.25 seconds of audio."
    rec = up.requests[-1]
    assert rec.form["model"] == "whisper-1" and rec.file("file").data == small_wav(0.25)
    translation = client.audio.translations.create(model="whisper-1", file=("hola.wav", small_wav(0.25)))
    assert translation.text.startswith("Translation by up1 of hola.wav")


def test_openai_client_images_models_and_errors(up: OpenAIUpstream, client: openai.OpenAI) -> None:
    generated = client.images.generate(model="dall-e-2", prompt="a boat", n=2, response_format="b64_json")
    assert generated.data is not None and len(generated.data) == 2
    assert base64.b64decode(generated.data[0].b64_json or "").startswith(b"\x89PNG")
    edited = client.images.edit(image=("in.png", tiny_png("in"), "image/png"), prompt="add a sail")
    assert edited.data is not None and edited.data[0].url is not None
    assert [m.id for m in client.models.list()] == list(up.behaviour.models)
    up.behaviour.fail(400, 429, 500)
    with pytest.raises(openai.BadRequestError):
        client.models.list()
    with pytest.raises(openai.RateLimitError):
        client.models.list()
    with pytest.raises(openai.InternalServerError) as failed:
        client.models.list()
    assert failed.value.body == {"message": failed.value.body["message"], "type": "server_error",  # type: ignore[index]
                                 "param": None, "code": None}
