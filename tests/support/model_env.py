"""A gateway whose models are served by two OpenAI-compatible stand-ins: `openai` first,
`openrouter` as the fallback. Fixtures (registered by tests/conftest.py): `env`, module-scoped,
and `reset_upstreams`, which a test module opts into with `pytest.mark.usefixtures`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.live_server import LiveServer, start_server
from tests.support.openai_upstream import OpenAIUpstream, RecordedRequest


class Env:
    def __init__(self, gateway: LiveServer, primary: OpenAIUpstream, fallback: OpenAIUpstream) -> None:
        self.gateway, self.primary, self.fallback = gateway, primary, fallback

    def balance(self) -> int:
        return int(self.gateway.devnet.merchant_balances().evm)

    def served(self, path: str) -> list[RecordedRequest]:
        """Requests for `path` that reached either upstream (an earlier test may have cooled the
        primary down, so either may serve)."""
        return self.primary.requests_to(path) + self.fallback.requests_to(path)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    primary, fallback = OpenAIUpstream("openai").start(), OpenAIUpstream("openrouter").start()
    gateway = start_server(tmp_path_factory.mktemp("models"), env={
        "OPENAI_BASE_URL": primary.url, "OPENAI_API_KEY": "sk-test-openai",
        "OPENROUTER_BASE_URL": fallback.url, "OPENROUTER_API_KEY": "sk-test-openrouter",
    })
    yield Env(gateway, primary, fallback)
    gateway.stop()
    primary.stop()
    fallback.stop()


@pytest.fixture
def reset_upstreams(env: Env) -> None:
    for upstream in (env.primary, env.fallback):
        upstream.reset()
        upstream.behaviour.restore_defaults()
