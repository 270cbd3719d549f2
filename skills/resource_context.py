"""What a marketplace resource may use when it runs: the operator's environment (keys and base
URLs), one pooled HTTP session, and the gateway's own models, called without payment."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .errors import SkillUnavailableError
from .skill import Skill


@dataclass
class ResourceContext:
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)
    # The model skills, looked up when a call runs (they are registered after the resources).
    find_skill: Callable[[str], Skill | None] = lambda _id: None
    connect_timeout: float = 5.0
    _session: aiohttp.ClientSession | None = field(default=None, init=False, repr=False)

    def http(self) -> aiohttp.ClientSession:
        """The shared keep-alive session. Set a timeout per request: it has none of its own."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, connect=self.connect_timeout),
                connector=aiohttp.TCPConnector(limit=100, ttl_dns_cache=300),
            )
        return self._session

    def model(self, model_id: str) -> Skill:
        """A model skill by id, to run one of its operations directly (the resource's price
        already paid for it). SkillUnavailableError when the gateway does not sell it."""
        skill = self.find_skill(model_id)
        if skill is None or skill.kind != "model":
            raise SkillUnavailableError(f"model '{model_id}' is not in this gateway's model table; "
                                        "nothing was charged")
        return skill

    def env(self, name: str) -> str:
        return (self.environ.get(name) or "").strip()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def unavailable(what: str, variable: str) -> SkillUnavailableError:
    """The 503 a resource answers, before any quote, when a setting it needs is missing."""
    return SkillUnavailableError(f"{what} is not configured on this gateway: set {variable} to "
                                 "enable it; nothing was charged")


JSON = dict[str, Any]
