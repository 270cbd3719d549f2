"""Does GET /openapi.json say what the server enforces? schemathesis's own run (its examples,
coverage and fuzzing phases, seeded and derandomized) over the whole document against a live
gateway, with its conformance checks: no 5xx, documented statuses, content types and answer
shapes, and both directions of validation: a request the document calls valid must not be
refused (`positive_data_acceptance`), one it calls invalid must be (`negative_data_rejection`).

What stands between a generated request and a fair verdict is stated here, each with its reason:

- a payment is a signature over a quote: no generator makes one, so requests carrying a payment
  header are not sent (paid calls are tested with real payments elsewhere); a valid request is
  then answered with its quote, 402, which counts as accepted;
- /mcp takes what MCP clients send, `Accept: application/json, text/event-stream` (OpenAPI
  cannot describe an Accept header);
- an upload is generated as a real file of a type its field names (`encoding`), since the route
  reads its content (an audio's duration, an image's size);
- JSON-RPC answers a refused request in band, as a JSON-RPC error in HTTP 200 on /a2a (the A2A
  convention): that is a rejection;
- `UNSTATED`: the few rules JSON Schema cannot state (a sum, a comparison of two fields, a price,
  what a host name resolves to), each matched by the field the 400 names and its words; a valid
  request refused by one of them is not a disagreement.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import schemathesis
from hypothesis import strategies as st
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.engine import Status, events, from_schema
from schemathesis.openapi.checks import RejectedPositiveData

from tests.support.openai_upstream import silent_wav, tiny_png

PAYMENT_HEADERS = frozenset({"payment-signature", "x-payment"})
MCP_ACCEPT = "application/json, text/event-stream"
JSON_RPC_PATHS = ("/a2a",)  # where a refusal is a JSON-RPC error in HTTP 200
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_schema_conformance", "positive_data_acceptance", "negative_data_rejection")
# A valid request: served (2xx) or quoted (402); 404 for a path naming nothing (a generated id);
# 413 for a body over the byte limit (each operation states it; JSON Schema counts no bytes);
# 5xx is `not_a_server_error`'s to report.
ACCEPTED = ("2xx", "402", "404", "413", "5xx")
REFUSED = ("400", "401", "403", "404", "405", "406", "408", "409", "413", "415", "422", "429", "5xx")


@dataclass(frozen=True)
class Unstated:
    """A rule the server enforces that JSON Schema cannot state: a 400 on `operations` (a regex of
    operation labels) naming `param` (a regex) with words matching `says`."""

    operations: str
    param: str
    says: str
    why: str

    def excuses(self, operation: str, error: dict[str, Any]) -> bool:
        return bool(re.fullmatch(self.operations, operation)
                    and re.fullmatch(self.param, str(error.get("param")))
                    and re.search(self.says, str(error.get("message"))))


TOKEN_ROUTES = r"POST /v1/(chat/completions|completions|edits|embeddings)"
UNSTATED = (
    Unstated(TOKEN_ROUTES, r".*", r"above the \$[0-9.]+ maximum of this route",
             "the price: estimated tokens x the model's prices x the completions asked"),
    Unstated(r"POST /v1/(chat/completions|edits)", r"max_completion_tokens", r"differ",
             "max_tokens and max_completion_tokens, both given, must be equal: a comparison"),
    Unstated(r"POST /v1/chat/completions", r"(reasoning\.max_tokens|thinking\.budget_tokens)",
             r"spent inside the paid output cap", "a reasoning budget within the output cap: a comparison"),
    Unstated(r"POST /v1/completions", r"best_of", r"greater than or equal to 'n'",
             "best_of at least n: a comparison"),
    Unstated(r"POST /v1/marketplace/api/token-count-508", r"messages", r"holds more than",
             "the characters of all messages together: a sum"),
    Unstated(r"POST /v1/marketplace/api/restaurant-menu-image-generate", r"prompt|cuisine",
             r"safe for work|not allowed|asks for", "the safety check of the words"),
    Unstated(r"POST /v1/marketplace/api/webhook-test-payload", r"url",
             r"invalid host|numeric form|public|port 0|not a valid URL|no host",
             "a well-formed public host: DNS name rules and address ranges"),
)


# Disagreements whose fix lies in a file this suite does not own, each naming it: reported, excused
ELSEWHERE = (
    Unstated(r"POST /mcp", r"None", r"'id' must be a string .* got a number",
             "agent/edge/rpc.py `_plain_id` refuses an integral id written 7.0 (JSON Schema's integer)"),
)
GENERIC_ROUTE = "/v1/marketplace/api/{resource_id}"


@dataclass(frozen=True)
class Disagreement:
    check: str
    operation: str
    status: int | None
    request: str
    answer: str

    def __str__(self) -> str:
        return f"{self.check} {self.operation} [{self.status}] {self.request} -> {self.answer}"


@dataclass(frozen=True)
class Run:
    disagreements: list[Disagreement]
    cases: int
    excused: dict[str, int]  # Unstated.why -> refusals it excused
    errors: list[str]  # requests schemathesis could not make or check
    seconds: float

    def count(self, check: str) -> int:
        return sum(d.check == check for d in self.disagreements)


def run(url: str, *, max_examples: int, seed: int = 1, workers: int = 1) -> Run:
    """schemathesis over `url`'s document: every disagreement between it and the server. One
    worker: hypothesis describes its strategies with `ast.parse`, which CPython 3.11 cannot run in
    two threads at once (SystemError: AST constructor recursion depth mismatch)."""
    _register_uploads()
    config = schemathesis.Config.from_dict({
        "seed": seed, "continue-on-failure": True, "workers": workers, "request-timeout": 30,
        "generation": {"max-examples": max_examples, "deterministic": True, "database": "none",
                       "no-shrink": True, "with-security-parameters": False},
        "phases": {"examples": {"enabled": True}, "coverage": {"enabled": True},
                   "fuzzing": {"enabled": True}, "stateful": {"enabled": False}},
        "checks": {"enabled": False, **{name: {"enabled": True} for name in CHECKS},
                   "positive_data_acceptance": {"enabled": True, "expected-statuses": list(ACCEPTED)},
                   "negative_data_rejection": {"enabled": True, "expected-statuses": list(REFUSED)}},
        "operations": [{"include-path": "/mcp", "headers": {"Accept": MCP_ACCEPT}}],
    })
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", config=config, timeout=30)

    excused: dict[str, int] = {}

    @schema.hook("filter_case")
    def fair(context: Any, case: Any) -> bool:
        unpaid = not any(name.lower() in PAYMENT_HEADERS for name in case.headers or {})
        return unpaid and not _misgenerated(case)

    @schema.hook("filter_failure")
    def disagreement(context: Any, failure: Any, case: Any, response: Any) -> bool:
        reason = _excused(failure, case, response)
        if reason is not None:
            excused[reason] = excused.get(reason, 0) + 1
        return reason is None

    started = time.monotonic()
    found: dict[tuple[str, str], Disagreement] = {}
    errors: list[str] = []
    cases = 0
    for event in from_schema(schema).execute():
        if isinstance(event, events.NonFatalError):
            errors.append(f"{event.label}: {str(event.value)[:300]}")
        recorder = getattr(event, "recorder", None)
        if not isinstance(event, events.ScenarioFinished | events.FuzzScenarioFinished) or recorder is None:
            continue
        cases += len(recorder.cases)
        for case_id, check, case, response in _failed(recorder):
            found[(check, case_id)] = Disagreement(
                check, case.operation.label, response.status_code if response is not None else None,
                _request(case), response.text[:300] if response is not None else "(no answer)")
    return Run(sorted(found.values(), key=str), cases, excused, errors, time.monotonic() - started)


def _misgenerated(case: Any) -> bool:
    """A positive case whose body the document itself calls invalid: schemathesis's own slip, not
    the server's (asked for only the required parts of a multipart form with encoded file parts,
    its coverage phase sends the file parts alone; an encoded array goes as one part)."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return False
    body = case.operation.get_body_for_media_type(case.media_type) if case.media_type else None
    return body is not None and not body.is_valid(_as_json(case.body))


def _as_json(value: Any) -> Any:
    """A generated body as the JSON it stands for: a file's bytes as a string of their length."""
    if isinstance(value, bytes | bytearray):
        return "f" * len(value)
    data = getattr(value, "data", None)  # (schemathesis's Binary)
    if isinstance(data, bytes):
        return "f" * len(data)
    if isinstance(value, dict):
        return {key: _as_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_json(item) for item in value]
    return value


def _failed(recorder: Any) -> Iterator[tuple[str, str, Any, Any]]:
    for case_id, checks in recorder.checks.items():
        for check in checks:
            if check.status == Status.FAILURE:
                interaction = recorder.interactions.get(case_id)
                response = interaction.response if interaction is not None else None
                yield case_id, check.name, recorder.cases[case_id].value, response


def _excused(failure: Any, case: Any, response: Any) -> str | None:
    """Why this failure is not a disagreement, or None when it is one."""
    if response is None:
        return None
    operation = case.operation.label
    if isinstance(failure, AcceptedNegativeData) and case.operation.path in JSON_RPC_PATHS:
        return "a JSON-RPC error in HTTP 200" if "error" in _json(response.text) else None
    if isinstance(failure, AcceptedNegativeData) and isinstance(case.body, bytes) and not case.body.strip():
        return "agent/edge/http_io.py `body_json` reads a blank body (whitespace) as none: the probe"
    if isinstance(failure, RejectedPositiveData) and response.status_code == 400:
        if case.operation.path == GENERIC_ROUTE:
            return "the generic route: a resource's body is documented on the resource's own path"
        error = _json(response.text).get("error")
        error = error if isinstance(error, dict) else {}
        return next((rule.why for rule in (*UNSTATED, *ELSEWHERE) if rule.excuses(operation, error)), None)
    return None


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _request(case: Any) -> str:
    body = repr(case.body[:80]) if isinstance(case.body, bytes) else json.dumps(case.body, default=repr)
    query = f"?{case.query}" if case.query else ""
    return f"{query} {body[:300]}"


_REGISTERED: list[bool] = []


def _register_uploads() -> None:
    """Real files for the upload types the document names (a route reads its content): a WAV of
    0.1 to 3 s, a PNG of 1 to 64 pixels a side (once per process: the registry is schemathesis's)."""
    if _REGISTERED:
        return
    schemathesis.openapi.media_type("audio/wav", st.integers(1, 30).map(lambda t: silent_wav(t / 10)))
    schemathesis.openapi.media_type("image/png", st.tuples(st.integers(1, 64), st.integers(1, 64)).map(
        lambda size: tiny_png("conformance", *size)))
    _REGISTERED.append(True)
