"""Process-wide guards set once the app is built: the recursion limit dependencies raise, and
log records that would let any caller write tracebacks into the operator's log."""

from __future__ import annotations

import logging
import sys

# Python's own default. py-evm and py_ecc raise it to 100,000 on import; at that depth a C-level
# recursion (the stdlib JSON decoder, repr of a nested value) overflows the C stack and the
# process dies with SIGSEGV instead of raising RecursionError.
RECURSION_LIMIT = 1000

# The a2a SDK logs a caller's malformed JSON-RPC request with logger.exception: a full traceback
# per bad request, at ERROR. They are the caller's mistakes, answered with a JSON-RPC error; the
# operator gets one warning line each.
_CLIENT_ERROR_MESSAGES = frozenset({
    "Failed to validate base JSON-RPC request",
    "Failed to validate base JSON-RPC request for v0.3",
    "Failed to parse request params",
})
_A2A_LOGGERS = ("a2a.server.routes.jsonrpc_dispatcher", "a2a.compat.v0_3.jsonrpc_adapter")


_REQUEST_ERROR = "Request Error (ID: %s): Code=%s, Message='%s'%s"  # the SDK's line per JSON-RPC error


class ClientErrorsAsWarnings(logging.Filter):
    """Turns the SDK's traceback for a malformed request into one warning line, and keeps the
    error's `data` (which quotes the request) out of its line per JSON-RPC error."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _REQUEST_ERROR and isinstance(record.args, tuple) and len(record.args) == 4:
            record.args = (*record.args[:3], "")
        if record.msg in _CLIENT_ERROR_MESSAGES and record.exc_info:
            # The exception's type only: its text quotes the request (which may hold secrets).
            record.msg = f"{record.msg}: {type(record.exc_info[1]).__name__}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str, json_lines: bool = False) -> None:
    """One line per record, with its level and logger, for paywire's and its libraries' logs
    (uvicorn configures only its own loggers, unless JSON lines are asked: then uvicorn is left
    unconfigured and its lines reach this handler too; see serving.uvicorn_config)."""
    if json_lines:
        from agent.observability.request_log import json_handler

        logging.basicConfig(level=level.upper(), handlers=[json_handler()], force=True)
        return
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT)


def apply() -> None:
    """Idempotent: safe to call for every app built in one process (tests build many)."""
    sys.setrecursionlimit(RECURSION_LIMIT)
    for name in _A2A_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ClientErrorsAsWarnings) for f in logger.filters):
            logger.addFilter(ClientErrorsAsWarnings())
