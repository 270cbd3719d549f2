"""The model table: enough sellable models, every one priced, genai-prices first, strict validation."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from genai_prices import Usage, calc_price

from skills.errors import SkillUnavailableError
from skills.models import (
    OPERATIONS,
    TOKEN_OPERATIONS,
    Catalog,
    CatalogError,
    ModelSpec,
    ProviderAccess,
    ProviderVariables,
    load_catalog,
)
from skills.models.model_skills import OPERATION_FACTORIES, build_model_skills, model_targets
from skills.models.upstream import Target, UpstreamClient

MILLION = Decimal(1_000_000)
CHAT_ROUTE_MAX_USD = Decimal("0.50")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def genai(provider: str, model: str) -> Any:
    return calc_price(Usage(), model, provider_id=provider).model_price


def write(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "models.json"
    path.write_text(json.dumps(document))
    return path


def base_document() -> dict[str, Any]:
    """A tiny valid table: one cloud provider, one keyless local one."""
    return {
        "providers": {
            "openai": {"kind": "openai", "base_url": "https://api.openai.com/v1",
                       "api_key_env": "OPENAI_API_KEY", "base_url_env": "OPENAI_BASE_URL",
                       "key_required": True, "genai_prices_provider": "openai"},
            "local": {"kind": "openai", "base_url": "http://127.0.0.1:11434/v1", "api_key_env": None,
                      "base_url_env": "LOCAL_LLM_BASE_URL", "key_required": False},
        },
        "models": [
            {"id": "m-chat", "name": "Chat", "family": "local", "operations": ["chat.completions"],
             "context_window": 8192, "default_max_tokens": 512, "max_output_tokens": 4096,
             "upstreams": [{"provider": "local", "model": "llama3.2"}],
             "prices": {"input_per_mtok": "0.50", "output_per_mtok": "1.50"}},
        ],
    }


# --- the shipped table ---------------------------------------------------------------------------------


def test_at_least_80_sellable_models_across_10_providers(catalog: Catalog) -> None:
    assert catalog.warnings == []
    assert len(catalog.models) >= 80
    providers = {u.provider for m in catalog.models.values() for u in m.upstreams}
    assert len(providers) >= 10, providers
    assert {"openai", "anthropic", "gemini", "groq", "together", "deepseek", "mistral", "xai", "fireworks",
            "openrouter", "elevenlabs", "local"} <= providers
    ops = {op for m in catalog.models.values() for op in m.operations}
    assert ops == OPERATIONS


def test_every_sellable_model_is_priced_above_zero_for_each_operation(catalog: Catalog) -> None:
    for model in catalog.models.values():
        for op in model.operations:
            assert model.prices.covers(op), (model.id, op)
        assert not model.prices.covers("not-an-operation")


def test_every_operation_of_the_table_has_an_implementation() -> None:
    assert set(OPERATION_FACTORIES) == OPERATIONS


def test_token_models_have_limits_and_a_default_quote_under_the_route_maximum(catalog: Catalog) -> None:
    for model in catalog.models.values():
        if not set(model.operations) & TOKEN_OPERATIONS:
            continue
        assert model.context_window and model.default_max_tokens and model.max_output_tokens, model.id
        assert model.default_max_tokens <= model.max_output_tokens <= model.context_window, model.id
        assert model.prices.output_per_mtok is not None
        # max_tokens left unset must still be sellable: the output part alone stays under $0.50.
        default_quote = model.default_max_tokens * model.prices.output_per_mtok / MILLION
        assert default_quote < CHAT_ROUTE_MAX_USD, model.id


def test_prices_are_decimals_in_the_data_file() -> None:
    document = json.loads((Path(__file__).parent.parent / "skills/models/models.json").read_text())

    def walk(value: Any, where: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}.{key}")
        else:
            assert isinstance(value, str), where
            Decimal(value)

    for model in document["models"]:
        prices = {k: v for k, v in model.get("prices", {}).items() if k != "image_defaults"}
        walk(prices, model["id"])


def test_genai_prices_win_where_it_knows_the_model(catalog: Catalog) -> None:
    mini = catalog.models["gpt-4o-mini"].prices
    assert mini.source == "genai-prices"
    assert (mini.input_per_mtok, mini.output_per_mtok) == (genai("openai", "gpt-4o-mini").input_mtok,
                                                           genai("openai", "gpt-4o-mini").output_mtok)
    haiku = catalog.models["claude-haiku-4-5"].prices
    assert haiku.input_per_mtok == genai("anthropic", "claude-haiku-4-5").input_mtok
    assert catalog.models["text-embedding-3-small"].prices.input_per_mtok == genai(
        "openai", "text-embedding-3-small").input_mtok
    assert catalog.models["tts-1"].prices.per_mchars == genai("openai", "tts-1").input_mchars
    assert catalog.models["whisper-1"].prices.per_minute == genai("openai", "whisper-1").audio_hours / 60
    # what genai-prices cannot express per call (per image, per second) comes from the table
    assert catalog.models["dall-e-3"].prices.source == "table"
    assert catalog.models["elevenlabs/sound-effects"].prices.per_second == Decimal("0.002")


def test_tiered_prices_follow_the_prompt_size(catalog: Catalog) -> None:
    pro = catalog.models["gemini-2.5-pro"].prices
    tiered = genai("google", "gemini-2.5-pro")
    assert pro.input_per_mtok == tiered.input_mtok.base
    assert pro.token_prices(1_000) == (tiered.input_mtok.base, tiered.output_mtok.base)
    over = tiered.input_mtok.tiers[-1].start + 1
    assert pro.token_prices(over) == (tiered.input_mtok.tiers[-1].price, tiered.output_mtok.tiers[-1].price)


def test_image_prices_by_size_and_quality(catalog: Catalog) -> None:
    dalle3 = catalog.models["dall-e-3"].prices
    assert dalle3.image_price() == Decimal("0.040")  # OpenAI's defaults: 1024x1024, standard
    assert dalle3.image_price("1792x1024", "hd") == Decimal("0.120")
    assert dalle3.image_price("640x480") is None
    image1 = catalog.models["gpt-image-1"].prices
    assert image1.image_price() == Decimal("0.25")  # 'auto' is quoted at the dearest
    assert image1.image_price("1024x1024", "auto") == Decimal("0.167")
    assert image1.image_price("1024x1024", "low") == Decimal("0.011")
    assert catalog.models["dall-e-2"].prices.image_price("256x256") == Decimal("0.016")


def test_token_billed_image_and_transcription_models_have_input_token_prices(catalog: Catalog) -> None:
    """GPT Image bills the prompt's text and the input images in tokens, gpt-4o-transcribe its prompt:
    genai-prices' prices (the table holds OpenAI's published ones as the fallback). DALL-E and Whisper
    bill none."""
    for model in ("gpt-image-1", "gpt-image-1-mini"):
        prices, known = catalog.models[model].prices, genai("openai", model)
        assert (prices.input_per_mtok, prices.input_image_per_mtok) == (known.input_mtok,
                                                                       known.input_image_mtok), model
    assert (catalog.models["gpt-image-1"].prices.input_per_mtok,
            catalog.models["gpt-image-1"].prices.input_image_per_mtok) == (Decimal(5), Decimal(10))
    for model in ("gpt-4o-transcribe", "gpt-4o-mini-transcribe"):
        assert catalog.models[model].prices.input_per_mtok == genai("openai", model).input_mtok
    table = load_catalog(use_genai_prices=False)
    assert table.models["gpt-image-1-mini"].prices.input_image_per_mtok == Decimal("2.50")
    assert table.models["gpt-4o-transcribe"].prices.input_per_mtok == Decimal("2.50")
    for model in ("dall-e-2", "dall-e-3", "whisper-1"):
        prices = catalog.models[model].prices
        assert prices.input_per_mtok is None and prices.input_image_per_mtok is None, model


def test_a_token_billed_image_model_needs_its_input_image_price_for_edits(tmp_path: Path) -> None:
    doc = base_document()
    doc["models"].append({"id": "img", "name": "I", "family": "local",
                          "operations": ["images.generations", "images.edits"],
                          "upstreams": [{"provider": "local", "model": "i"}],
                          "prices": {"per_image": {"1024x1024": "0.01"}, "input_per_mtok": "5"}})
    loaded = load_catalog(write(tmp_path, doc))
    assert "img" not in loaded.models
    assert any("img" in w and "input_image_per_mtok" in w for w in loaded.warnings), loaded.warnings
    doc["models"][-1]["prices"]["input_image_per_mtok"] = "10"
    assert load_catalog(write(tmp_path, doc)).models["img"].prices.input_image_per_mtok == Decimal(10)
    doc["models"][0]["prices"]["input_image_per_mtok"] = "10"  # a chat model: not one of its prices
    with pytest.raises(ValueError, match="'m-chat' field 'prices.input_image_per_mtok'"):
        load_catalog(write(tmp_path, doc))


def test_without_genai_prices_the_table_prices_everything() -> None:
    table = load_catalog(use_genai_prices=False)
    assert len(table.models) >= 80
    assert {m.prices.source for m in table.models.values()} == {"table"}
    assert table.models["gpt-4o-mini"].prices.input_per_mtok == Decimal("0.15")


def test_margin_multiplies_every_price(catalog: Catalog) -> None:
    marked = load_catalog(margin=Decimal("0.1"))
    factor = Decimal("1.1")
    for model_id, model in catalog.models.items():
        plain, up = model.prices, marked.models[model_id].prices
        for name in ("input_per_mtok", "output_per_mtok", "per_mchars", "per_minute", "per_call",
                     "per_second"):
            value = getattr(plain, name)
            assert getattr(up, name) == (None if value is None else value * factor), (model_id, name)
        assert up.per_image == {k: v * factor for k, v in plain.per_image.items()}
        assert up.input_tiers == tuple((t, p * factor) for t, p in plain.input_tiers)
    assert marked.models["gpt-4o-mini"].prices.input_per_mtok == Decimal("0.165")
    with pytest.raises(TypeError):
        load_catalog(margin=0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="margin"):
        load_catalog(margin=Decimal("-0.5"))


def test_dearest_upstream_sets_the_price(tmp_path: Path) -> None:
    doc = base_document()
    model = doc["models"][0]
    model["upstreams"] = [{"provider": "openai", "model": "gpt-4o-mini"}, {"provider": "local", "model": "x"}]
    # the local upstream is unknown to genai-prices: the table's price stands for it when dearer
    model["prices"] = {"input_per_mtok": "0.01", "output_per_mtok": "9"}
    priced = load_catalog(write(tmp_path, doc)).models["m-chat"].prices
    assert priced.input_per_mtok == genai("openai", "gpt-4o-mini").input_mtok
    assert priced.output_per_mtok == Decimal("9")
    assert priced.source == "genai-prices"


# --- models that cannot be priced are not sold --------------------------------------------------------


def test_a_model_without_a_price_is_left_out_with_a_warning(tmp_path: Path) -> None:
    doc = base_document()
    doc["models"] += [
        {"id": "no-output-price", "name": "X", "family": "local", "operations": ["chat.completions"],
         "context_window": 8192, "default_max_tokens": 512, "max_output_tokens": 4096,
         "upstreams": [{"provider": "local", "model": "x"}], "prices": {"input_per_mtok": "0.10"}},
        {"id": "zero-priced", "name": "Z", "family": "local", "operations": ["embeddings"],
         "context_window": 512,
         "upstreams": [{"provider": "local", "model": "z"}], "prices": {"input_per_mtok": "0"}},
        {"id": "no-image-price", "name": "I", "family": "local", "operations": ["images.generations"],
         "upstreams": [{"provider": "local", "model": "i"}]},
        # neither genai-prices nor the table has a price: not sold
        {"id": "unknown-to-all", "name": "U", "family": "openai", "operations": ["audio.speech"],
         "upstreams": [{"provider": "openai", "model": "no-such-model-xyz"}]},
    ]
    loaded = load_catalog(write(tmp_path, doc))
    assert list(loaded.models) == ["m-chat"]
    assert len(loaded.warnings) == 4
    for model_id, needs in (("no-output-price", "output_per_mtok"), ("zero-priced", "input_per_mtok"),
                            ("no-image-price", "per_image"), ("unknown-to-all", "per_mchars")):
        assert any(model_id in w and needs in w for w in loaded.warnings), (model_id, loaded.warnings)


# --- providers -----------------------------------------------------------------------------------------


def test_availability_names_the_variables_that_would_enable_a_model(catalog: Catalog) -> None:
    assert catalog.available("gpt-4o-mini", {}) == (False, ["OPENAI_API_KEY", "OPENROUTER_API_KEY"])
    assert catalog.available("gpt-4o-mini", {"openai": ProviderAccess(api_key="")}) == (
        False, ["OPENAI_API_KEY", "OPENROUTER_API_KEY"])
    assert catalog.available("gpt-4o-mini", {"openrouter": ProviderAccess(api_key="sk-or")}) == (True, [])
    assert catalog.available("claude-sonnet-4-5", {})[1] == ["ANTHROPIC_API_KEY", "OPENROUTER_API_KEY"]
    assert catalog.available("elevenlabs/sound-effects", {}) == (False, ["ELEVENLABS_API_KEY"])
    # a local server needs no key, but its URL: the table's default is only a guess
    assert catalog.available("local/llama3.2", {}) == (False, ["LOCAL_LLM_BASE_URL"])
    assert catalog.available("local/llama3.2", {"local": ProviderAccess(api_key="k")}) == (
        False, ["LOCAL_LLM_BASE_URL"])
    assert catalog.available("local/llama3.2", {"local": ProviderAccess(base_url="http://h:1/v1")}) == (
        True, [])
    with pytest.raises(KeyError):
        catalog.available("no-such-model", {})


def test_the_catalog_names_each_providers_variables_and_reads_none(catalog: Catalog) -> None:
    variables = catalog.provider_variables()
    assert set(variables) == set(catalog.providers)
    assert variables["openai"] == ProviderVariables(api_key="OPENAI_API_KEY", base_url="OPENAI_BASE_URL")
    assert variables["local"] == ProviderVariables(api_key="LOCAL_LLM_API_KEY", base_url="LOCAL_LLM_BASE_URL")
    assert "sk-secret" not in repr(ProviderAccess(api_key="sk-secret"))  # a key never reaches a log line


def test_the_assembly_reads_provider_access_from_the_environment(catalog: Catalog) -> None:
    from agent.app import provider_access

    access = provider_access(catalog, {"OPENAI_API_KEY": " sk-test ", "OPENROUTER_API_KEY": "  ",
                                       "LOCAL_LLM_BASE_URL": "http://127.0.0.1:8080/v1"})
    assert set(access) == set(catalog.providers)
    assert access["openai"] == ProviderAccess(api_key="sk-test")
    assert access["openrouter"] == ProviderAccess()  # blank is unset
    assert access["local"] == ProviderAccess(base_url="http://127.0.0.1:8080/v1")


def test_provider_presets_and_base_url_override(catalog: Catalog) -> None:
    p = catalog.providers
    none = ProviderAccess()
    expected = {
        "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY"),
        "openrouter": ("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
        "anthropic": ("https://api.anthropic.com/v1", "ANTHROPIC_API_KEY"),
        "gemini": ("https://generativelanguage.googleapis.com/v1beta/openai", "GEMINI_API_KEY"),
        "groq": ("https://api.groq.com/openai/v1", "GROQ_API_KEY"),
        "together": ("https://api.together.xyz/v1", "TOGETHER_API_KEY"),
        "deepseek": ("https://api.deepseek.com/v1", "DEEPSEEK_API_KEY"),
        "mistral": ("https://api.mistral.ai/v1", "MISTRAL_API_KEY"),
        "xai": ("https://api.x.ai/v1", "XAI_API_KEY"),
        "fireworks": ("https://api.fireworks.ai/inference/v1", "FIREWORKS_API_KEY"),
        "elevenlabs": ("https://api.elevenlabs.io", "ELEVENLABS_API_KEY"),
    }
    for key, (url, key_env) in expected.items():
        assert (p[key].url(none), p[key].api_key_env, p[key].key_required) == (url, key_env, True)
        assert p[key].kind == ("elevenlabs" if key == "elevenlabs" else "openai")
        assert not p[key].usable(none) and p[key].usable(ProviderAccess(api_key="k"))
    assert p["openai"].url(ProviderAccess(base_url="http://127.0.0.1:9911/v1/")) == "http://127.0.0.1:9911/v1"
    # the field each chat API takes the output cap in when the caller names none: OpenAI's refuses
    # max_tokens for its reasoning models, the others take max_tokens
    assert {key: spec.cap_field for key, spec in p.items()} == {
        key: "max_completion_tokens" if key == "openai" else "max_tokens" for key in p}
    local = p["local"]
    assert (local.key_required, local.usable(none), local.url(none)) == (False, False, "http://127.0.0.1:11434/v1")
    assert local.usable(ProviderAccess(base_url="http://127.0.0.1:8080/v1"))
    assert local.url(ProviderAccess(base_url="http://127.0.0.1:8080/v1")) == "http://127.0.0.1:8080/v1"


# --- strict validation ---------------------------------------------------------------------------------


def _set(path: str, value: Any) -> Any:
    def mutate(doc: dict[str, Any]) -> None:
        target: Any = doc["models"][0]
        *parents, last = path.split(".")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    return mutate


@pytest.mark.parametrize(("mutate", "field"), [
    (_set("operations", ["chat.completions", "images.variations"]), "operations"),
    (_set("upstreams", [{"provider": "nowhere", "model": "x"}]), "upstreams[0].provider"),
    (_set("upstreams", []), "upstreams"),
    (_set("prices.input_per_mtok", 0.5), "prices.input_per_mtok"),
    (_set("prices.input_per_mtok", "cheap"), "prices.input_per_mtok"),
    (_set("prices.output_per_mtok", "-1"), "prices.output_per_mtok"),
    (_set("prices.per_image", {"1024x1024": "0.04"}), "prices.per_image"),
    (_set("prices.per_token", "1"), "prices.per_token"),
    (_set("default_max_tokens", 8192), "default_max_tokens"),
    (_set("max_output_tokens", None), "max_output_tokens"),
    (_set("context_window", "big"), "context_window"),
    (_set("colour", "red"), "colour"),
])
def test_validation_errors_name_the_file_the_model_and_field(tmp_path: Path, mutate: Any, field: str) -> None:
    doc = base_document()
    mutate(doc)
    path = write(tmp_path, doc)
    with pytest.raises(CatalogError) as error:
        load_catalog(path, use_genai_prices=False)
    message = str(error.value)
    assert message.startswith(f"{path}: ") and f"model 'm-chat' field '{field}" in message, message
    assert len(error.value.problems) == 1, message


def test_one_error_lists_every_problem_of_the_file_and_what_is_accepted(tmp_path: Path) -> None:
    doc = base_document()
    doc["providers"]["openai"]["kind"] = "grpc"
    doc["models"][0].update(colour="red", default_max_tokens=8192)
    doc["models"][0]["prices"]["input_per_mtok"] = 0.5
    doc["models"].append({"id": "m-embed", "name": "E", "family": "local", "operations": ["embeddings"],
                          "context_window": 512, "max_output_tokens": 10,
                          "upstreams": [{"provider": "nowhere", "model": "e"}],
                          "prices": {"input_per_mtok": "0.02", "per_image": {"1024x1024": "0.04"}}})
    doc["models"].append({"id": "m-sound", "name": "S", "family": "local",
                          "operations": ["audio.generations"], "prices": {"per_call": "0.01"},
                          "upstreams": [{"provider": "local", "model": "s"}]})
    path = write(tmp_path, doc)
    with pytest.raises(CatalogError) as error:
        load_catalog(path, use_genai_prices=False)
    assert error.value.path == path
    assert error.value.problems == [
        "provider 'openai' field 'kind': input should be 'openai' or 'elevenlabs', got 'grpc'",
        "model 'm-chat' field 'prices.input_per_mtok': must be a decimal string such as \"0.15\" "
        "(not a JSON number), got 0.5",
        "model 'm-chat' field 'colour': unknown field (known: id, name, family, operations, context_window, "
        "default_max_tokens, max_output_tokens, upstreams, prices, notes)",
        "model 'm-embed' field 'max_output_tokens': only models that generate tokens (chat, completions, "
        "edits) have output limits",
        "model 'm-embed' field 'upstreams[0].provider': unknown provider 'nowhere' (known: openai, local)",
        "model 'm-embed' field 'prices.per_image': not used by any of the model's operations "
        "(embeddings: input_per_mtok)",
        "model 'm-sound' field 'upstreams[0].provider': audio.generations needs a provider of kind "
        "'elevenlabs'",
    ]
    assert str(error.value).startswith(f"{path}: 7 problems in the model table:\n  - provider 'openai'")


@pytest.mark.parametrize(("text", "problem"), [
    ("{not json", "cannot read the model table"),
    ("[]", "the model table must be a JSON object"),
    ('{"providers": {}, "models": []}', "top level field 'providers': must not be empty"),
    ('{"providers": {"p": {}}, "models": [], "version": 1, "extra": 1}',
     "top level field 'extra': unknown field (known: version, notes, providers, models)"),
])
def test_a_broken_file_is_one_clear_error(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "models.json"
    path.write_text(text)
    with pytest.raises(CatalogError, match=re.escape(problem)) as error:
        load_catalog(path)
    assert str(error.value).startswith(f"{path}: ")


def test_a_bad_model_table_stops_startup_with_a_configuration_error(tmp_path: Path) -> None:
    from agent.app import build_registry
    from agent.settings import ConfigError, Settings

    doc = base_document()
    doc["models"][0]["context_window"] = "big"
    doc["models"][0]["upstreams"] = []
    settings = Settings.from_env({"PAYWIRE_MODELS_FILE": str(write(tmp_path, doc)),
                                  "PAYWIRE_DATA_DIR": str(tmp_path)})
    with pytest.raises(ConfigError) as error:
        build_registry(settings, UpstreamClient())
    assert "2 problems" in str(error.value) and "'context_window'" in str(error.value)
    assert "'upstreams': must not be empty" in str(error.value)


def test_validation_of_ids_providers_and_kinds(tmp_path: Path) -> None:
    doc = base_document()
    doc["models"].append(copy.deepcopy(doc["models"][0]))
    with pytest.raises(ValueError, match="'m-chat' field 'id': duplicate"):
        load_catalog(write(tmp_path, doc))

    doc = base_document()
    doc["providers"]["sfx"] = {"kind": "elevenlabs", "base_url": "https://api.elevenlabs.io/v1",
                               "api_key_env": "ELEVENLABS_API_KEY", "base_url_env": "ELEVENLABS_BASE_URL"}
    doc["models"][0]["upstreams"] = [{"provider": "sfx", "model": "eleven_text_to_sound_v2"}]
    with pytest.raises(ValueError,
                       match=r"'m-chat' field 'upstreams\[0\].provider'.*serves only audio.generations"):
        load_catalog(write(tmp_path, doc))

    doc = base_document()
    doc["providers"]["openai"]["base_url"] = "api.openai.com"
    with pytest.raises(ValueError, match="provider 'openai' field 'base_url'"):
        load_catalog(write(tmp_path, doc))

    doc = base_document()
    del doc["providers"]["openai"]["api_key_env"]
    with pytest.raises(ValueError, match="provider 'openai' field 'api_key_env'"):
        load_catalog(write(tmp_path, doc))

    doc = base_document()  # a keyless server is usable once its URL is set: the variable is needed
    del doc["providers"]["local"]["base_url_env"]
    with pytest.raises(ValueError, match="provider 'local' field 'base_url_env': required when "
                                         "key_required is false"):
        load_catalog(write(tmp_path, doc))

    doc = base_document()
    doc["providers"]["openai"]["cap_field"] = "max_output_tokens"
    with pytest.raises(ValueError, match="provider 'openai' field 'cap_field'"):
        load_catalog(write(tmp_path, doc))


def test_model_spec_is_a_plain_value(catalog: Catalog) -> None:
    spec = catalog.models["gpt-4o-mini"]
    assert isinstance(spec, ModelSpec)
    assert [(u.provider, u.model) for u in spec.upstreams] == [("openai", "gpt-4o-mini"),
                                                               ("openrouter", "openai/gpt-4o-mini")]
    assert spec.operations == ("chat.completions", "edits")
    assert (spec.context_window, spec.max_output_tokens) == (128000, 16384)


def test_upstream_cost_takes_the_margin_off_and_fits_the_ledger_column() -> None:
    marked = load_catalog(margin=Decimal("0.25")).models["gpt-4o-mini"]
    plain = load_catalog().models["gpt-4o-mini"]
    sold = Decimal(1234) * marked.prices.input_per_mtok / 1_000_000
    assert marked.upstream_cost(sold) == (Decimal(1234) * plain.prices.input_per_mtok
                                          / 1_000_000).quantize(Decimal("1e-10"))
    assert len(str(marked.upstream_cost(Decimal(1) / Decimal(3)))) <= 32


# --- model skills: provider access in, targets built once ------------------------------------------------


def test_targets_follow_the_upstream_order_and_the_access_given(catalog: Catalog) -> None:
    spec = catalog.models["gpt-4o-mini"]
    assert model_targets(catalog, spec, {}) == ()
    both = {"openai": ProviderAccess(api_key="sk-o", base_url="http://127.0.0.1:9911/v1/"),
            "openrouter": ProviderAccess(api_key="sk-or")}
    assert model_targets(catalog, spec, both) == (
        Target("openai", "http://127.0.0.1:9911/v1", "gpt-4o-mini", "sk-o", "max_completion_tokens",
               "OPENAI_BASE_URL"),
        Target("openrouter", "https://openrouter.ai/api/v1", "openai/gpt-4o-mini", "sk-or", "max_tokens",
               "OPENROUTER_BASE_URL"))
    # a keyless local server is a target once its base URL is configured
    local = catalog.models["local/llama3.2"]
    assert model_targets(catalog, local, {}) == ()
    assert [t.base_url for t in model_targets(
        catalog, local, {"local": ProviderAccess(base_url="http://127.0.0.1:8080/v1")})] == [
        "http://127.0.0.1:8080/v1"]


def test_an_unconfigured_model_is_listed_and_refused_before_any_quote(catalog: Catalog) -> None:
    skills = {s.id: s for s in build_model_skills(catalog, UpstreamClient(),
                                                  {"openai": ProviderAccess(api_key="sk-o")})}
    assert len(skills) == len(catalog.models)
    body = {"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}]}
    claude = skills["claude-sonnet-4-5"]
    info = claude.info() if claude.info else {}
    assert (info["available"], info["enable_with"]) == (False, ["ANTHROPIC_API_KEY", "OPENROUTER_API_KEY"])
    claude.validate(body)  # validated as usual (a bad body is still a 400 first)
    for call in (lambda: claude.price(body), lambda: asyncio.run(claude.operation().run(body))):
        with pytest.raises(SkillUnavailableError, match="set ANTHROPIC_API_KEY or OPENROUTER_API_KEY"):
            call()
    mini = skills["gpt-4o-mini"]
    assert mini.info and mini.info()["available"] is True and "enable_with" not in mini.info()
    assert mini.price({**body, "model": "gpt-4o-mini"}) > 0


def test_a_free_model_costs_nothing_but_still_needs_its_provider(catalog: Catalog) -> None:
    free = frozenset({"gpt-4o-mini", "deepseek-chat"})
    skills = {s.id: s for s in build_model_skills(catalog, UpstreamClient(),
                                                  {"openai": ProviderAccess(api_key="sk-o")}, free=free)}
    body = {"messages": [{"role": "user", "content": "hi"}]}
    assert skills["gpt-4o-mini"].price(body) == 0
    with pytest.raises(SkillUnavailableError, match="DEEPSEEK_API_KEY"):
        skills["deepseek-chat"].price(body)
