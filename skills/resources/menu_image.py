"""restaurant-menu-image-generate: one restaurant image (a dish, a drink, a dining room) from a short
description, through one of the gateway's image models, for a fixed price per call.

Input: `prompt` (the dish or scene, at most 600 characters), optional `style` (see STYLES),
`cuisine` (a few words), `size` (see SIZES) and `n` (always 1). Unknown fields are refused.

Before any quote (so nobody pays for a refusal):
- `validate` checks the fields and runs the local safety classifier (image_safety) on the prompt
  and the cuisine: an unsafe one is a 400 naming the field and the category;
- `ready` checks the image model (PAYWIRE_MENU_IMAGE_MODEL, default gpt-image-1-mini): it must be
  sold here, have a provider key (else 503 naming the variable), offer every size of SIZES at
  QUALITY, and quote each such image below this resource's price, so a call never costs more
  than it earns. The check quotes the longest prompt this resource can build (token-billed image
  models bill the prompt's text tokens on top of the image).

The prompt sent to the model is built from a template: food-photography (or illustration) framing,
and no people, text or logos unless the description asks for them. The answer holds the image
(base64 or URL, as the provider gives it), the prompt the model used (its own revision if it made
one), the model and the size. An upstream failure raises UpstreamError: the call is not charged.
"""

from __future__ import annotations

import base64
import binascii
import re
from decimal import Decimal
from typing import Any

from skills.described import NOT_BLANK, SPACES, described
from skills.errors import SkillInputError, SkillUnavailableError, UpstreamError
from skills.json_numbers import is_whole
from skills.resource_context import ResourceContext
from skills.skill import Operation, SkillResult

from .image_safety import classify, words

MODEL_ENV = "PAYWIRE_MENU_IMAGE_MODEL"
DEFAULT_MODEL = "gpt-image-1-mini"
OPERATION = "images.generations"
PRICE_USD = Decimal("0.0115")  # the resource file's price (a test keeps them equal)
QUALITY = "low"  # gpt-image-1-mini at low quality: $0.005-$0.006 an image, below the price
SIZES = ("1024x1024", "1024x1536", "1536x1024")  # square, portrait, landscape
DEFAULT_SIZE = SIZES[0]
MAX_PROMPT_CHARS = 600
MAX_CUISINE_CHARS = 40
FIELDS = ("prompt", "style", "cuisine", "size", "n")

# style -> (what the image is, how it looks)
STYLES: dict[str, tuple[str, str]] = {
    "photo": ("A professional food photograph of",
              "Natural soft light, shallow depth of field, appetising restaurant-quality plating, "
              "high detail."),
    "overhead": ("An overhead flat-lay food photograph of",
                 "Styled table setting, even soft daylight, appetising restaurant-quality plating."),
    "close-up": ("A macro close-up food photograph of",
                 "Crisp texture detail, soft directional light, shallow depth of field."),
    "illustration": ("A clean editorial food illustration of",
                     "Vibrant appetising colours, simple uncluttered background."),
    "watercolor": ("A hand-painted watercolour illustration of",
                   "Soft washes, appetising colours, white paper background."),
    "menu-card": ("A menu-card image of",
                  "The dish centred on a plain light background with generous empty space around "
                  "it for menu text added later, soft studio light."),
    "interior": ("An interior photograph of a restaurant:",
                 "Warm ambient light, inviting atmosphere, wide angle."),
}
DEFAULT_STYLE = "photo"

# Words that ask for what the template otherwise leaves out.
_PEOPLE_WORDS = frozenset("""
    person people chef chefs cook cooks waiter waiters waitress waitresses server servers bartender
    bartenders barista baristas sommelier diner diners guest guests customer customers family
    families friends couple man men woman women hand hands child children kid kids crowd staff
    host hostess
""".split())
_TEXT_WORDS = frozenset("""
    text lettering letters lettered logo logos sign signs signage caption captions title titles
    headline typography label labels slogan wording words word font written writing reading says
    saying chalkboard
""".split())
_CUISINE_CHARS = re.compile(r"[^\W\d_]+(?:[ '’&/,.-]+[^\W\d_]+)*\.?")


# ---------------------------------------------------------------------------------- validation


@described({"properties": {  # what the resource file's schema does not say (the safety check aside)
    "prompt": {"pattern": NOT_BLANK},
    "cuisine": {"pattern": f"^[{SPACES}]*{_CUISINE_CHARS.pattern}[{SPACES}]*$",
                "maxLength": MAX_CUISINE_CHARS}}})
def validate(payload: dict[str, Any]) -> None:
    """Raise SkillInputError naming the field when `payload` cannot run or is not safe for work."""
    if not isinstance(payload, dict):
        raise SkillInputError("the input must be a JSON object with 'prompt' (the dish or scene)")
    for key in payload:
        if key not in FIELDS:
            raise SkillInputError(f"field '{key}' is not accepted; the fields are "
                                  f"{', '.join(FIELDS)}", str(key))
    _check_prompt(payload.get("prompt"))
    _check_choice(payload, "style", tuple(STYLES))
    _check_choice(payload, "size", SIZES)
    if "cuisine" in payload:
        _check_cuisine(payload["cuisine"])
    if "n" in payload and (not is_whole(payload["n"]) or payload["n"] != 1):  # (1.0 is JSON's 1)
        raise SkillInputError("field 'n' must be 1: a call makes one image (the price is per call)",
                              "n")
    _check_safe("prompt", payload["prompt"])
    if "cuisine" in payload:
        _check_safe("cuisine", payload["cuisine"])


def _check_prompt(prompt: Any) -> None:
    if not isinstance(prompt, str) or not prompt.strip():
        raise SkillInputError("field 'prompt' is required: describe the dish or scene, e.g. "
                              "'a rustic margherita pizza on a wooden board'", "prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise SkillInputError(f"field 'prompt' is {len(prompt)} characters long; at most "
                              f"{MAX_PROMPT_CHARS} are accepted", "prompt")


def _check_choice(payload: dict[str, Any], name: str, allowed: tuple[str, ...]) -> None:
    if name in payload and payload[name] not in allowed:
        raise SkillInputError(f"field '{name}' must be one of {', '.join(allowed)}; got "
                              f"{payload[name]!r}", name)


def _check_cuisine(cuisine: Any) -> None:
    # Pasted into the model's prompt: a few plain words, no quotes, colons, digits or line breaks.
    if (not isinstance(cuisine, str) or len(cuisine) > MAX_CUISINE_CHARS
            or not _CUISINE_CHARS.fullmatch(cuisine.strip())):
        raise SkillInputError(f"field 'cuisine' must be a few words (letters, spaces, hyphens; at "
                              f"most {MAX_CUISINE_CHARS} characters), e.g. 'Sichuan' or 'Tex-Mex'",
                              "cuisine")


def _check_safe(name: str, text: str) -> None:
    finding = classify(text)
    if finding is not None:
        raise SkillInputError(
            f"field '{name}' is not safe for work and was refused: {finding.category} (matched "
            f"'{finding.term}'); this resource makes restaurant imagery only, nothing was quoted",
            name)


# ---------------------------------------------------------------------------------- the model


def ready(context: ResourceContext) -> None:
    """Called before every quote: SkillUnavailableError (503) when no call could deliver."""
    image_operation(context)


def image_operation(context: ResourceContext) -> tuple[str, Operation]:
    """(model id, its images.generations operation), checked to serve every size below the price."""
    model_id = context.env(MODEL_ENV) or DEFAULT_MODEL
    try:
        operation = context.model(model_id).operations.get(OPERATION)
    except SkillUnavailableError:
        operation = None
    if operation is None:
        raise SkillUnavailableError(
            f"{MODEL_ENV} names '{model_id}', which is not an image model this gateway sells; set "
            f"it to one such as {DEFAULT_MODEL}; nothing was charged")
    for size in SIZES:
        _check_cost(model_id, operation, size)
    return model_id, operation


def _longest_prompt() -> str:
    """The dearest prompt `build_prompt` can make: the longest style, the longest description and
    cuisine, in emoji (about the token estimator's dearest text per character, ~1.7 tokens each)."""
    style = max(STYLES, key=lambda name: len(" ".join(STYLES[name])))
    return build_prompt({"prompt": "\U0001F35C" * MAX_PROMPT_CHARS, "style": style,
                         "cuisine": "\U0001F35C" * MAX_CUISINE_CHARS})


def _check_cost(model_id: str, operation: Operation, size: str) -> None:
    body = model_body(model_id, _longest_prompt(), size)
    try:
        if operation.validator is not None:
            operation.validator(body)
        # The model's own quote includes the operator's margin, so it bounds the upstream cost.
        cost = operation.pricer(body)
    except UpstreamError as exc:  # no provider key: the message names the variable to set
        raise SkillUnavailableError(f"restaurant images need the model '{model_id}': "
                                    f"{exc.message}") from None
    except SkillInputError as exc:
        raise SkillUnavailableError(
            f"the image model '{model_id}' ({MODEL_ENV}) cannot make {size} images at {QUALITY} "
            f"quality ({exc.message}); set {MODEL_ENV} to another image model; nothing was "
            "charged") from None
    if cost >= PRICE_USD:
        raise SkillUnavailableError(
            f"a {size} image from '{model_id}' ({MODEL_ENV}) costs ${cost}, not less than this "
            f"resource's ${PRICE_USD}; set {MODEL_ENV} to a cheaper image model such as "
            f"{DEFAULT_MODEL}; nothing was charged")


def model_body(model_id: str, prompt: str, size: str) -> dict[str, Any]:
    """The images.generations request: one image. No response_format: GPT image models refuse it
    and always answer base64, DALL-E answers a URL by default; either is passed on."""
    return {"model": model_id, "prompt": prompt, "size": size, "quality": QUALITY, "n": 1}


# ---------------------------------------------------------------------------------- the prompt


def build_prompt(payload: dict[str, Any]) -> str:
    """The prompt sent to the model: the caller's description inside the style's framing."""
    lead, look = STYLES[payload.get("style", DEFAULT_STYLE)]
    subject = " ".join(payload["prompt"].split()).rstrip(" .")
    first, _, rest = subject.partition(" ")
    if first in ("A", "An", "The") and rest:  # it continues the template's sentence
        subject = f"{first.lower()} {rest}"
    cuisine = " ".join(payload.get("cuisine", "").split()).rstrip(" .")
    described = f"{subject}, {cuisine} cuisine" if cuisine else subject
    return f"{lead} {described}. {look} {_exclusions(payload['prompt'])}"


def _exclusions(prompt: str) -> str:
    """"No people, text, logos or watermarks.", leaving out what the description asks for."""
    asked = set(words(prompt))
    left_out = [] if asked & _PEOPLE_WORDS else ["people"]
    if not asked & _TEXT_WORDS and '"' not in prompt:  # a quotation is text to show
        left_out += ["text", "logos"]
    left_out.append("watermarks")
    listed = ", ".join(left_out[:-1]) + f" or {left_out[-1]}" if len(left_out) > 1 else left_out[0]
    return f"No {listed}."


# ---------------------------------------------------------------------------------- the call


async def run(payload: dict[str, Any], context: ResourceContext) -> SkillResult:
    """Generate the image. UpstreamError from the model propagates: the call is not charged."""
    validate(payload)  # again: run may be called directly
    model_id, operation = image_operation(context)
    size = payload.get("size", DEFAULT_SIZE)
    prompt = build_prompt(payload)
    result = await operation.run(model_body(model_id, prompt, size))
    items = _items(result.body)
    revised = items[0].get("revised_prompt")
    body = {
        "images": [_image(item, result.body) for item in items],
        "prompt": revised if isinstance(revised, str) and revised else prompt,
        "prompt_revised": isinstance(revised, str) and bool(revised),
        "model": model_id,
        "size": size,
        "quality": QUALITY,
        "style": payload.get("style", DEFAULT_STYLE),
    }
    # The model's usage and cost go to this call's ledger row: it was paid for by this resource.
    return SkillResult(body=body, usage=result.usage, upstream_cost_usd=result.upstream_cost_usd)


def _items(answer: Any) -> list[dict[str, Any]]:
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list) or not data or not all(isinstance(i, dict) for i in data):
        raise UpstreamError("the image model answered without an image")
    return data


def _image(item: dict[str, Any], answer: dict[str, Any]) -> dict[str, str]:
    """One image as the caller gets it: base64 (checked to decode) with its media type, or a URL."""
    data, url = item.get("b64_json"), item.get("url")
    if isinstance(data, str) and data:
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise UpstreamError("the image model answered image data that is not base64") from None
        fmt = answer.get("output_format") if isinstance(answer.get("output_format"), str) else "png"
        return {"b64_json": data, "media_type": f"image/{fmt}"}
    if isinstance(url, str) and url:
        return {"url": url}
    raise UpstreamError("the image model answered an image without data or URL")
