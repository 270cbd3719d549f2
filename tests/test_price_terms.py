"""The one price description (agent/pipeline/price_terms.py): fixed prices, model operations' declared bounds
and rules taken from the pricers' own constants, priced resources, exact atomic units, and a route's
terms over every model that serves it."""

from __future__ import annotations

import json
from decimal import Decimal
from functools import cache
from typing import Any

import pytest

from agent.pipeline.catalogue import Catalogue
from agent.pipeline.price_terms import MODEL_PRICES, PaymentOption, PriceTerms, price_terms, route_terms
from payments.money import usd_to_atomic
from payments.networks import BASE, SOLANA
from skills.errors import SkillInputError
from skills.models import load_catalog
from skills.models.media_ops import IMAGE_RULE, SPEECH_RULE, SPEECH_USD, image_price, speech_price
from skills.models.model_skills import build_model_skills
from skills.models.token_quotes import EMBEDDINGS_RULE, MAX_USD, MIN_USD, TOKEN_RULE
from skills.registry import SkillRegistry
from skills.resource_files import BUILTIN_DIR, load_resource_dirs
from skills.skill import Skill, SkillResult
from tests.support.fake_upstream import FakeUpstream

OPTIONS = (PaymentOption.of(BASE), PaymentOption.of(SOLANA, "DevnetUsdcMint1111111111111111111111111111"))


async def _run(payload: dict[str, Any]) -> SkillResult:
    return SkillResult(body={})


def _skill(**kwargs: Any) -> Skill:
    return Skill(id=kwargs.pop("id", "thing"), name="Thing", description="d", categories=("Tools",),
                 run=_run, **kwargs)


@cache
def _models() -> dict[str, Skill]:
    # every provider keyless-free: unavailable models keep their declared terms (they are listed)
    return {s.id: s for s in build_model_skills(load_catalog(), FakeUpstream(), {})}


def _model_with(operation: str) -> Skill:
    return next(s for s in _models().values() if operation in s.operations)


def test_a_fixed_price_in_usd_text_and_exact_atomic_units() -> None:
    terms = price_terms(_skill(price_usd=Decimal("0.0115")), None, OPTIONS)
    assert terms.pricing == "fixed" and terms.paid
    shown = terms.as_json()
    assert shown["price"] == {"usd": "0.0115", "atomic": "11500"}
    assert shown["scheme"] == "exact" and "min" not in shown and "computed" not in shown
    assert shown["networks"] == [BASE.caip2, SOLANA.caip2]
    assert shown["assets"] == [
        {"network": BASE.caip2, "asset": BASE.usdc, "symbol": "USDC", "decimals": 6},
        {"network": SOLANA.caip2, "asset": "DevnetUsdcMint1111111111111111111111111111", "symbol": "USDC",
         "decimals": 6}]
    assert shown["summary"] == "$0.0115 per call, in USDC on Base or Solana"


@pytest.mark.parametrize(("usd", "atomic"), [("0.062101", "62101"), ("0.0000001", "1"),
                                             ("0.00575", "5750"), ("12345678.9", "12345678900000")])
def test_atomic_units_round_up_like_the_quote_and_never_use_exponents(usd: str, atomic: str) -> None:
    shown = price_terms(_skill(price_usd=Decimal(usd)), None, OPTIONS).as_json()
    assert shown["price"]["atomic"] == atomic == str(usd_to_atomic(Decimal(usd)))
    assert "E" not in shown["price"]["usd"] and "e" not in shown["price"]["usd"]
    json.dumps(shown)  # plain JSON: strings only, no Decimal


def test_a_free_skill_is_free_and_unpaid() -> None:
    terms = price_terms(_skill(price_usd=Decimal(0)), None, OPTIONS)
    assert terms.pricing == "free" and not terms.paid and terms.summary == "free"
    assert terms.as_json()["price"] == {"usd": "0", "atomic": "0"}


def test_a_model_chat_operation_declares_the_token_quote_bounds_and_rule() -> None:
    model = _model_with("chat.completions")
    shown = price_terms(model, "chat.completions", OPTIONS).as_json()
    assert shown["pricing"] == "per_request" and "price" not in shown
    assert shown["min"] == {"usd": "0.0001", "atomic": "100"} == {
        "usd": format(MIN_USD, "f"), "atomic": str(usd_to_atomic(MIN_USD))}
    assert shown["max"] == {"usd": "0.5", "atomic": "500000"}
    assert Decimal(shown["max"]["usd"]) == MAX_USD
    assert shown["computed"] == TOKEN_RULE and shown["model_prices"] == MODEL_PRICES
    assert shown["summary"].startswith("priced per request (from $0.0001 to $0.5): estimated input tokens")
    # the default operation of a model is its first one
    assert price_terms(model, None, OPTIONS) == price_terms(model, next(iter(model.operations)), OPTIONS)


def test_every_model_operation_declares_its_terms_and_no_quote_falls_outside() -> None:
    undeclared = [(s.id, name) for s in _models().values() for name, op in s.operations.items()
                  if op.price_floor_usd is None or op.price_rule is None]
    assert undeclared == []
    embeddings = price_terms(_model_with("embeddings"), "embeddings", OPTIONS)
    assert embeddings.rule == EMBEDDINGS_RULE
    speaker = _model_with("audio.speech")
    speech = price_terms(speaker, "audio.speech", OPTIONS)
    assert (speech.min_usd, speech.max_usd, speech.rule) == (*SPEECH_USD, SPEECH_RULE)
    spec = load_catalog().models[speaker.id]
    assert speech_price({"input": "hi"}, spec) >= speech.min_usd  # the floor is the pricer's floor


def test_image_operations_have_the_cheapest_image_as_minimum_and_no_maximum() -> None:
    painter = _model_with("images.generations")
    terms = price_terms(painter, "images.generations", OPTIONS)
    spec = load_catalog().models[painter.id]
    assert terms.min_usd == min(spec.prices.per_image.values()) and terms.max_usd is None
    assert terms.rule == IMAGE_RULE and "max" not in terms.as_json()
    for key in spec.prices.per_image:  # every single image costs at least the minimum
        size, _, quality = key.partition("/")
        assert image_price({"prompt": "x", "size": size, "quality": quality or None}, spec) >= terms.min_usd


def test_a_resource_priced_by_a_pricer_shows_its_declared_bounds_or_says_the_402_tells() -> None:
    declared = _skill(pricer=lambda p: Decimal("0.01"), price_floor_usd=Decimal("0.002"),
                      price_cap_usd=Decimal("0.2"), price_rule="0.002 per 1,000 characters of text")
    shown = price_terms(declared, None, OPTIONS).as_json()
    assert shown["pricing"] == "per_request"
    assert shown["min"] == {"usd": "0.002", "atomic": "2000"} and shown["max"]["atomic"] == "200000"
    assert shown["computed"] == "0.002 per 1,000 characters of text" and "model_prices" not in shown
    bare = price_terms(_skill(pricer=lambda p: Decimal("0.01")), None, OPTIONS).as_json()
    assert "min" not in bare and "402" in bare["computed"]
    # a pricer wins over a price (as in Skill.price): the description follows what is charged
    both = price_terms(_skill(price_usd=Decimal("1"), pricer=lambda p: Decimal("0.01")), None, OPTIONS)
    assert both.pricing == "per_request"


def test_builtin_resources_are_fixed_at_their_files_price() -> None:
    registry = SkillRegistry()
    load_resource_dirs(registry, [BUILTIN_DIR])
    catalogue = Catalogue(registry, payment_options=OPTIONS)
    for skill in registry.all():
        terms = catalogue.price_terms(skill)
        assert terms.pricing == "fixed" and terms.price_usd == skill.price_usd, skill.id
    token_count = catalogue.price_terms(registry.get("token-count-508"))  # type: ignore[arg-type]
    assert token_count.as_json()["price"] == {"usd": "0.00575", "atomic": "5750"}


def test_an_unknown_operation_is_refused_naming_the_field() -> None:
    with pytest.raises(SkillInputError) as caught:
        price_terms(_model_with("chat.completions"), "no.such", OPTIONS)
    assert caught.value.field == "operation"


def test_a_routes_terms_span_every_model_that_serves_it() -> None:
    registry = SkillRegistry()
    for skill in _models().values():
        registry.add(skill)
    catalogue = Catalogue(registry, payment_options=OPTIONS)
    chat = catalogue.route_price_terms("chat.completions")
    assert chat is not None and (chat.min_usd, chat.max_usd, chat.rule) == (MIN_USD, MAX_USD, TOKEN_RULE)
    images = catalogue.route_price_terms("images.generations")
    cheapest = min(price_terms(s, "images.generations", OPTIONS).min_usd or 0 for s in _models().values()
                   if "images.generations" in s.operations)
    assert images is not None and images.min_usd == cheapest and images.max_usd is None
    assert catalogue.route_price_terms("no.such") is None


def test_route_terms_merge_fixed_free_and_ranges() -> None:
    fixed = PriceTerms("fixed", price_usd=Decimal("0.01"), options=OPTIONS)
    free = PriceTerms("free", price_usd=Decimal(0), options=OPTIONS)
    ranged = PriceTerms("per_request", min_usd=Decimal("0.001"), max_usd=Decimal("0.5"), rule="r",
                        options=OPTIONS)
    assert route_terms([fixed, fixed]) == fixed
    assert route_terms([free]) == free
    mixed = route_terms([fixed, free, ranged])
    assert mixed is not None and mixed.pricing == "per_request"
    assert (mixed.min_usd, mixed.max_usd, mixed.rule) == (Decimal(0), Decimal("0.5"), "r")
    open_ended = route_terms([ranged, PriceTerms("per_request", min_usd=Decimal("0.002"), options=OPTIONS)])
    assert open_ended is not None and open_ended.max_usd is None and open_ended.min_usd == Decimal("0.001")
