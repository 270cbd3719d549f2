"""Request ids and structured logs: the id a request is known by (taken from `X-Request-Id` when
it is sane, else made here), carried in a context variable to every log line the request causes;
JSON log lines (`PAYWIRE_LOG_FORMAT=json`); one line per paid call on the `paywire.calls` logger.

What is never logged: a payment header or signature, a key, a task's input or a result. The paid
call's line is built from the outcome's receipt and the payment's public terms only."""

from __future__ import annotations

import json
import logging
import re
import secrets
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID = 128
# What a caller's id may be: short, and nothing that could forge a log line or a header.
_SANE_ID = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_REQUEST_ID}}}")

request_id: ContextVar[str | None] = ContextVar("paywire_request_id", default=None)

calls_log = logging.getLogger("paywire.calls")


def new_request_id() -> str:
    """A fresh id: 16 random bytes as hex (no clock, no host: nothing to learn from it)."""
    return secrets.token_hex(16)


def accepted_request_id(value: bytes | str | None) -> str:
    """The caller's id when it is sane (at most 128 of A-Z a-z 0-9 . _ : -), else a fresh one:
    junk is replaced, never echoed."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return new_request_id()
    if value and _SANE_ID.fullmatch(value):
        return value
    return new_request_id()


# The attributes every LogRecord has: anything else on a record came as `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "color_message"}  # uvicorn's copy of its message with terminal colours


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, request_id (while
    a request is served), the record's `extra=` fields, and the exception's traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = request_id.get()
        if rid is not None:
            line["request_id"] = rid
        if record.name == "uvicorn.access" and isinstance(record.args, tuple) and len(record.args) == 5:
            line["client"], line["method"], line["path"], _, line["status"] = record.args
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


def json_handler() -> logging.Handler:
    """A stderr handler writing JsonFormatter lines."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    return handler


def log_paid_call(fields: dict[str, Any]) -> None:
    """The paid call's line on `paywire.calls` (INFO): the fields as `extra` (JSON keys), and the
    same as key=value text for the text format."""
    if not calls_log.isEnabledFor(logging.INFO):
        return
    text = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
    calls_log.info("paid call %s", text, extra=fields)
