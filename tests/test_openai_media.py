"""Audio and image routes: the official `openai` package (and an x402-wrapped httpx client for
/v1/audio/generations) paying on the devnet against the OpenAI-compatible + ElevenLabs test upstream;
quotes recomputed with the operations' own quote functions; the duration reader on real and built files;
validation, upload limits and upstream failures (none of them charged)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import os
import struct
import wave
import zlib
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest
from eth_account import Account
from openai import AsyncOpenAI, BadRequestError
from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport
from x402.mechanisms.evm.exact import register_exact_evm_client
from x402.mechanisms.evm.signers import EthAccountSigner

from compat.openai_media import FormError, form_payload, parse_multipart
from payments.money import usd_to_atomic
from skills.errors import UpstreamError, UpstreamTimeout
from skills.models.audio_duration import audio_duration
from skills.models.catalog import load_catalog
from skills.models.image_tokens import MAX_IMAGE_TOKENS, image_dimensions, image_tokens
from skills.models.media_ops import (
    FACTORIES,
    UploadedFile,
    generation_price,
    image_price,
    speech_price,
    transcription_price,
)
from skills.models.upstream import Target, UpstreamClient
from tests.support.live_server import LiveServer, start_server
from tests.support.openai_upstream import (
    OpenAIUpstream,
    silent_mp3,
    speech_audio,
    speech_seconds,
    tiny_png,
)

KEY = "k"
SPEAK = "Paywire sells every model per call."
CATALOG = load_catalog()


class Env:
    def __init__(self, gateway: LiveServer, upstream: OpenAIUpstream) -> None:
        self.gateway, self.upstream = gateway, upstream

    def earned(self, before: int) -> int:
        return self.gateway.devnet.merchant_balances().evm - before

    def balance(self) -> int:
        return self.gateway.devnet.merchant_balances().evm


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """(Overrides tests/support/model_env's `env`: this gateway also has an ElevenLabs upstream.)"""
    upstream = OpenAIUpstream("openai").start()
    gateway = start_server(tmp_path_factory.mktemp("media"), env={
        "OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": KEY,
        "ELEVENLABS_BASE_URL": upstream.root_url, "ELEVENLABS_API_KEY": KEY,
    })
    yield Env(gateway, upstream)
    gateway.stop()
    upstream.stop()


@pytest.fixture(autouse=True)
def _reset(env: Env) -> None:
    env.upstream.reset()
    env.upstream.behaviour.require_key = KEY  # OpenAI routes check Bearer, ElevenLabs xi-api-key


def wav(seconds: float, rate: int = 8000, width: int = 1) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(bytes(width * round(seconds * rate)))
    return buf.getvalue()


def _payer(env: Env) -> x402Client:
    payer = x402Client()
    register_exact_evm_client(payer, EthAccountSigner(Account.from_key(env.gateway.devnet.keys.evm_payer)))
    return payer


def _openai(env: Env) -> AsyncOpenAI:
    http = httpx.AsyncClient(transport=x402AsyncTransport(_payer(env)), timeout=30)
    return AsyncOpenAI(base_url=f"{env.gateway.url}/v1", api_key="not-needed", http_client=http,
                       max_retries=0)


def _paid(env: Env, path: str, **kwargs: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=x402AsyncTransport(_payer(env)), timeout=30) as http:
            response = await http.post(f"{env.gateway.url}{path}", **kwargs)
            await response.aread()
            return response

    return asyncio.run(go())


def _atomic(quote: Any, body: dict[str, Any]) -> int:
    return usd_to_atomic(Decimal(quote(body, CATALOG.models[body["model"]])))


def _last_usage(env: Env, model: str) -> dict[str, Any]:
    rows = env.gateway.ledger_rows(skill_id=model, state="settled")
    return rows[-1]["usage"]


def _quoted(response: httpx.Response) -> int:
    assert response.status_code == 402, response.text
    return int(response.json()["accepts"][0]["maxAmountRequired"])


# ------------------------------------------------------------------------------------------ paid calls


def test_speech_answers_raw_audio_and_charges_per_character(env: Env) -> None:
    before = env.balance()

    async def go() -> tuple[bytes, str, bytes, str]:
        async with _openai(env) as client:
            mp3 = await client.audio.speech.create(model="tts-1", voice="alloy", input=SPEAK)
            wav_ = await client.audio.speech.create(model="tts-1-hd", voice="nova", input=SPEAK,
                                                    response_format="wav", speed=2.0)
            return mp3.content, mp3.response.headers["content-type"], wav_.content, \
                wav_.response.headers["content-type"]

    mp3, mp3_type, wav_, wav_type = asyncio.run(go())
    assert mp3 == speech_audio("mp3", speech_seconds(SPEAK)) and mp3_type == "audio/mpeg"
    assert wav_ == speech_audio("wav", speech_seconds(SPEAK) / 2) and wav_type == "audio/wav"
    expected = (_atomic(speech_price, {"model": "tts-1", "input": SPEAK})
                + _atomic(speech_price, {"model": "tts-1-hd", "input": SPEAK}))
    assert env.earned(before) == expected
    forwarded = env.upstream.requests_to("/audio/speech")
    assert [r.json["model"] for r in forwarded] == ["tts-1", "tts-1-hd"]
    assert forwarded[1].json["speed"] == 2.0 and forwarded[1].json["response_format"] == "wav"
    usage = _last_usage(env, "tts-1-hd")
    assert usage["characters"] == len(SPEAK) and usage["provider"] == "openai"


def test_transcription_is_priced_by_the_duration_read_from_the_file(env: Env) -> None:
    audio = wav(36.0)  # long enough to cost more than the route's minimum
    before = env.balance()

    async def go() -> tuple[str, str]:
        async with _openai(env) as client:
            plain = await client.audio.transcriptions.create(
                model="whisper-1", file=("memo.wav", audio, "audio/wav"), language="en", temperature=0.2)
            text = await client.audio.transcriptions.create(
                model="whisper-1", file=("memo.wav", audio, "audio/wav"), response_format="text")
            return plain.text, text

    plain, text = asyncio.run(go())
    assert plain == "Transcript by openai of memo.wav: 36.00 seconds of audio."
    assert text.strip() == plain
    body = {"model": "whisper-1", "file": UploadedFile(audio, "memo.wav")}
    assert _atomic(transcription_price, body) == usd_to_atomic(Decimal("0.006") * 36 / 60)
    assert env.earned(before) == 2 * _atomic(transcription_price, body)
    [first, _] = env.upstream.requests_to("/audio/transcriptions")
    upload = first.file("file")
    assert upload is not None and upload.data == audio and upload.filename == "memo.wav"
    assert first.form["model"] == "whisper-1" and first.form["language"] == "en"
    assert float(first.form["temperature"]) == 0.2
    assert first.headers["authorization"] == f"Bearer {KEY}"
    usage = _last_usage(env, "whisper-1")
    assert usage["audio_seconds"] == 36.0

    # the quote follows the duration: twice the audio, twice the price (MP3 frames counted too)
    def quote(data: bytes, name: str) -> int:
        return _quoted(httpx.post(f"{env.gateway.url}/v1/audio/transcriptions",
                                  data={"model": "whisper-1"}, files={"file": (name, data)}))

    assert quote(wav(72.0), "long.wav") == 2 * quote(audio, "memo.wav")
    mp3 = silent_mp3(60.0)
    mp3_seconds = Decimal(math.ceil(60.0 * 44100 / 1152) * 1152) / 44100
    assert quote(mp3, "a.mp3") == usd_to_atomic(Decimal("0.006") * mp3_seconds / 60)


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the openai package's marker
def test_translation_into_english(env: Env) -> None:
    audio = wav(48.0)
    before = env.balance()

    async def go() -> str:
        async with _openai(env) as client:
            answer = await client.audio.translations.create(model="whisper-1",
                                                            file=("hola.wav", audio, "audio/wav"))
            return answer.text

    assert asyncio.run(go()) == "Translation by openai of hola.wav: 48.00 seconds of audio."
    body = {"model": "whisper-1", "file": UploadedFile(audio)}
    assert env.earned(before) == _atomic(transcription_price, body)
    assert env.upstream.requests_to("/audio/translations")[0].form["model"] == "whisper-1"


def test_image_generation_is_priced_per_image_by_size_and_quality(env: Env) -> None:
    before = env.balance()

    async def go() -> tuple[Any, Any]:
        async with _openai(env) as client:
            hd = await client.images.generate(model="dall-e-3", prompt="a lighthouse", size="1024x1792",
                                              quality="hd")
            small = await client.images.generate(model="dall-e-2", prompt="a lighthouse", n=3,
                                                 size="256x256", response_format="b64_json")
            return hd, small

    hd, small = asyncio.run(go())
    assert hd.data[0].url and hd.data[0].revised_prompt
    assert [base64.b64decode(d.b64_json or "") for d in small.data] == [
        tiny_png(f"dall-e-2\x00a lighthouse\x00256x256\x00{i}") for i in range(3)]
    expected = (_atomic(image_price, {"model": "dall-e-3", "size": "1024x1792", "quality": "hd"})
                + _atomic(image_price, {"model": "dall-e-2", "size": "256x256", "n": 3}))
    assert expected == usd_to_atomic(Decimal("0.120")) + usd_to_atomic(Decimal("0.016") * 3)
    assert env.earned(before) == expected
    assert _last_usage(env, "dall-e-2")["images"] == 3


def test_image_edit_with_mask_and_with_several_images(env: Env) -> None:
    png, mask = tiny_png("in"), tiny_png("mask")
    before = env.balance()

    async def go() -> tuple[Any, Any]:
        async with _openai(env) as client:
            edited = await client.images.edit(model="dall-e-2", image=("in.png", png, "image/png"),
                                              mask=("mask.png", mask, "image/png"), prompt="add a boat",
                                              n=2, size="512x512")
            merged = await client.images.edit(model="gpt-image-1", prompt="merge them", quality="low",
                                              size="1024x1024", image=[("a.png", png, "image/png"),
                                                                       ("b.png", mask, "image/png")])
            return edited, merged

    edited, merged = asyncio.run(go())
    assert len(edited.data) == 2 and len(merged.data) == 1 and merged.usage is not None
    first, second = env.upstream.requests_to("/images/edits")
    assert [f.field for f in first.files] == ["image", "mask"] and first.form["n"] == "2"
    assert first.file("image").data == png and first.file("mask").data == mask  # type: ignore[union-attr]
    assert [f.field for f in second.files] == ["image[]", "image[]"]
    assert second.form["model"] == "gpt-image-1" and second.form["quality"] == "low"
    # gpt-image-1 bills its input too: the prompt's text tokens and each 2x2 image's 194 tokens
    merged_body = {"model": "gpt-image-1", "size": "1024x1024", "quality": "low", "prompt": "merge them",
                   "image": [UploadedFile(png, "a.png"), UploadedFile(mask, "b.png")]}
    expected = (_atomic(image_price, {"model": "dall-e-2", "size": "512x512", "n": 2})
                + _atomic(image_price, merged_body))
    assert _atomic(image_price, merged_body) > _atomic(image_price, {**merged_body, "image": None}) + 380 * 10
    assert env.earned(before) == expected
    assert _last_usage(env, "gpt-image-1")["output_tokens"] == 1056  # the upstream's own usage report


def test_audio_generation_on_elevenlabs(env: Env) -> None:
    model = "elevenlabs/sound-effects"
    before = env.balance()
    timed = _paid(env, "/v1/audio/generations",
                  json={"model": model, "prompt": "rain on a tin roof", "duration_seconds": 4})
    assert timed.status_code == 200, timed.text
    assert timed.headers["content-type"] == "audio/mpeg" and timed.content == silent_mp3(4.0)
    assert timed.headers.get("PAYMENT-RESPONSE")
    auto = _paid(env, "/v1/audio/generations", json={"model": model, "prompt": "a door creaks",
                                                     "prompt_influence": 0.7, "loop": False})
    assert auto.status_code == 200 and auto.content == silent_mp3(2.0)  # the provider picked 2 s
    expected = (_atomic(generation_price, {"model": model, "duration_seconds": 4})
                + _atomic(generation_price, {"model": model}))
    assert expected == usd_to_atomic(Decimal("0.008")) + usd_to_atomic(Decimal("0.01"))
    assert env.earned(before) == expected
    first, second = env.upstream.requests_to("/sound-generation")
    assert first.headers["xi-api-key"] == KEY and "authorization" not in first.headers
    assert first.query["output_format"] == "mp3_44100_128"
    assert first.json["text"] == "rain on a tin roof" and first.json["duration_seconds"] == 4
    assert first.json["model_id"] == "eleven_text_to_sound_v2"
    assert second.json["prompt_influence"] == 0.7 and "duration_seconds" not in second.json
    usage = _last_usage(env, model)
    assert usage["provider"] == "elevenlabs" and usage["audio_seconds"] == pytest.approx(2.0, abs=0.03)


# ------------------------------------------------------------------------------------------ refusals


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")
def test_unreadable_audio_is_refused_before_any_quote(env: Env) -> None:
    for name, data in (("noise.mp3", os.urandom(20_000)), ("empty.wav", wav(0.0)), ("x.wav", b"RIFF")):
        r = httpx.post(f"{env.gateway.url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                       files={"file": (name, data, "audio/mpeg")})
        assert r.status_code == 400 and "PAYMENT-REQUIRED" not in r.headers, r.text
        assert r.json()["error"]["param"] == "file" and "duration" in r.json()["error"]["message"]

    async def go() -> None:
        async with _openai(env) as client:
            await client.audio.translations.create(model="whisper-1", file=("n.ogg", b"OggS" + bytes(60)))

    with pytest.raises(BadRequestError) as refused:
        asyncio.run(go())
    assert refused.value.body["param"] == "file"  # type: ignore[index]
    assert env.upstream.requests == []


def test_oversized_upload_is_413(env: Env) -> None:
    async def go() -> bytes:
        # declared size over 25 MB: refused from the headers, before the body is read
        reader, writer = await asyncio.open_connection("127.0.0.1", int(env.gateway.url.rsplit(":", 1)[1]))
        writer.write(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Type: multipart/form-data; boundary=b\r\n"
                     + f"Content-Length: {25 * 1024 * 1024 + 1}\r\n\r\n".encode() + b"--b\r\n")
        await writer.drain()
        answer = await reader.read()
        writer.close()
        return answer

    head, _, body = asyncio.run(go()).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert json.loads(body)["error"]["param"] == "file"
    # a body that really is larger (chunked: no declared length) is cut off at the limit too; only one
    # small chunk past it, so the client has sent everything by the time the gateway answers
    chunk = bytes(64 * 1024)
    r = httpx.post(f"{env.gateway.url}/v1/images/edits", content=iter([chunk] * (25 * 16 + 1)),
                   headers={"Content-Type": "multipart/form-data; boundary=b"})
    assert r.status_code == 413 and r.json()["error"]["param"] == "image"


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/audio/speech", {"model": "tts-1", "voice": "alloy"}, "input"),
    ("/v1/audio/speech", {"model": "tts-1", "input": "hi"}, "voice"),
    ("/v1/audio/speech", {"model": "tts-1", "input": "hi", "voice": "alloy", "response_format": "ogg"},
     "response_format"),
    ("/v1/audio/speech", {"model": "tts-1", "input": "hi", "voice": "alloy", "speed": 9}, "speed"),
    ("/v1/audio/speech", {"model": "tts-1", "input": "x" * 4097, "voice": "alloy"}, "input"),
    ("/v1/audio/speech", {"model": "whisper-1", "input": "hi", "voice": "alloy"}, "model"),
    ("/v1/audio/generations", {"model": "elevenlabs/sound-effects"}, "prompt"),
    ("/v1/audio/generations", {"model": "elevenlabs/sound-effects", "prompt": "x", "duration_seconds": 31},
     "duration_seconds"),
    ("/v1/audio/generations", {"model": "elevenlabs/sound-effects", "prompt": "x", "prompt_influence": 2},
     "prompt_influence"),
    ("/v1/images/generations", {"model": "dall-e-2"}, "prompt"),
    ("/v1/images/generations", {"model": "dall-e-2", "prompt": "x", "n": 11}, "n"),
    ("/v1/images/generations", {"model": "dall-e-2", "prompt": "x", "size": "999x999"}, "size"),
    ("/v1/images/generations", {"model": "dall-e-3", "prompt": "x", "quality": "ultra"}, "quality"),
    ("/v1/images/generations", {"model": "dall-e-2", "prompt": "x", "response_format": "png"},
     "response_format"),
    ("/v1/images/generations", {"model": "dall-e-2", "prompt": "x", "stream": True}, "stream"),
])
def test_bad_json_fields_are_refused_before_any_quote(env: Env, path: str, body: dict, param: str) -> None:
    r = httpx.post(f"{env.gateway.url}{path}", json=body)
    assert r.status_code == 400 and "PAYMENT-REQUIRED" not in r.headers, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize(("path", "fields", "files", "param"), [
    ("/v1/audio/transcriptions", {"model": "whisper-1"}, {}, "file"),
    ("/v1/audio/transcriptions", {"model": "whisper-1", "file": "not a file"}, {}, "file"),
    ("/v1/audio/transcriptions", {"model": "whisper-1", "temperature": "warm"}, {"file": wav(1)},
     "temperature"),
    ("/v1/audio/transcriptions", {"model": "whisper-1", "temperature": "3"}, {"file": wav(1)},
     "temperature"),
    ("/v1/audio/transcriptions", {"model": "whisper-1", "response_format": "mp3"}, {"file": wav(1)},
     "response_format"),
    ("/v1/audio/transcriptions", {}, {"file": wav(1)}, "model"),
    ("/v1/audio/translations", {"model": "whisper-1", "stream": "true"}, {"file": wav(1)}, "stream"),
    ("/v1/audio/translations", {"model": "gpt-4o-transcribe"}, {"file": wav(1)}, "model"),
    ("/v1/images/edits", {"model": "dall-e-2", "prompt": "x"}, {}, "image"),
    ("/v1/images/edits", {"model": "dall-e-2", "prompt": "x", "n": "two"}, {"image": tiny_png("a")}, "n"),
    ("/v1/images/edits", {"model": "dall-e-2"}, {"image": tiny_png("a")}, "prompt"),
    ("/v1/images/edits", {"model": "dall-e-2", "prompt": "x", "size": "1x1"}, {"image": tiny_png("a")},
     "size"),
])
def test_bad_form_fields_are_refused_before_any_quote(env: Env, path: str, fields: dict, files: dict,
                                                      param: str) -> None:
    r = httpx.post(f"{env.gateway.url}{path}", data=fields,
                   files={k: ("f.bin", v) for k, v in files.items()} or {"unrelated": ("u", b"u")})
    assert r.status_code == 400 and "PAYMENT-REQUIRED" not in r.headers, r.text
    assert r.json()["error"]["param"] == param


def test_images_name_dall_e_2_when_no_model_is_given_as_openai_does(env: Env) -> None:
    r = httpx.post(f"{env.gateway.url}/v1/images/generations", json={"prompt": "a fox"})
    assert _quoted(r) == _atomic(image_price, {"model": "dall-e-2"}) == usd_to_atomic(Decimal("0.020"))
    r = httpx.post(f"{env.gateway.url}/v1/images/edits", data={"prompt": "a fox", "size": "256x256"},
                   files={"image": ("a.png", tiny_png("a"), "image/png")})
    assert _quoted(r) == usd_to_atomic(Decimal("0.016"))


def test_a_form_route_wants_multipart(env: Env) -> None:
    r = httpx.post(f"{env.gateway.url}/v1/audio/transcriptions", json={"model": "whisper-1"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_content_type"
    r = httpx.post(f"{env.gateway.url}/v1/audio/transcriptions", content=b"--b\r\nno headers",
                   headers={"Content-Type": "multipart/form-data; boundary=b"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_form"


# ------------------------------------------------------------------------------------------ upstream failures


def test_upstream_refusal_is_a_400_with_its_message_and_free(env: Env) -> None:
    env.upstream.behaviour.fail(400)
    before = env.balance()
    r = _paid(env, "/v1/audio/transcriptions", data={"model": "whisper-1"},
              files={"file": ("a.wav", wav(30.0))})
    assert r.status_code == 400 and "Bad request (injected" in r.json()["error"]["message"]
    assert "nothing was charged" in r.json()["error"]["message"]
    env.upstream.behaviour.require_key = "another key"  # ElevenLabs' own 401 is paywire's key problem
    r = _paid(env, "/v1/audio/generations", json={"model": "elevenlabs/sound-effects", "prompt": "x"})
    assert r.status_code == 502 and r.headers["x-should-retry"] == "false"
    assert env.balance() == before


def test_upstream_failures_are_502_and_free(env: Env) -> None:
    before = env.balance()
    env.upstream.behaviour.fail(500, 503)  # the first try and its retry
    r = _paid(env, "/v1/images/edits", data={"model": "dall-e-2", "prompt": "x"},
              files={"image": ("a.png", tiny_png("a"), "image/png")})
    assert r.status_code == 502 and r.headers["x-should-retry"] == "false", r.text
    env.upstream.behaviour.fail(502, 502)
    r = _paid(env, "/v1/audio/speech", json={"model": "tts-1", "input": "hi", "voice": "alloy"})
    assert r.status_code == 502
    env.upstream.behaviour.malformed_next = 1  # a 200 whose body is not JSON
    r = _paid(env, "/v1/images/generations", json={"model": "dall-e-2", "prompt": "x"})
    assert r.status_code == 502
    assert env.balance() == before
    # a failure then a success on the retry: served, charged once (the form is sent again whole)
    env.upstream.behaviour.fail(503)
    r = _paid(env, "/v1/audio/transcriptions", data={"model": "whisper-1"},
              files={"file": ("a.wav", wav(30.0))})
    assert r.status_code == 200, r.text
    sent = env.upstream.requests_to("/audio/transcriptions")
    assert sent[-1].file("file").data == sent[-2].file("file").data == wav(30.0)  # type: ignore[union-attr]
    assert env.earned(before) == _atomic(transcription_price, {"model": "whisper-1",
                                                                "file": UploadedFile(wav(30.0))})


def test_upstream_timeout_is_504(env: Env) -> None:
    """At the operation itself, with a short read timeout (the gateway's own is minutes long)."""
    spec = CATALOG.models["elevenlabs/sound-effects"]
    target = Target("elevenlabs", env.upstream.root_url, "eleven_text_to_sound_v2", KEY)
    client = UpstreamClient(read_timeout=0.2, retries_per_upstream=0)
    op = FACTORIES["audio.generations"](spec, (target,), client)
    env.upstream.behaviour.delay = 1.0

    async def go() -> None:
        try:
            await op.run({"model": spec.id, "prompt": "thunder"})
        finally:
            await client.aclose()

    with pytest.raises(UpstreamError) as failed:
        asyncio.run(go())
    assert isinstance(failed.value, UpstreamTimeout)  # the pipeline answers 504


# ------------------------------------------------------------------------------------------ durations

# A real file: LAME VBR at 8 kHz (MPEG-2.5 layer III) with an ID3v2 tag and a Xing header frame; ffprobe
# reads 1.512 s.
LAME_VBR_MP3 = zlib.decompress(base64.b64decode(
    "eNrFln9MG2UYx5+746A5phQspP5Kq6umU4NV1DKZstNWfgRCYSvWGKFlDHGbuBgjW7bQW8G265IJhplC/OOyzATrjGbLTMxGKUtJ"
    "yVwBWZg/JtBSGdE/3NWYABN6vu+a4RJ3tOoffv655y7v+32f7/M+995VGIoyALNx+7ZtRnTNAaCqbO+2PL258El94RM6HfyFGCsO"
    "rN1Y3mh7PTke8gFke8GAMGNew7Rg2hDtGA7jxvQg+jDHMT7MacRZTBBzETOFmMZcxSxiRAReFyW3AyVXpL8lMdBk1CYD2d7mz/I6"
    "4J8hxixBeED40GuvAYK50jbL0dcOzCwO/lxZ1/vxJhT5V+d2Pv9q6GR16ORXp6d4yNq3zy7ChrgqkSkuRVQrVOnKFmKWU4qCkNUB"
    "O8QQVwKgExBY/m9Bhi0ajUbwk1uDGK5trsvl+gNAlXiOl1NdBMiJQASZWpBVbS6dn2wePWLvfrCZlsseeoo6qq7VbLnzRE+WWz6Y"
    "q3kxuih2dTOcgiXKmRcGnhHFztZRo+x4brOhJ8c1u2zabsinDWVD14frLlSx1cYivLe+FIBMAxSq+8RPG45WmNemmdMCLgAs+fQ/"
    "tscPP5KcKsa0wUsFfS1f7u81QRrLr6XhBhUd8Pi7dqWd+dpU5jGgFsiBE+HbZC/GlMFJqtxx1YZSXd8LLsTcgMoY3ymhM0GOer4J"
    "QINtfR0G6UQmji2X+W5jBeuMkSYP6jBLUypjHlAV0/dX9EvqtDp/sUK9NfUGX+v8vWZMSmec5D2XrWCxptEp8/ynv70vqeN2zqSh"
    "g3ZiOeJ96eKURJ3DpNoZ5aG+KVX3oZ45WGgUTkn7cmJftjTqvIlu1O6SrDOX2hcwOqCiXGBRqJTyNUaWO79H/WNNw9c71Ki/QLI+"
    "2mT/pNJBvoxZ9Z2VEr7CpC5ZZ2lT2USEEMXVDhsQ5LSZ4nJ5U7GCAbB/cP6uI3eXJPpvvhdzqA9tux8PQ8jK7uk75OrceM5yfiEQ"
    "9gWYTPvSdzTZzRnuKBVHtu65JyeDVQv7RY4CDhZEB32fUps5n8xna9LXFQG+/vbz3Y2tNQ2DBwr8416z7/LLZ4Ka+Jt5prcP9crU"
    "n8gn81o/CtUd7p/5osF/MD/CD5c1MQo9zyd1lNiX4uHhRre2dprOLJlzvNeh5scFU+2QQnHvdSY7wTBvjdB0wuE4O8xWr7BGO4ri"
    "tD5O0+0sW710Q+cS5XX+EK0E4Ifc2kfPKRSzHiZ7FY0YofMFlrVz/Jl1zsub56EyKOYtP3vqlWM3zkPzvwSfq79qLH5v4zgQ5v8f"
    "7CuI/iPK8ZftP+j8CcX7qE0="
))


def _ogg_page(granule: int, serial: bytes, packet: bytes) -> bytes:
    return b"OggS\x00\x00" + struct.pack("<q", granule) + serial + bytes(8) + bytes([1, len(packet)]) + packet


def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def test_durations_read_from_the_files() -> None:
    assert audio_duration(wav(2.5, rate=16000, width=2)) == Decimal("2.5")
    assert audio_duration(LAME_VBR_MP3) == Decimal("1.512")
    frames = math.ceil(3 * 44100 / 1152)
    assert audio_duration(silent_mp3(3)) == Decimal(frames * 1152) / 44100
    # ID3v2 in front, ID3v1 behind
    tagged = b"ID3\x04\x00\x00\x00\x00\x00\x0a" + bytes(10) + silent_mp3(3) + b"TAG" + bytes(125)
    assert audio_duration(tagged) == Decimal(frames * 1152) / 44100
    # a streamed WAV whose header says 0xFFFFFFFF bytes: counted from what is there
    streamed = bytearray(wav(1.0, rate=8000))
    streamed[40:44] = b"\xff\xff\xff\xff"
    assert audio_duration(bytes(streamed)) == Decimal(1)
    # IEEE float WAV (the stdlib wave module refuses it)
    fmt = struct.pack("<HHIIHH", 3, 1, 1000, 4000, 4, 32)
    float_wav = (b"RIFF" + struct.pack("<I", 4 + 24 + 8 + 8000) + b"WAVE" + b"fmt " + struct.pack("<I", 16)
                 + fmt + b"data" + struct.pack("<I", 8000) + bytes(8000))
    assert audio_duration(float_wav) == Decimal(2)
    # FLAC: STREAMINFO's 20-bit rate and 36-bit sample count
    info = bytes(10) + ((22050 << 44) | (1 << 41) | (15 << 36) | 66150).to_bytes(8, "big") + bytes(16)
    assert audio_duration(b"fLaC\x80\x00\x00\x22" + info) == Decimal(3)
    # Ogg Opus: the last page's granule at 48 kHz, less the pre-skip
    head = b"OpusHead\x01\x01" + struct.pack("<HI", 312, 48000) + bytes(3)
    serial = b"\x01\x02\x03\x04"
    opus = _ogg_page(0, serial, head) + _ogg_page(-1, serial, b"x") + _ogg_page(96312, serial, b"y")
    assert audio_duration(opus) == Decimal(2)
    # MP4 / M4A: mvhd's duration over its timescale
    mvhd = _box(b"mvhd", bytes(12) + struct.pack(">II", 600, 2700) + bytes(80))
    m4a = _box(b"ftyp", b"M4A \x00\x00\x00\x00") + _box(b"mdat", bytes(100)) + _box(b"moov", mvhd)
    assert audio_duration(m4a) == Decimal("4.5")
    # what is not audio, or cut before its bookkeeping, has no duration
    for junk in (b"", b"hello world" * 100, os.urandom(50_000), tiny_png("x"), silent_mp3(3)[:2],
                 b"\xff" * 10_000, LAME_VBR_MP3[:20], m4a[:40], wav(1.0)[:30]):
        assert audio_duration(junk) is None


def test_image_sizes_read_from_the_headers_and_their_tokens() -> None:
    assert image_dimensions(tiny_png("x", 300, 200)) == (300, 200)
    # JPEG: the frame header after other segments (and fill bytes); baseline and progressive
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + bytes(9)

    def jpeg(sof: int, width: int, height: int) -> bytes:
        frame = struct.pack(">HBHHB", 17, 8, height, width, 3) + bytes(9)
        return b"\xff\xd8" + app0 + b"\xff\xff" + bytes([0xFF, sof]) + frame + b"\xff\xda" + bytes(20)

    assert image_dimensions(jpeg(0xC0, 640, 480)) == (640, 480)
    assert image_dimensions(jpeg(0xC2, 4032, 3024)) == (4032, 3024)
    # WebP: lossy (VP8), lossless (VP8L), extended (VP8X)
    def webp(chunk: bytes, data: bytes) -> bytes:
        size = struct.pack("<I", len(data))
        return b"RIFF" + struct.pack("<I", 4 + 8 + len(data)) + b"WEBP" + chunk + size + data

    lossy = b"\x10\x02\x00\x9d\x01\x2a" + struct.pack("<HH", 800, 600)
    assert image_dimensions(webp(b"VP8 ", lossy)) == (800, 600)
    assert image_dimensions(webp(b"VP8L", b"\x2f" + struct.pack("<I", 1023 | (767 << 14)))) == (1024, 768)
    canvas = bytes(4) + (2999).to_bytes(3, "little") + (1999).to_bytes(3, "little")
    assert image_dimensions(webp(b"VP8X", canvas)) == (3000, 2000)
    # not an image, cut short, a scan before any frame header, no pixels: no size
    for junk in (b"", b"GIF89a" + bytes(20), tiny_png("x")[:20], b"\xff\xd8" + app0 + b"\xff\xda" + bytes(20),
                 jpeg(0xC0, 640, 480)[:25], webp(b"VP8 ", b"\x10\x02\x00\x9d\x01"), tiny_png("x", 0, 5),
                 os.urandom(5000)):
        assert image_dimensions(junk) is None, junk[:30]
    # OpenAI's rule for GPT Image: fit in 2048, shortest side down to 512, 65 + 129 per 512px tile
    assert image_tokens(1024, 1024) == 65 + 129  # 512x512
    assert image_tokens(1536, 1024) == 65 + 2 * 129  # 768x512
    assert image_tokens(4096, 8192) == 65 + 2 * 129  # 1024x2048, then 512x1024
    assert image_tokens(2, 2) == 65 + 129  # never scaled up
    assert image_tokens(1024, 1025) == 65 + 2 * 129  # 512 x 512.5: a tile more, never below the rule
    assert image_tokens(512, 2048) == image_tokens(100, 30000) == MAX_IMAGE_TOKENS == 65 + 4 * 129


def test_multipart_parsing() -> None:
    body = (b"--xyz\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n"
            b"--xyz\r\nContent-Disposition: form-data; name=\"file\"; "
            b"filename=\"r\xc3\xa9sum\xc3\xa9.wav\"\r\n"
            b"Content-Type: audio/wav\r\n\r\n\r\n--xy\x00\xff\r\n"
            b"--xyz\r\nContent-Disposition: form-data; name=\"include[]\"\r\n\r\nlogprobs\r\n"
            b"--xyz\r\nContent-Disposition: form-data; name=\"temperature\"\r\n\r\n0.5\r\n--xyz--\r\n")
    payload = form_payload(parse_multipart('multipart/form-data; boundary="xyz"', body))
    upload = payload["file"]
    assert isinstance(upload, UploadedFile) and upload.data == b"\r\n--xy\x00\xff"
    assert upload.filename == "résumé.wav" and upload.content_type == "audio/wav"
    assert payload["model"] == "whisper-1" and payload["include"] == ["logprobs"]
    assert payload["temperature"] == 0.5
    # the request digest (json.dumps) sees the file's description, not its bytes
    assert json.loads(json.dumps(payload))["file"]["sha256"] == upload["sha256"]
    many = b"--xyz\r\nContent-Disposition: form-data; name=\"n\"\r\n\r\n1\r\n" * 65 + b"--xyz--\r\n"
    for bad in (b"", b"--xyz\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nno end",
                b"--xyz\r\nX-Other: 1\r\n\r\nv\r\n--xyz--", b"preamble\r\n" + body, many):
        with pytest.raises(FormError):
            parse_multipart("multipart/form-data; boundary=xyz", bad)
    with pytest.raises(FormError):
        parse_multipart("application/json", body)
