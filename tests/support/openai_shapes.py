"""Writes wellknown/openai_shapes.json: OpenAI's request and response shapes as JSON Schema, generated
from the `openai` package's own types (pydantic models and TypedDicts), so the OpenAPI document's /v1
shapes are OpenAI's and not a copy typed by hand. The package is a test dependency only: the gateway
reads the generated file; tests/test_openapi.py regenerates it and fails when it differs.

    .venv/bin/python -m tests.support.openai_shapes   # after upgrading openai
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import openai.types.audio.speech_create_params as speech
import openai.types.audio.transcription_create_params as transcription
import openai.types.audio.translation_create_params as translation
import openai.types.chat.completion_create_params as chat
import openai.types.completion_create_params as completion
import openai.types.embedding_create_params as embedding
import openai.types.image_edit_params as image_edit
import openai.types.image_generate_params as image_generate
from openai.types import Completion, CreateEmbeddingResponse, ImagesResponse, Model
from openai.types.audio import Transcription, Translation
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import ConfigDict, PydanticSchemaGenerationError, TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

SHAPES_FILE = Path(__file__).resolve().parents[2] / "wellknown" / "openai_shapes.json"
REF = "#/components/schemas/{model}"

RESPONSES: dict[str, Any] = {
    "chat.completion": ChatCompletion, "chat.completion.chunk": ChatCompletionChunk,
    "text_completion": Completion, "embeddings": CreateEmbeddingResponse, "model": Model,
    "images": ImagesResponse, "transcription": Transcription, "translation": Translation,
}
# the model operation -> OpenAI's request body type (edits and audio.generations have none)
REQUESTS: dict[str, Any] = {
    "chat.completions": chat.CompletionCreateParamsBase,
    "completions": completion.CompletionCreateParamsBase,
    "embeddings": embedding.EmbeddingCreateParams,
    "audio.speech": speech.SpeechCreateParams,
    "audio.transcriptions": transcription.TranscriptionCreateParamsBase,
    "audio.translations": translation.TranslationCreateParams,
    "images.generations": image_generate.ImageGenerateParamsBase,
    "images.edits": image_edit.ImageEditParamsBase,
}


class _Schemas(GenerateJsonSchema):
    """Uploads (typed as file objects) are binary parts of a multipart body."""

    def is_instance_schema(self, schema: core_schema.IsInstanceSchema) -> JsonSchemaValue:
        return {"type": "string", "format": "binary"}


def _adapter(body: Any) -> TypeAdapter[Any]:
    """A TypedDict's adapter; one holding uploads (file objects) admits them as opaque values (the
    config rides on the class for the adapter's build only: a TypedDict takes no `config=`)."""
    try:
        return TypeAdapter(body)
    except PydanticSchemaGenerationError:
        body.__pydantic_config__ = ConfigDict(arbitrary_types_allowed=True)
        try:
            return TypeAdapter(body)
        finally:
            del body.__pydantic_config__


def shapes() -> dict[str, Any]:
    adapters = [(("response", key), "validation", TypeAdapter(model)) for key, model in RESPONSES.items()]
    adapters += [(("request", key), "validation", _adapter(body)) for key, body in REQUESTS.items()]
    mapping, definitions = TypeAdapter.json_schemas(adapters, ref_template=REF, schema_generator=_Schemas)
    defs = definitions.get("$defs", {})

    def resolved(schema: dict[str, Any]) -> dict[str, Any]:
        ref = schema.get("$ref")
        return defs[ref.rsplit("/", 1)[-1]] if ref else schema

    requests = {}
    for key in REQUESTS:
        body = resolved(mapping[(("request", key), "validation")])
        requests[key] = {"properties": body.get("properties", {}), "required": body.get("required", [])}
    return {
        "generated_from": f"openai {openai.__version__}",
        "responses": {key: mapping[(("response", key), "validation")] for key in RESPONSES},
        "requests": requests,
        # each component titled by its own (unique) name: client generators name classes by title, and
        # OpenAI reuses titles (three `Choice`s)
        "schemas": {name: {**schema, "title": name} for name, schema in sorted(defs.items())},
    }


def render() -> str:
    return json.dumps(shapes(), indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    SHAPES_FILE.write_text(render(), encoding="utf-8")
    print(f"wrote {SHAPES_FILE}")
