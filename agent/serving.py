"""Running the app under uvicorn, set up for the proxy hot path (see bench/README.md)."""

from __future__ import annotations

import gc
import sys
from typing import Any

import uvicorn

STARTUP_FAILURE = 3  # uvicorn's exit code when the app did not start

# Access lines are logged at INFO: below that level uvicorn would still format each one.
_ACCESS_LOG_LEVELS = {"trace", "debug", "info"}


def uvicorn_config(app: Any, *, host: str, port: int, log_level: str = "info") -> uvicorn.Config:
    return uvicorn.Config(app, host=host, port=port, loop="uvloop", http="httptools",
                          log_level=log_level, proxy_headers=True,
                          access_log=str(log_level).lower() in _ACCESS_LOG_LEVELS)


# Young objects collected once 10,000 more are alive, not 700: a request's objects mostly die by
# reference counting before then, so collections nearly stop (~10 µs of CPU per call saved).
YOUNG_THRESHOLD = 10_000


def tune_garbage_collector() -> None:
    """Freeze what startup built (modules, the devnet, the app) and collect young objects less often.

    A full collection walks ~190k startup objects: ~110 ms here, all of it a stalled event loop
    (at 64 concurrent calls: p99 ~150 ms, and a third of the gateway's CPU). Frozen, they are
    never walked again; they are permanent anyway, and still freed by reference counting if
    dropped."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])


class Server(uvicorn.Server):
    """uvicorn's server, with the collector tuned once the app's startup (lifespan) has run."""

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets=sockets)
        tune_garbage_collector()


def serve(app: Any, *, host: str, port: int, log_level: str = "info") -> None:
    """`uvicorn.run(app, ...)` for one process, with the settings above."""
    server = Server(uvicorn_config(app, host=host, port=port, log_level=log_level))
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)
