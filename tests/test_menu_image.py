"""restaurant-menu-image-generate: paid on the devnet against the OpenAI-compatible stand-in (the image
checked, the upstream given the built prompt, size, model and quality); unsafe prompts, bad input and a
missing key refused before any quote; an upstream failure not charged; the image model's cost kept below
the price; the safety classifier on tables of safe food prompts and tricky unsafe ones."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from skills.errors import SkillInputError, SkillUnavailableError, UpstreamError
from skills.models import ProviderAccess, load_catalog
from skills.models.model_skills import build_model_skills
from skills.models.upstream import UpstreamClient
from skills.resource_context import ResourceContext
from skills.resource_files import check_resource
from skills.resources import image_safety, menu_image
from skills.resources.image_safety import classify
from skills.resources.menu_image import (
    MAX_PROMPT_CHARS,
    MODEL_ENV,
    PRICE_USD,
    SIZES,
    STYLES,
    build_prompt,
    image_operation,
    model_body,
    validate,
)
from skills.skill import Operation, Skill, SkillResult
from tests.support.live_server import LiveServer, start_server
from tests.support.openai_upstream import OpenAIUpstream, tiny_png, word_tokens
from tests.support.paying import EVM_NET, client_for, header, post_paid, quote, receipt, sign

KEY = "sk-test"
RESOURCE = "restaurant-menu-image-generate"
PRICE_ATOMIC = 11500  # $0.0115 in USDC's 6 decimals
RESOURCE_FILE = Path(menu_image.__file__).parents[1] / "builtin" / f"{RESOURCE}.json"
RAMEN = {"prompt": "Bowl of tonkotsu ramen with a soft-boiled egg", "style": "overhead",
         "cuisine": "Japanese", "size": "1536x1024"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[OpenAIUpstream]:
    with OpenAIUpstream("openai") as up:
        yield up


@pytest.fixture(scope="module")
def gateway(upstream: OpenAIUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("menu-image"),
                        env={"OPENAI_BASE_URL": upstream.url, "OPENAI_API_KEY": KEY})
    yield live
    live.stop()


@pytest.fixture(autouse=True)
def _reset(upstream: OpenAIUpstream) -> None:
    upstream.reset()
    upstream.behaviour.require_key = KEY


def _url(live: LiveServer) -> str:
    return f"{live.url}/v1/marketplace/api/{RESOURCE}"


def _balance(live: LiveServer) -> int:
    return int(live.devnet.merchant_balances().evm)


def _signed(live: LiveServer, body: dict[str, Any]) -> str:
    _, required = quote(_url(live), body)
    assert {a.amount for a in required.accepts} == {str(PRICE_ATOMIC)}
    client = client_for(live.url, evm_key=live.devnet.keys.evm_payer)
    return header(sign(client, required, EVM_NET))


def _refused_before_quote(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert "PAYMENT-REQUIRED" not in r.headers and "PAYMENT-RESPONSE" not in r.headers
    error: dict[str, Any] = r.json()["error"]
    return error


# ------------------------------------------------------------------------------------------ paid calls


def test_a_paid_call_makes_the_image_of_the_dish_and_earns_exactly_the_price(
        gateway: LiveServer, upstream: OpenAIUpstream) -> None:
    payment = _signed(gateway, RAMEN)
    before = _balance(gateway)
    r = post_paid(_url(gateway), RAMEN, payment)
    assert r.status_code == 200, r.text
    assert _balance(gateway) - before == PRICE_ATOMIC
    assert receipt(r)["success"] is True

    [sent] = upstream.requests_to("/images/generations")
    built = build_prompt(RAMEN)
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.json == {"model": "gpt-image-1-mini", "prompt": built, "size": "1536x1024",
                         "quality": "low", "n": 1}
    assert "tonkotsu ramen with a soft-boiled egg, Japanese cuisine" in built
    assert built.startswith("An overhead flat-lay food photograph of ")
    assert built.endswith("No people, text, logos or watermarks.")

    out = r.json()
    assert (out["model"], out["size"], out["quality"], out["style"]) == (
        "gpt-image-1-mini", "1536x1024", "low", "overhead")
    assert out["prompt"] == built and out["prompt_revised"] is False
    [image] = out["images"]
    png = base64.b64decode(image["b64_json"], validate=True)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and image["media_type"] == "image/png"
    assert png == tiny_png(f"gpt-image-1-mini\0{built}\0{'1536x1024'}\0{0}")  # this prompt's image

    [row] = gateway.ledger_rows(skill_id=RESOURCE, state="settled")
    assert row["amount_atomic"] == PRICE_ATOMIC
    # one 1536x1024 low image, and the prompt's text tokens (as the upstream reported them)
    text = Decimal(word_tokens(built)) * load_catalog().models["gpt-image-1-mini"].prices.input_per_mtok
    assert Decimal(row["upstream_cost_usd"]) == Decimal("0.006") + text / 1_000_000
    assert row["usage"]["upstream_model"] == "gpt-image-1-mini"


def test_an_upstream_failure_is_not_charged_and_the_same_payment_can_retry(
        gateway: LiveServer, upstream: OpenAIUpstream) -> None:
    body = {"prompt": "Chicken breast with blood orange salsa"}
    payment = _signed(gateway, body)
    before = _balance(gateway)
    upstream.behaviour.fail(500, 503)  # the first try and the client's one retry
    r = post_paid(_url(gateway), body, payment)
    error = _refused_before_quote(r, 502)
    assert "nothing was charged" in error["message"]
    assert _balance(gateway) == before
    [row] = [x for x in gateway.ledger_rows(skill_id=RESOURCE) if x["state"] != "settled"]
    assert row["state"] == "released" and "500" in row["error"]
    assert len(upstream.requests_to("/images/generations")) == 2

    r = post_paid(_url(gateway), body, payment)  # a released claim may be retried: served, paid once
    assert r.status_code == 200, r.text
    assert _balance(gateway) - before == PRICE_ATOMIC


# ------------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(("body", "category"), [
    ({"prompt": "a chef k1lling a waiter with a cleaver"}, "violence"),
    ({"prompt": "a n.a.k.e.d waitress serving burgers"}, "sexual"),
    ({"prompt": "swastika latte art"}, "hate"),
    ({"prompt": "lines of coke next to a cocktail"}, "drugs"),
    ({"prompt": "pasta", "cuisine": "cannibal"}, "violence"),
])
def test_an_unsafe_prompt_is_400_before_the_quote_and_never_reaches_the_model(
        gateway: LiveServer, upstream: OpenAIUpstream, body: dict[str, Any], category: str) -> None:
    field = "cuisine" if "cuisine" in body else "prompt"
    error = _refused_before_quote(httpx.post(_url(gateway), json=body), 400)
    assert error["param"] == field
    assert f"field '{field}'" in error["message"] and f"refused: {category}" in error["message"]
    # with a payment signed for a safe request, still refused before anything is claimed
    payment = _signed(gateway, {"prompt": "a bowl of pho"})
    before, rows = _balance(gateway), len(gateway.ledger_rows())
    _refused_before_quote(post_paid(_url(gateway), body, payment), 400)
    assert _balance(gateway) == before and len(gateway.ledger_rows()) == rows  # nothing claimed
    assert upstream.requests == []


@pytest.mark.parametrize(("body", "param", "named"), [
    ({"style": "photo"}, "prompt", "'prompt' is a required property"),
    ({"prompt": "   "}, "prompt", "field 'prompt' is required"),
    ({"prompt": "p" * (MAX_PROMPT_CHARS + 1)}, "prompt", "is longer than 600 characters"),
    ({"prompt": "pizza", "size": "256x256"}, "size", "is not one of"),
    ({"prompt": "pizza", "size": "2048x2048"}, "size", "is not one of"),
    ({"prompt": "pizza", "style": "cubist"}, "style", "is not one of"),
    ({"prompt": "pizza", "n": 2}, "n", "1 was expected"),
    ({"prompt": "pizza", "cuisine": "Italian (no text)"}, "cuisine", "a few words"),
    ({"prompt": "pizza", "cuisine": "y" * 41}, "cuisine", "is longer than 40 characters"),
    ({"prompt": "pizza", "colour": "red"}, "colour", "'colour' was unexpected"),  # refused, not ignored
])
def test_bad_input_is_400_before_the_quote(gateway: LiveServer, upstream: OpenAIUpstream,
                                            body: dict[str, Any], param: str | None, named: str) -> None:
    error = _refused_before_quote(httpx.post(_url(gateway), json=body), 400)
    assert error["param"] == param and named in error["message"], error
    assert upstream.requests == []


def test_without_a_provider_key_it_is_503_before_any_quote(server: LiveServer) -> None:
    """The session's default gateway has no OPENAI_API_KEY."""
    for body in ({"prompt": "a bowl of pho"}, {}):  # a call, and an empty-body price probe
        error = _refused_before_quote(httpx.post(_url(server), json=body), 503)
        assert "OPENAI_API_KEY" in error["message"] and "gpt-image-1-mini" in error["message"]


# ------------------------------------------------------------------------------------------ the model


def _context(env: dict[str, str]) -> ResourceContext:
    providers = {"openai": ProviderAccess(api_key=env.get("OPENAI_API_KEY"))}
    skills = {s.id: s for s in build_model_skills(load_catalog(), UpstreamClient(), providers)}
    return ResourceContext(environ=env, find_skill=skills.get)


def test_every_size_costs_the_default_model_less_than_the_price() -> None:
    spec = load_catalog().models["gpt-image-1-mini"]
    costs = [spec.prices.image_price(size, "low") for size in SIZES]
    assert all(c is not None and c < PRICE_USD for c in costs), costs
    model_id, _ = image_operation(_context({"OPENAI_API_KEY": KEY}))
    assert model_id == "gpt-image-1-mini"


@pytest.mark.parametrize(("model", "reason"), [
    ("dall-e-2", "costs $0.020"),  # $0.016-$0.020 an image: above the price at every size
    ("gpt-image-1", "costs $0.01761"),  # 1024x1024 low: $0.011 + the longest prompt's 1,322 tokens at $5/1M
    ("dall-e-3", "cannot make 1024x1024 images at low quality"),  # standard or hd only
    ("gpt-4o-mini", "not an image model"),
    ("no-such-model", "not an image model"),
])
def test_a_model_that_cannot_serve_every_size_below_the_price_is_503(model: str, reason: str) -> None:
    context = _context({"OPENAI_API_KEY": KEY, MODEL_ENV: model})
    with pytest.raises(SkillUnavailableError, match=re.escape(reason)) as refused:
        menu_image.ready(context)
    assert MODEL_ENV in str(refused.value)


class _FakeImages:
    """A model skill whose images.generations answers what a test sets."""

    def __init__(self, answer: dict[str, Any] | Exception) -> None:
        self.answer = answer
        self.bodies: list[dict[str, Any]] = []
        self.skill = Skill(id="fake-image", name="Fake", description="d", categories=("Image",),
                           kind="model", run=self.run,
                           operations={"images.generations": Operation(
                               "images.generations", self.run, lambda body: Decimal("0.004"))})

    async def run(self, body: dict[str, Any]) -> SkillResult:
        self.bodies.append(body)
        if isinstance(self.answer, Exception):
            raise self.answer
        return SkillResult(body=self.answer, usage={"images": 1}, upstream_cost_usd=Decimal("0.004"))

    def context(self) -> ResourceContext:
        return ResourceContext(environ={MODEL_ENV: "fake-image"},
                               find_skill={"fake-image": self.skill}.get)


async def test_a_url_answer_and_the_models_revised_prompt_are_passed_on() -> None:
    fake = _FakeImages({"data": [{"url": "https://img.example/1.png",
                                  "revised_prompt": "A steaming bowl of pho, overhead"}]})
    result = await menu_image.run({"prompt": "a bowl of pho"}, fake.context())
    assert fake.bodies == [model_body("fake-image", build_prompt({"prompt": "a bowl of pho"}),
                                      "1024x1024")]
    assert result.body["images"] == [{"url": "https://img.example/1.png"}]
    assert result.body["prompt"] == "A steaming bowl of pho, overhead"
    assert result.body["prompt_revised"] is True
    assert result.usage == {"images": 1} and result.upstream_cost_usd == Decimal("0.004")


@pytest.mark.parametrize("answer", [
    {"data": []}, {"data": [{"b64_json": "not base64!"}]}, {"data": [{}]}, {"error": "x"},
    UpstreamError("every upstream failed"),
])
async def test_no_image_is_an_upstream_error_so_nothing_is_charged(answer: Any) -> None:
    with pytest.raises(UpstreamError):
        await menu_image.run({"prompt": "a bowl of pho"}, _FakeImages(answer).context())


# ------------------------------------------------------------------------------------------ the prompt


def test_the_template_frames_the_dish_and_leaves_out_people_and_text_unless_asked() -> None:
    plain = build_prompt({"prompt": "A rustic margherita pizza on a wooden board."})
    assert plain == ("A professional food photograph of a rustic margherita pizza on a wooden board. "
                     "Natural soft light, shallow depth of field, appetising restaurant-quality plating, "
                     "high detail. No people, text, logos or watermarks.")
    chef = build_prompt({"prompt": "a chef plating tuna tartare", "style": "interior"})
    assert chef.startswith("An interior photograph of a restaurant: a chef plating")
    assert chef.endswith("No text, logos or watermarks.")
    board = build_prompt({"prompt": 'a chalkboard reading "Specials" over a bowl of pho'})
    assert board.endswith("No people or watermarks.")
    menu = build_prompt({"prompt": "lemon tart", "style": "menu-card", "cuisine": "French"})
    assert "lemon tart, French cuisine." in menu and "empty space" in menu


def test_the_longest_request_builds_a_prompt_any_image_model_takes() -> None:
    longest = max(STYLES, key=lambda s: sum(map(len, STYLES[s])))
    built = build_prompt({"prompt": "x" * MAX_PROMPT_CHARS, "cuisine": "y" * 40, "style": longest})
    assert len(built) <= 1000  # DALL-E 2's limit, the smallest


def test_the_resource_file_matches_the_handler() -> None:
    data = json.loads(RESOURCE_FILE.read_text())
    assert check_resource(data) == []
    assert (data["kind"], data["handler"]) == ("python", "skills.resources.menu_image")
    assert Decimal(data["price"]) == PRICE_USD
    props = data["input_schema"]["properties"]
    assert tuple(props["size"]["enum"]) == SIZES and tuple(props["style"]["enum"]) == tuple(STYLES)
    assert props["prompt"]["maxLength"] == MAX_PROMPT_CHARS
    for example in data["examples"]:
        validate(example)


# ------------------------------------------------------------------------------------------ the classifier

SAFE = [
    "breast of chicken with tarragon cream", "pan-seared duck breast with cherry jus",
    "boneless chicken breasts for the kids menu", "crispy chicken thighs", "a classic hot dog",
    "a shot of espresso", "tequila shots with lime", "blood orange and fennel salad",
    "killer burger with bacon jam", "dirty martini with three olives", "spotted dick with custard",
    "faggots and peas in onion gravy", "a faggot of herbs in the stock", "a Bloody Mary",
    "a bloody good burger", "Sex on the Beach cocktail in a hurricane glass", "naked cake with berries",
    "naked chocolate cake for a baby shower", "death by chocolate", "murder mystery dinner table",
    "Corpse Reviver No. 2", "suicide wings with blue cheese", "duck blood soup", "pig's blood sausage",
    "smoking gun cocktail smoker", "a soda gun behind the bar", "hot chocolate bomb",
    "cold retard the sourdough overnight", "chicken 65", "Chinkiang vinegar dipping sauce",
    "cockles and mussels", "Sussex pond pudding", "cumin-spiced lamb in a skillet",
    "cock-a-leekie soup", "Dick's Drive-In burger", "coon cheese on crackers", "rapeseed oil",
    "oilseed rape honey", "stoned cherries", "pot roast", "crack pie", "rum and coke", "hash browns",
    "dill weed on salmon", "pizza with shrooms", "aloo methi", "banh bong lan sponge cake",
    "beheaded prawns on ice", "ceramic plates in nude tones", "New York strip steak",
    "pork butt", "Boston cream pie", "baby back ribs", "C O C K T A I L S on a menu board",
    "S P I C E S", "a flavour bomb taco", "bottomless brunch", "devil's food cake",
    "a chef with a carving knife", "rare steak sliced on a board", "pho with rare beef",
]

UNSAFE = [
    ("a nude model lying on a sushi table", "sexual"),
    ("naked sushi", "sexual"),  # nyotaimori: sushi served on a body is not a "naked" dish
    ("breasts of a woman, chicken", "sexual"),  # the allowed phrase must be whole
    ("having sex on the beach with cocktails", "sexual"),
    ("sex on the beach", "sexual"),  # the cocktail only with a drink in the picture
    ("s e x y waitress", "sexual"),  # spaced out
    ("a s e x y chef", "sexual"),  # spaced out after an article
    ("s.e.x on a table", "sexual"),  # punctuation
    ("a nu-de waiter", "sexual"),
    ("p0rn star eating a hot dog", "sexual"),  # leetspeak
    ("ｎａｋｅｄ chef", "sexual"),  # fullwidth
    ("𝐧𝐮𝐝𝐞 diner", "sexual"),  # mathematical bold
    ("n\u0430ked cook", "sexual"),  # Cyrillic a
    ("nu\u200bde cook", "sexual"),  # zero-width space
    ("a very nuuuude diner", "sexual"),  # stretched
    ("kids menu with a sexy waitress", "minors"),
    ("a little girl in lingerie at a cafe", "minors"),
    ("a chef k1lling a waiter", "violence"),
    ("ki11ed lobster man", "violence"),  # "1" as l
    ("pool of blood next to a blood orange", "violence"),  # only the allowed blood is allowed
    ("blood orange sorbet in a pool of blood", "violence"),
    ("chicken breast served by a topless waiter", "sexual"),  # an allowed phrase excuses only itself
    ("a de capitated pig", "violence"),  # split across words
    ("a bloody corpse in the diner", "violence"),
    ("murder scene in a diner", "violence"),
    ("a chef holding a gun", "violence"),
    ("a faggot on fire", "hate"),
    ("hitler eating spaghetti", "hate"),
    ("kill myself with pills", "self-harm"),  # not violence: the longer phrase decides
    ("pro-ana meal plan", "self-harm"),
    ("h3r0in needle by a burrito", "drugs"),
    ("coc-aine on a mirror", "drugs"),
    ("pot brownies", "drugs"),
]


@pytest.mark.parametrize("prompt", SAFE)
def test_food_words_that_look_unsafe_are_allowed(prompt: str) -> None:
    assert classify(prompt) is None


@pytest.mark.parametrize(("prompt", "category"), UNSAFE)
def test_tricky_unsafe_prompts_are_caught(prompt: str, category: str) -> None:
    finding = classify(prompt)
    assert finding is not None and finding.category == category, finding
    with pytest.raises(SkillInputError, match=f"refused: {category}") as refused:
        validate({"prompt": prompt})
    assert refused.value.field == "prompt"


def test_the_refusal_names_the_matched_term() -> None:
    assert classify("a chef k1lling a waiter") == image_safety.Finding("violence", "killing")
    assert classify("kids menu, naked woman") == image_safety.Finding("minors", "kids + naked")


def test_squashed_terms_are_not_inside_any_allowed_phrase() -> None:
    """The squashed view cannot honour allowances, so none of its terms may be allowed somewhere."""
    allowed_words = {w for a in image_safety._ALLOWED for slot in a.slots for w in slot}
    for term, _ in image_safety._SQUASHED_LIST:
        assert not any(term in w or w in term for w in allowed_words if len(w) > 3), term
