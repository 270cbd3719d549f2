"""Audio and image operations of a model: speech, transcriptions, translations, sound generation, and
image generation and edits. Each validates its body (before any quote), quotes it from the catalog's
prices, and calls the model's upstreams:

- audio.speech: input characters x the price per 1M characters, within $0.001-$5.00;
- audio.transcriptions / audio.translations: the audio's duration, read from the file itself
  (audio_duration), x the price per minute, plus on token-billed models (gpt-4o-transcribe, which
  bills its `prompt` as text input tokens) the prompt's estimated tokens x the text-input price,
  within $0.001-$1.00;
- audio.generations (ElevenLabs, audio_elevenlabs): duration_seconds x the price per second, or the price
  per call when the provider picks the length, within $0.001-$0.10;
- images.generations / images.edits: n x the price of one image of that size and quality (the output
  image tokens), plus on token-billed models (GPT Image: those with input token prices in the catalog)
  the input: the prompt's estimated text tokens x the text-input price, and on edits each input image's
  tokens (image and mask, from their dimensions: image_tokens.py) x the image-input price. An input
  image whose size cannot be read from its header (PNG, JPEG, WebP) is refused, naming its field.

Each route accepts the fields of its table below (request_fields.py): what is priced, what is free, and
what is refused because the upstream would bill it beyond the price (partial images, high input
fidelity, which adds 4,096-6,144 tokens per input image); any other field is refused naming it, and
the upstream gets the table's fields only.

Uploads reach the operations as `UploadedFile` values inside the payload (skills/uploads.py says why).

A call is charged its quote (`SkillResult.charge_usd` None) where the quote is exact: speech (the
characters), transcriptions (the file's duration), sound of a given length or priced per call. Where
the cost depends on what was produced it is charged that, never more than its quote: images (those
delivered; a size or quality left "auto", quoted at the dearest, at what GPT Image reports it picked;
the input tokens it reports), and sound whose length the provider picked on a model priced per second
only (quoted at the longest, charged the seconds read from the audio).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, TypeGuard

import aiohttp

from ..errors import SkillInputError, UpstreamError, UpstreamRejected, UpstreamTimeout
from ..skill import Operation, SkillResult
from ..tokens import estimate_tokens
from ..uploads import UploadedFile
from .audio_duration import MEDIA_TYPES as AUDIO_MEDIA_TYPES
from .audio_duration import audio_duration
from .audio_elevenlabs import MAX_SECONDS, MEDIA_TYPE, MIN_SECONDS, SOUND_PATH, ElevenLabsTarget, sound_body
from .image_tokens import MAX_IMAGE_TOKENS, image_dimensions, image_tokens
from .image_tokens import MEDIA_TYPES as IMAGE_MEDIA_TYPES
from .request_fields import (
    FREE,
    MAX_TEXT,
    PRICED,
    REFUSED,
    Check,
    Field,
    FieldTable,
    array_of,
    boolean,
    described,
    integer,
    number,
    obj,
    one_of,
    only,
    schema_of,
    text,
)
from .spec import ModelSpec
from .token_quotes import MILLION
from .upstream import Target, Targets
from .upstream_port import Upstream

SPEECH_USD = (Decimal("0.001"), Decimal("5.00"))
TRANSCRIPTION_USD = (Decimal("0.001"), Decimal("1.00"))
GENERATION_USD = (Decimal("0.001"), Decimal("0.10"))
# How each quote is computed, in one sentence (the faces describe a price before any request).
SPEECH_RULE = "the characters of input and instructions x the model's price per 1M characters"
TRANSCRIPTION_RULE = ("the audio's duration (read from the file) x the model's price per minute, plus the "
                      "prompt's estimated tokens x its input price on token-billed models")
GENERATION_RULE = ("duration_seconds x the model's price per second, or its price per call when the "
                   "provider picks the length")
IMAGE_RULE = ("n x the price of one image of the requested size and quality, plus on token-billed models "
              "the prompt's and input images' tokens x the input prices")

SPEECH_FORMATS = {"mp3": "audio/mpeg", "opus": "audio/opus", "aac": "audio/aac", "flac": "audio/flac",
                  "wav": "audio/wav", "pcm": "audio/pcm"}
SPEECH_MAX_CHARS = 4096  # OpenAI's limit on `input` (and on `instructions`)
TRANSCRIPTION_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
TRANSCRIPTION_PROMPT_CHARS = 1000  # whisper reads a prompt's last 224 tokens; a bound on what is unpriced
MAX_IMAGES = 10  # OpenAI's bound for `n`
MAX_EDIT_IMAGES = 16  # gpt-image-1 takes up to 16 input images
IMAGE_PROMPT_CHARS = 32000  # OpenAI's longest (gpt-image-1; dall-e-2/3 take 1000/4000)
TEXT_MEDIA_TYPE = "text/plain; charset=utf-8"


def _upload(media_types: Sequence[str]) -> Check:
    """An uploaded file (a multipart file part), not empty; `media_types`: the formats its content is
    read as (what the route measures it by), for the description (`x-media-types`)."""
    @described({"type": "string", "format": "binary", "minLength": 1, "x-media-types": list(media_types)})
    def check(value: Any, name: str) -> None:
        if not isinstance(value, UploadedFile):
            raise SkillInputError(f"'{name}' must be an uploaded file (a multipart/form-data file field)",
                                  name)
        if not value.data:
            raise SkillInputError(f"'{name}' is empty", name)

    return check


_AUDIO, _IMAGE_FILE = _upload(AUDIO_MEDIA_TYPES), _upload(IMAGE_MEDIA_TYPES)


@described({"anyOf": [schema_of(_IMAGE_FILE), {"type": "array", "items": schema_of(_IMAGE_FILE),
                                               "minItems": 1, "maxItems": MAX_EDIT_IMAGES}]})
def _images(value: Any, name: str) -> None:
    """The images an edit starts from: one file, or 1 to MAX_EDIT_IMAGES (`image[]` parts)."""
    files = value if isinstance(value, list) else [value]
    if not files or len(files) > MAX_EDIT_IMAGES:
        raise SkillInputError(f"'{name}' takes 1 to {MAX_EDIT_IMAGES} files", name)
    for upload in files:
        _IMAGE_FILE(upload, name)


_VOICE_NAME = text(256)
_VOICE_ID = obj({"id": _VOICE_NAME}, required=("id",))


@described({"anyOf": [schema_of(_VOICE_NAME), schema_of(_VOICE_ID)]})
def _voice(value: Any, name: str) -> None:
    try:
        (_VOICE_ID if isinstance(value, dict) else _VOICE_NAME)(value, name)
    except SkillInputError:
        raise SkillInputError(f"'{name}' must be a voice name (e.g. alloy) or {{\"id\": a custom voice id}}",
                              name) from None


_NO_STREAM = only(False, "is not supported on this route; leave it out or set it to false")

# What each route accepts (request_fields.py says what the kinds mean). `model`: each upstream is sent
# its own name for it (the face checks it). What the fields cannot say (an upload's content, a size
# and quality the model offers) the operation's validator checks after the table.
_MODEL = Field(FREE)
SPEECH_FIELDS = FieldTable("/v1/audio/speech", {
    "model": _MODEL,
    "input": Field(PRICED, text(SPEECH_MAX_CHARS), required=True),  # per character
    # per character too (gpt-4o-mini-tts bills them as input)
    "instructions": Field(PRICED, text(SPEECH_MAX_CHARS)),
    "voice": Field(FREE, _voice, required=True),
    "response_format": Field(FREE, one_of(*SPEECH_FORMATS)),
    "speed": Field(FREE, number(0.25, 4.0)),
    "stream_format": Field(FREE, one_of("audio", why="raw audio only: server-sent events are not relayed")),
})
_AUDIO_TEXT = {
    "model": _MODEL,
    "file": Field(PRICED, _AUDIO, required=True),  # its duration
    # its text tokens, on models that bill them (gpt-4o-transcribe)
    "prompt": Field(PRICED, text(TRANSCRIPTION_PROMPT_CHARS)),
    "response_format": Field(FREE, one_of(*TRANSCRIPTION_FORMATS)),
    "temperature": Field(FREE, number(0, 1)),
    "stream": Field(FREE, _NO_STREAM),
}
TRANSCRIPTION_FIELDS = FieldTable("/v1/audio/transcriptions", {
    **_AUDIO_TEXT, "language": Field(FREE, text(16)),
    "timestamp_granularities": Field(FREE, array_of(one_of("word", "segment"), 2, "values (word, segment)")),
    "include": Field(FREE, array_of(one_of("logprobs"), 1, "value (logprobs)")),
})
TRANSLATION_FIELDS = FieldTable("/v1/audio/translations", _AUDIO_TEXT)
GENERATION_FIELDS = FieldTable("/v1/audio/generations", {
    "model": _MODEL,
    "prompt": Field(FREE, text(MAX_TEXT), required=True),
    # per second (absent: the price per call)
    "duration_seconds": Field(PRICED, number(MIN_SECONDS, MAX_SECONDS)),
    "prompt_influence": Field(FREE, number(0, 1)), "loop": Field(FREE, boolean),
})
_IMAGE = {
    "model": _MODEL,
    # text tokens on token-billed models (GPT Image)
    "prompt": Field(PRICED, text(IMAGE_PROMPT_CHARS), required=True),
    # n x the price per image of that size and quality (which ones a model offers: image_options)
    "n": Field(PRICED, integer(1, MAX_IMAGES)), "size": Field(PRICED, text(64)),
    "quality": Field(PRICED, text(64)),
    "response_format": Field(FREE, one_of("url", "b64_json")),
    "user": Field(FREE, text(256)),
    "background": Field(FREE, one_of("transparent", "opaque", "auto")),
    "output_format": Field(FREE, one_of("png", "jpeg", "webp")),
    "output_compression": Field(FREE, integer(0, 100)),
    "stream": Field(FREE, _NO_STREAM),
    "partial_images": Field(REFUSED, why="partial images are billed as extra output image tokens"),
}
IMAGE_FIELDS = FieldTable("/v1/images/generations", {
    **_IMAGE, "style": Field(FREE, one_of("vivid", "natural")),
    "moderation": Field(FREE, one_of("low", "auto")),
})
IMAGE_EDIT_FIELDS = FieldTable("/v1/images/edits", {
    **_IMAGE, "image": Field(PRICED, _images, required=True),  # image tokens by size (GPT Image)
    "mask": Field(PRICED, _IMAGE_FILE),
    "input_fidelity": Field(REFUSED, why="high input fidelity bills more input image tokens"),
})


def audio_seconds(upload: UploadedFile) -> Decimal | None:
    """Playing time if the upload is audio whose duration can be read (read once per file: validation and
    pricing both ask)."""
    return upload.measured(audio_duration)


def image_size(upload: UploadedFile) -> tuple[int, int] | None:
    """(width, height) if the upload is a PNG, JPEG or WebP image whose header can be read."""
    return upload.measured(image_dimensions)


# ---------------------------------------------------------------------------------------------- quotes


def _within(usd: Decimal, bounds: tuple[Decimal, Decimal], param: str, hint: str) -> Decimal:
    low, high = bounds
    if usd > high:
        raise SkillInputError(f"this request would cost ${usd:.6f}, above the ${high} maximum of this route; "
                              f"{hint}", param)
    return max(usd, low)


def speech_characters(body: dict[str, Any]) -> int:
    """What speech is priced by: the characters of `input` and of `instructions`."""
    return sum(len(body[name]) for name in ("input", "instructions") if isinstance(body.get(name), str))


def speech_price(body: dict[str, Any], spec: ModelSpec) -> Decimal:
    per_mchars = spec.prices.per_mchars
    assert per_mchars is not None  # the catalog sells priced models only
    usd = Decimal(speech_characters(body)) * per_mchars / MILLION  # (an empty probe: the minimum)
    fit = int(SPEECH_USD[1] * MILLION / per_mchars)
    return _within(usd, SPEECH_USD, "input", f"send at most {fit} characters")


def prompt_tokens(body: dict[str, Any], spec: ModelSpec) -> int:
    """The `prompt`'s estimated text tokens on a model that bills them (a text-input price), else 0."""
    prompt = body.get("prompt")
    if spec.prices.input_per_mtok is None or not isinstance(prompt, str) or not prompt:
        return 0
    return estimate_tokens(prompt, spec.id).tokens


def _input_usd(spec: ModelSpec, text_tokens: int, image_tokens: int = 0) -> Decimal:
    """Input billed in tokens (token-billed image and transcription models): text and image tokens at
    their input prices."""
    prices = spec.prices
    return (text_tokens * (prices.input_per_mtok or 0)
            + image_tokens * (prices.input_image_per_mtok or 0)) / MILLION


def transcription_price(body: dict[str, Any], spec: ModelSpec) -> Decimal:
    """The audio's exact duration (from the file) x the price per minute, plus the prompt's text tokens
    on models that bill them (gpt-4o-transcribe)."""
    upload = body.get("file")
    seconds = (audio_seconds(upload) if isinstance(upload, UploadedFile) else None) or Decimal(0)  # (a probe)
    per_minute = spec.prices.per_minute
    assert per_minute is not None  # the catalog sells priced models only
    usd = seconds * per_minute / 60 + _input_usd(spec, prompt_tokens(body, spec))
    fit = math.floor(TRANSCRIPTION_USD[1] / per_minute)
    return _within(usd, TRANSCRIPTION_USD, "file", f"this audio lasts {seconds:.1f} s; split it into parts "
                                                   f"of at most {fit} minutes")


def generation_price(body: dict[str, Any], spec: ModelSpec) -> Decimal:
    """duration_seconds x the price per second; without a duration the provider picks it after we quote,
    so the price per call, or (without one) the longest duration it may pick."""
    prices = spec.prices
    duration = body.get("duration_seconds")
    if prices.per_second is not None and (duration is not None or prices.per_call is None):
        seconds = Decimal(str(duration if duration is not None else MAX_SECONDS))
        usd = seconds * prices.per_second
        fit = math.floor(GENERATION_USD[1] / prices.per_second * 10) / 10
        return _within(usd, GENERATION_USD, "duration_seconds", f"set duration_seconds to {fit} or less")
    assert prices.per_call is not None  # the catalog sells audio.generations with one of the two
    return _within(prices.per_call, GENERATION_USD, "model", "choose another model")


def image_price(body: dict[str, Any], spec: ModelSpec) -> Decimal:
    """n x the price of one image at the requested (or the model's default) size and quality, plus the
    input on token-billed models (GPT Image): the prompt's text tokens and the input images' tokens."""
    one: Decimal | None = spec.prices.image_price(body.get("size"), body.get("quality"))
    if one is None:
        raise _image_option_error(body, spec)
    return one * int(body.get("n") or 1) + _input_usd(spec, prompt_tokens(body, spec),
                                                      input_image_tokens(body, spec))


def generation_charge(body: dict[str, Any], spec: ModelSpec, seconds: Decimal | None) -> Decimal | None:
    """What a sound generation used, when that is not its quote: the provider picked the length on a
    model priced per second only (quoted at the longest it may pick), so the `seconds` produced x the
    price per second, within the route's minimum and the quote. None: the quote is exact, or the
    audio's length could not be read."""
    prices = spec.prices
    if body.get("duration_seconds") is not None or prices.per_call is not None \
            or prices.per_second is None or seconds is None:
        return None
    return min(max(seconds * prices.per_second, GENERATION_USD[0]), generation_price(body, spec))


def cheapest_image(spec: ModelSpec) -> Decimal | None:
    """The least an image call costs (one image of the cheapest size and quality); no fixed maximum."""
    return min(spec.prices.per_image.values(), default=None)


def input_images(body: dict[str, Any]) -> list[tuple[str, UploadedFile]]:
    """(field, file) of every image an edit sends the model: the images, then the mask."""
    images = body.get("image")
    found = [("image", f) for f in (images if isinstance(images, list) else [images])]
    found.append(("mask", body.get("mask")))
    return [(name, f) for name, f in found if isinstance(f, UploadedFile)]


def input_image_tokens(body: dict[str, Any], spec: ModelSpec) -> int:
    """The input images' tokens on a model that bills them (an image-input price), else 0: each image's
    by its dimensions (image_tokens.py); the mask counts as one more input image, as it is given to the
    model. A file whose size cannot be read (refused by validation; a probe) counts the most one can."""
    if spec.prices.input_image_per_mtok is None:
        return 0
    return sum(image_tokens(*size) if (size := image_size(f)) else MAX_IMAGE_TOKENS
               for _, f in input_images(body))


def _image_option_error(body: dict[str, Any], spec: ModelSpec) -> SkillInputError:
    prices = spec.prices
    sizes = sorted({key.partition("/")[0] for key in prices.per_image})
    if prices.image_price(body.get("size"), None) is None:
        return SkillInputError(f"'size' {body.get('size')!r} is not offered for {spec.id}; choose one of "
                               f"{', '.join(sizes)}", "size")
    qualities = sorted({key.partition("/")[2] for key in prices.per_image} - {""})
    return SkillInputError(f"'quality' {body.get('quality')!r} is not offered for {spec.id}; choose one of "
                           f"{', '.join(qualities) or 'none'} (or auto)", "quality")


# ---------------------------------------------------------------------------------------------- checks


def _readable_images(body: dict[str, Any], spec: ModelSpec) -> None:
    """On a model that bills input images by their size, every image's size must be readable."""
    if spec.prices.input_image_per_mtok is None:
        return
    for name, upload in input_images(body):
        if image_size(upload) is None:
            raise SkillInputError(f"cannot read the size of '{upload.filename}' ({name}), which {spec.id} "
                                  "bills input image tokens by; send PNG, JPEG or WebP images", name)


def image_options_schema(spec: ModelSpec) -> dict[str, Any]:
    """`size` and `quality` as this model's prices take them (`ModelPrices.image_options`, what
    `_offered` checks), as JSON Schema: one branch per set of sizes taking the same qualities (null
    among them: may be left out)."""
    groups: dict[str, tuple[list[str | None], list[str | None] | None]] = {}
    for size, qualities in spec.prices.image_options().items():
        groups.setdefault(json.dumps(qualities), ([], qualities))[0].append(size)
    branches = []
    for sizes, qualities in groups.values():
        branch: dict[str, Any] = {"properties": {"size": {"enum": sizes}}}
        required = [] if None in sizes else ["size"]
        if qualities is not None:
            branch["properties"]["quality"] = {"enum": qualities}
            required += [] if None in qualities else ["quality"]
        branches.append({**branch, **({"required": required} if required else {})})
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _offered(body: dict[str, Any], spec: ModelSpec) -> None:
    """The size and quality asked for are ones the model is priced for (`image_options_schema`)."""
    if spec.prices.image_price(body.get("size"), body.get("quality")) is None:
        raise _image_option_error(body, spec)


# ---------------------------------------------------------------------------------------------- calls


def _form(target: Target, body: dict[str, Any], files: dict[str, list[UploadedFile]]) -> aiohttp.FormData:
    """The multipart body for one upstream: its model name, the text fields as OpenAI sends them (arrays
    as repeated `name[]`), then the files."""
    form = aiohttp.FormData()
    form.add_field("model", target.model)
    for name, value in body.items():
        if name == "model" or name in files or value is None:
            continue
        if isinstance(value, list):
            for item in value:
                form.add_field(f"{name}[]", _text(item))
        else:
            form.add_field(name, _text(value))
    for name, uploads in files.items():
        for upload in uploads:
            form.add_field(name, upload.data, filename=upload.filename, content_type=upload.content_type)
    return form


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else json.dumps(value)


async def _call(client: Upstream, targets: Sequence[Target], path: str,
                build: Callable[[Target], dict[str, Any] | aiohttp.FormData]) -> tuple[bytes, Target, str]:
    """The first upstream's answer, asking one at a time: the body names that upstream's own model (a form
    field, ElevenLabs' model_id), which UpstreamClient only rewrites in JSON bodies."""
    failures: list[UpstreamError] = []
    for target in targets:
        body = build(target)
        try:
            if isinstance(body, aiohttp.FormData):
                return await client.request([target], path, form=body, raw=True)
            return await client.request([target], path, json_body=body, raw=True)
        except UpstreamError as exc:
            if isinstance(exc, UpstreamRejected):
                raise  # the request's fault: the next upstream would refuse it too
            failures.append(exc)
    if len(failures) == 1:
        raise failures[0]
    kind = UpstreamTimeout if any(isinstance(f, UpstreamTimeout) for f in failures) else UpstreamError
    raise kind("; ".join(f.message for f in failures) or "no upstream configured")


def _json_answer(raw: bytes, required: str) -> dict[str, Any]:
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or required not in answer:
        raise UpstreamError(f"the model provider answered without '{required}'")
    return answer


def _usage(target: Target, facts: dict[str, Any], upstream: Any = None) -> dict[str, Any]:
    """For the ledger: the upstream's own usage report (if any), then what we measured."""
    reported = upstream if isinstance(upstream, dict) else {}
    return {**reported, "provider": target.provider, "upstream_model": target.model, **facts}


# ---------------------------------------------------------------------------------------------- operations


def make_speech_operation(spec: ModelSpec, targets: Targets, client: Upstream) -> Operation:
    def validate(body: dict[str, Any]) -> None:
        SPEECH_FIELDS.check(body)

    def price(body: dict[str, Any]) -> Decimal:
        return speech_price(body, spec)

    async def run(body: dict[str, Any]) -> SkillResult:
        audio, target, content_type = await client.request(targets, "/audio/speech",
                                                           json_body=SPEECH_FIELDS.forward(body), raw=True)
        if not audio or content_type.startswith(("application/json", "text/")):
            raise UpstreamError("the model provider answered without audio")
        fmt = body.get("response_format") or "mp3"
        media_type = content_type if content_type.startswith("audio/") else SPEECH_FORMATS[fmt]
        chars = speech_characters(body)
        per_mchars = spec.prices.per_mchars or Decimal(0)  # (set: speech_price quoted with it)
        return SkillResult(body=audio, media_type=media_type,
                           usage=_usage(target, {"characters": chars, "response_format": fmt,
                                                 "bytes": len(audio)}),
                           upstream_cost_usd=spec.upstream_cost(Decimal(chars) * per_mchars / MILLION))

    return Operation("audio.speech", run, price, validate, price_floor_usd=SPEECH_USD[0],
                     price_cap_usd=SPEECH_USD[1], price_rule=SPEECH_RULE)


def _make_audio_text_operation(task: str, spec: ModelSpec, targets: Targets, client: Upstream
                               ) -> Operation:
    """Transcription (task "transcriptions") or translation into English ("translations")."""
    name = f"audio.{task}"
    fields = TRANSCRIPTION_FIELDS if task == "transcriptions" else TRANSLATION_FIELDS

    def validate(body: dict[str, Any]) -> None:
        fields.check(body)
        upload: UploadedFile = body["file"]
        if audio_seconds(upload) is None:
            raise SkillInputError(f"cannot read the duration of '{upload.filename}', which this route is "
                                  "priced by; send WAV, MP3, FLAC, Ogg (Opus, Vorbis) or M4A/MP4 audio",
                                  "file")

    def price(body: dict[str, Any]) -> Decimal:
        return transcription_price(body, spec)

    async def run(body: dict[str, Any]) -> SkillResult:
        upload: UploadedFile = body["file"]
        sent = fields.forward(body, without=("file",))
        raw, target, content_type = await _call(client, targets, f"/audio/{task}",
                                                lambda t: _form(t, sent, {"file": [upload]}))
        seconds = audio_seconds(upload) or Decimal(0)
        per_minute = spec.prices.per_minute or Decimal(0)  # (set: transcription_price quoted with it)
        cost = spec.upstream_cost(seconds * per_minute / 60 + _input_usd(spec, prompt_tokens(body, spec)))
        facts = {"audio_seconds": float(round(seconds, 3))}
        if (body.get("response_format") or "json") in ("json", "verbose_json"):
            answer = _json_answer(raw, "text")
            return SkillResult(body=answer, usage=_usage(target, facts, answer.get("usage")),
                               upstream_cost_usd=cost)
        media_type = content_type if content_type.startswith("text/") else TEXT_MEDIA_TYPE
        return SkillResult(body=raw, media_type=media_type, usage=_usage(target, facts),
                           upstream_cost_usd=cost)

    return Operation(name, run, price, validate, price_floor_usd=TRANSCRIPTION_USD[0],
                     price_cap_usd=TRANSCRIPTION_USD[1], price_rule=TRANSCRIPTION_RULE)


def make_transcription_operation(spec: ModelSpec, targets: Targets, client: Upstream) -> Operation:
    return _make_audio_text_operation("transcriptions", spec, targets, client)


def make_translation_operation(spec: ModelSpec, targets: Targets, client: Upstream) -> Operation:
    return _make_audio_text_operation("translations", spec, targets, client)


def make_generation_operation(spec: ModelSpec, targets: Targets, client: Upstream) -> Operation:
    """Sound effects / music from a prompt, on ElevenLabs (the catalog gives this operation no other kind
    of upstream, so every target here is an ElevenLabs one)."""
    eleven = tuple(ElevenLabsTarget.of(t) for t in targets)

    def validate(body: dict[str, Any]) -> None:
        GENERATION_FIELDS.check(body)  # (the upstream body is built by sound_body, field by field)

    def price(body: dict[str, Any]) -> Decimal:
        return generation_price(body, spec)

    async def run(body: dict[str, Any]) -> SkillResult:
        audio, target, content_type = await _call(client, eleven, SOUND_PATH, lambda t: sound_body(
            t, body["prompt"], duration_seconds=body.get("duration_seconds"),
            prompt_influence=body.get("prompt_influence"), loop=body.get("loop")))
        if not audio or not content_type.startswith("audio/"):
            raise UpstreamError("the sound provider answered without audio")
        seconds = audio_duration(audio)
        charge = generation_charge(body, spec, seconds)
        return SkillResult(
            body=audio, media_type=content_type.split(";")[0].strip() or MEDIA_TYPE,
            usage=_usage(target, {"duration_seconds": body.get("duration_seconds"), "bytes": len(audio),
                                  "audio_seconds": None if seconds is None else float(round(seconds, 3))}),
            upstream_cost_usd=spec.upstream_cost(generation_price(body, spec) if charge is None else charge),
            charge_usd=charge)

    return Operation("audio.generations", run, price, validate, price_floor_usd=GENERATION_USD[0],
                     price_cap_usd=GENERATION_USD[1], price_rule=GENERATION_RULE)


def _image_result(raw: bytes, target: Target, body: dict[str, Any], spec: ModelSpec) -> SkillResult:
    answer = _json_answer(raw, "data")
    images = answer["data"]
    if not isinstance(images, list):
        raise UpstreamError("the model provider answered without images")
    facts = {"images": len(images), "size": body.get("size"), "quality": body.get("quality")}
    # the input tokens as the upstream reports them (GPT Image), else as quoted
    reported = _reported_input(answer.get("usage"))
    text_tokens, image_tokens_in = reported or (prompt_tokens(body, spec), input_image_tokens(body, spec))
    used = _produced_image_price(answer, body, spec) * len(images) \
        + _input_usd(spec, text_tokens, image_tokens_in)
    return SkillResult(body=answer, usage=_usage(target, facts, answer.get("usage")),
                       upstream_cost_usd=spec.upstream_cost(used),
                       charge_usd=min(used, image_price(body, spec)))


def _produced_image_price(answer: dict[str, Any], body: dict[str, Any], spec: ModelSpec) -> Decimal:
    """The price of one image as produced: a size or quality the request left to the upstream ("auto",
    or none and no default: quoted at the dearest) at what the answer reports it picked (GPT Image
    does); the rest as asked. As asked when the table has no price for what was reported."""
    def picked(name: str) -> Any:
        left_to_upstream = (body.get(name) or spec.prices.image_defaults.get(name) or "auto") == "auto"
        reported = answer.get(name)
        return reported if left_to_upstream and isinstance(reported, str) else body.get(name)

    asked = spec.prices.image_price(body.get("size"), body.get("quality")) or Decimal(0)
    produced = spec.prices.image_price(picked("size"), picked("quality"))
    return asked if produced is None else produced


def _reported_input(usage: Any) -> tuple[int, int] | None:
    """(text, image) input tokens of an images answer's usage report, None without one."""
    details = usage.get("input_tokens_details") if isinstance(usage, dict) else None
    if not isinstance(details, dict):
        return None
    text, image = details.get("text_tokens"), details.get("image_tokens", 0)
    if not (_count(text) and _count(image)):
        return None
    return text, image


def _count(value: Any) -> TypeGuard[int]:
    """A token count: a whole number >= 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def make_image_generation_operation(spec: ModelSpec, targets: Targets, client: Upstream) -> Operation:
    def validate(body: dict[str, Any]) -> None:
        IMAGE_FIELDS.check(body)
        _offered(body, spec)

    def price(body: dict[str, Any]) -> Decimal:
        return image_price(body, spec)

    async def run(body: dict[str, Any]) -> SkillResult:
        raw, target, _ = await client.request(targets, "/images/generations",
                                              json_body=IMAGE_FIELDS.forward(body), raw=True)
        return _image_result(raw, target, body, spec)

    return Operation("images.generations", run, price, validate, price_floor_usd=cheapest_image(spec),
                     price_rule=IMAGE_RULE, request_schema=image_options_schema(spec))


def make_image_edit_operation(spec: ModelSpec, targets: Targets, client: Upstream) -> Operation:
    def validate(body: dict[str, Any]) -> None:
        IMAGE_EDIT_FIELDS.check(body)
        _offered(body, spec)
        _readable_images(body, spec)

    def price(body: dict[str, Any]) -> Decimal:
        return image_price(body, spec)

    async def run(body: dict[str, Any]) -> SkillResult:
        images: list[UploadedFile] = body["image"] if isinstance(body["image"], list) else [body["image"]]
        files = {"image" if len(images) == 1 else "image[]": images}
        if body.get("mask") is not None:
            files["mask"] = [body["mask"]]
        fields = IMAGE_EDIT_FIELDS.forward(body, without=("image", "mask"))
        raw, target, _ = await _call(client, targets, "/images/edits", lambda t: _form(t, fields, files))
        return _image_result(raw, target, body, spec)

    return Operation("images.edits", run, price, validate, price_floor_usd=cheapest_image(spec),
                     price_rule=IMAGE_RULE, request_schema=image_options_schema(spec))


FACTORIES = {
    "audio.speech": make_speech_operation,
    "audio.transcriptions": make_transcription_operation,
    "audio.translations": make_translation_operation,
    "audio.generations": make_generation_operation,
    "images.generations": make_image_generation_operation,
    "images.edits": make_image_edit_operation,
}
