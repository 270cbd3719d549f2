"""Kind `prompted`: a prompt template run on one of the gateway's chat models (internally: the
resource's price pays for it), answering JSON that is validated against an output schema.

    "kind": "prompted",
    "prompted": {
      "model": "gpt-4o-mini",                   (overridden by the variable in model_env)
      "model_env": "PAYWIRE_ERROR_EXPLAIN_MODEL",
      "system": "You explain errors ...",
      "prompt": "Error:\\n{error}\\nLanguage: {language}",   ({field} = that input field; "" if absent)
      "output_schema": {JSON Schema of the answer},
      "max_tokens": 1200,
      "temperature": 0.2
    }

The model is asked for structured output (`response_format` json_schema). An answer that is not
JSON or does not match the schema (a refusal, one cut off at max_tokens) is retried once, with the
problem explained to the model; a second bad answer fails the call, and a failed call is not
charged. Before any quote the resource answers 503 when its model is not sold here, has no
provider configured, or cannot take the resource's max_tokens / temperature.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from ..errors import SkillInputError, SkillUnavailableError, UpstreamError, UpstreamRejected
from ..resource_context import ResourceContext
from ..skill import Payload, SkillResult
from .base import Behaviour, need_str, schema_problems

WHERE = "prompted"
OPERATION = "chat.completions"
_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_PROBLEM_CHARS = 500  # a schema error quotes the offending value: keep retries and errors short


def check(data: dict[str, Any]) -> list[str]:
    settings = data.get(WHERE)
    if not isinstance(settings, dict):
        return ["kind 'prompted' needs field 'prompted': {model, system, prompt, output_schema, ...}"]
    problems: list[str] = []
    for key in ("model", "prompt"):
        need_str(settings, key, WHERE, problems)
    for key in ("system", "model_env"):
        need_str(settings, key, WHERE, problems, required=False)
    problems += schema_problems(settings.get("output_schema"), "prompted.output_schema")
    problems += _quoted_from_problems(settings.get("quoted_from", {}), _properties(data.get("input_schema")))
    tokens = settings.get("max_tokens", 1000)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= 100_000:
        problems.append("field 'prompted.max_tokens' must be a whole number from 1 to 100000")
    temperature = settings.get("temperature", 0.2)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) \
            or not 0 <= temperature <= 2:
        problems.append("field 'prompted.temperature' must be a number from 0 to 2")
    prompt = settings.get("prompt")
    if isinstance(prompt, str):
        known = _properties(data.get("input_schema"))
        for name in sorted(set(_FIELD.findall(prompt)) - known):
            problems.append(f"field 'prompted.prompt' uses {{{name}}}, which is not a property of "
                            f"'input_schema' (properties: {', '.join(sorted(known)) or 'none'})")
    return problems


def _quoted_from_problems(rules: Any, inputs: set[str]) -> list[str]:
    if not isinstance(rules, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in rules.items()):
        return ["field 'prompted.quoted_from' must map answer paths (e.g. 'aspects/*/evidence/*') "
                "to input field names"]
    return [f"field 'prompted.quoted_from' names input field '{field}', which is not a property "
            "of 'input_schema'" for field in rules.values() if field not in inputs]


def _properties(schema: Any) -> set[str]:
    """The input schema's property names (none when it is not an object: reported elsewhere)."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return set(properties) if isinstance(properties, dict) else set()


def build(data: dict[str, Any], context: ResourceContext) -> Behaviour:
    settings = data[WHERE]
    schema = Draft202012Validator(settings["output_schema"])
    name = data["id"]

    def model_id() -> str:
        return context.env(settings.get("model_env") or "") or settings["model"]

    def chat() -> Any:
        model = context.model(model_id())
        if OPERATION not in model.operations:
            raise SkillUnavailableError(f"resource '{name}' is set to model '{model.id}', which is "
                                        "not a chat model; nothing was charged")
        return model.operations[OPERATION]

    def ready() -> None:
        operation = chat()
        sample = {"model": model_id(), "messages": [{"role": "user", "content": "."}],
                  "max_tokens": settings.get("max_tokens", 1000),
                  "temperature": settings.get("temperature", 0.2)}
        if operation.validator is not None:
            try:  # a model override whose output cap is below max_tokens: the operator's problem
                operation.validator(sample)
            except SkillInputError as exc:
                raise SkillUnavailableError(f"resource '{name}' is misconfigured for model "
                                            f"'{model_id()}': {exc.message}; nothing was charged"
                                            ) from None
        # the model's own check: a 503 naming the variable that would enable its provider
        operation.pricer(sample)

    async def run(payload: Payload) -> SkillResult:
        operation = chat()
        messages = _messages(settings, payload)
        request = _request(settings, name, model_id(), messages)
        usages: list[dict[str, Any]] = []
        cost = Decimal(0)
        problem = ""

        def spent(attempts: int) -> dict[str, Any]:
            return {"model": model_id(), "attempts": attempts, "calls": usages}

        for attempt in range(2):
            try:
                result = await operation.run(request)
            except UpstreamError as exc:
                # the request is ours, not the caller's: a setup problem
                if isinstance(exc, UpstreamRejected):
                    exc = UpstreamError(
                        f"resource '{name}': model '{model_id()}' refused the request it was "
                        f"sent ({exc.message}); the operator's model setting "
                        f"({settings.get('model_env') or 'the resource file'}) may name a model "
                        "without structured output or temperature")
                if usages:  # the retry failed: keep what the first attempt spent
                    exc.usage = spent(attempt + 1)
                    exc.upstream_cost_usd = cost
                raise exc from None
            usages.append(result.usage or {})
            cost += result.upstream_cost_usd or 0
            content, finish = _content(result.body)
            answer, problem = _parse(content, schema)
            if not problem:
                problem = _unquoted(answer, payload, settings.get("quoted_from", {}))
            if not problem:
                return SkillResult(body=answer, usage=spent(attempt + 1), upstream_cost_usd=cost)
            if finish == "length":  # the same budget again would be cut again: ask for less
                problem = (f"it was cut off at the {request['max_tokens']}-token limit "
                           f"({problem}); give a shorter answer")
            request = {**request, "messages": [
                *messages, {"role": "assistant", "content": content},
                {"role": "user", "content": f"That answer is not valid: {problem}. Answer again "
                                            "with only the JSON object the schema describes."}]}
        raise UpstreamError(f"the model gave no valid answer for '{name}' in two attempts "
                            f"(last problem: {problem})",
                            usage=spent(2), upstream_cost_usd=cost)

    return Behaviour(run=run, ready=ready)


def _messages(settings: dict[str, Any], payload: Payload) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": render(settings["prompt"], payload)}]
    if settings.get("system"):
        messages.insert(0, {"role": "system", "content": settings["system"]})
    return messages


def _request(settings: dict[str, Any], name: str, model: str,
             messages: list[dict[str, str]]) -> dict[str, Any]:
    """The chat.completions body: structured output with the resource's schema."""
    return {
        "model": model, "messages": messages,
        "max_tokens": settings.get("max_tokens", 1000),
        "temperature": settings.get("temperature", 0.2),
        "response_format": {"type": "json_schema", "json_schema": {
            "name": re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64],
            "schema": settings["output_schema"]}},
    }


def render(template: str, payload: Payload) -> str:
    """`{field}` -> the input field (strings as they are, anything else as JSON; absent: "")."""
    def value(match: re.Match[str]) -> str:
        found = payload.get(match.group(1))
        if found is None:
            return ""
        return found if isinstance(found, str) else json.dumps(found, ensure_ascii=False)

    return _FIELD.sub(value, template)


def _content(body: Any) -> tuple[str, str]:
    """(the answer's text, its finish_reason). A refusal comes back as text, so it fails the
    schema and is retried like any other bad answer."""
    try:
        choice = body["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise UpstreamError("the model answered without a message") from None
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        refusal = message.get("refusal") if isinstance(message, dict) else None
        content = f"(refused: {refusal})" if isinstance(refusal, str) and refusal else ""
    finish = choice.get("finish_reason") if isinstance(choice, dict) else None
    return content, finish if isinstance(finish, str) else ""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse(content: str, schema: Draft202012Validator) -> tuple[Any, str]:
    """(the answer, "") or (None, what is wrong with it)."""
    text = content.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:  # NaN and Infinity: Python reads them, but they are not JSON and could not be answered
        answer = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        return None, f"it is not JSON ({exc.msg} at character {exc.pos})"
    except ValueError as exc:
        return None, f"it is not JSON ({exc})"
    error = best_match(schema.iter_errors(answer))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top level"
        return None, _short(f"at {where}: {error.message}")
    return answer, ""


def _short(problem: str) -> str:
    return problem if len(problem) <= _PROBLEM_CHARS else problem[:_PROBLEM_CHARS] + "..."


def _unquoted(answer: Any, payload: Payload, rules: dict[str, str]) -> str:
    """The first string at a `quoted_from` path that is not a quotation of its input field
    (compared ignoring case, spacing and curly quotes), or ""."""
    for path, field in rules.items():
        source = _plain(str(payload.get(field) or ""))
        for where, text in _at(answer, path.split("/"), []):
            if isinstance(text, str) and _plain(text) not in source:
                return _short(f"at {'/'.join(where)}: {text!r} is not quoted word for word from "
                              f"the input's '{field}'")
    return ""


def _at(value: Any, steps: list[str], where: list[str]) -> list[tuple[list[str], Any]]:
    """The values at a path of keys and `*` (every item of a list or object)."""
    if not steps:
        return [(where, value)]
    step, rest = steps[0], steps[1:]
    if step == "*":
        items = enumerate(value) if isinstance(value, list) else (
            value.items() if isinstance(value, dict) else [])
        return [hit for key, item in items for hit in _at(item, rest, [*where, str(key)])]
    if isinstance(value, dict) and step in value:
        return _at(value[step], rest, [*where, step])
    return []


_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def _plain(text: str) -> str:
    return " ".join(text.translate(_QUOTES).lower().split())
