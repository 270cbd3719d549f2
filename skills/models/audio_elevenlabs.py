"""The ElevenLabs adapter: sound effects and music from a text prompt (`/v1/audio/generations`).

Written against ElevenLabs' documented Create Sound Effect API: `POST {base}/v1/sound-generation` with
the `xi-api-key` header and the JSON body {text, duration_seconds?, prompt_influence?, loop?, model_id};
`output_format` is a query parameter; the answer is the audio itself. Not OpenAI-shaped, so it has its own
target (the key goes in `xi-api-key`, not a Bearer token) and its own body; the call, fallback, retries
and cooldown are UpstreamClient's, driven by the audio.generations operation in media_ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .upstream import Target

OUTPUT_FORMAT = "mp3_44100_128"
SOUND_PATH = f"/v1/sound-generation?output_format={OUTPUT_FORMAT}"
MEDIA_TYPE = "audio/mpeg"
MIN_SECONDS, MAX_SECONDS = 0.5, 30.0  # ElevenLabs' range for duration_seconds (null: it picks)


@dataclass(frozen=True)
class ElevenLabsTarget(Target):
    """An ElevenLabs upstream: its key goes in `xi-api-key`."""

    def headers(self) -> dict[str, str]:
        return {"xi-api-key": self.api_key} if self.api_key else {}

    @classmethod
    def of(cls, target: Target) -> ElevenLabsTarget:
        # The documented base is the API root (https://api.elevenlabs.io); a configured ".../v1" works too.
        root = target.base_url.rstrip("/").removesuffix("/v1")
        return cls(target.provider, root, target.model, target.api_key)


def sound_body(target: Target, text: str, *, duration_seconds: float | None = None,
               prompt_influence: float | None = None, loop: bool | None = None) -> dict[str, Any]:
    """The JSON body for one upstream: only the documented fields, unset ones left to ElevenLabs."""
    body: dict[str, Any] = {"text": text, "model_id": target.model}
    for name, value in (("duration_seconds", duration_seconds), ("prompt_influence", prompt_influence),
                        ("loop", loop)):
        if value is not None:
            body[name] = value
    return body
