"""What a marketplace resource may use when it runs: the operator's settings it declared (keys,
base URLs...), one pooled HTTP session, and the gateway's own models, called without payment.

A resource sees only the variables resource files declare (a file's `env` list and its kind's
`*_env` fields, gathered by `declare` while the files load); the assembly then fills `environ`
with those variables' values and no others."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .errors import SkillUnavailableError
from .skill import Skill

log = logging.getLogger(__name__)


@dataclass
class ResourceContext:
    # The declared variables' values (the assembly fills it once the resource files are loaded).
    environ: Mapping[str, str] = field(default_factory=dict, repr=False)
    # The variables the loaded resource files declare.
    declared: set[str] = field(default_factory=set)
    # The model skills, looked up when a call runs (they are registered after the resources).
    find_skill: Callable[[str], Skill | None] = lambda _id: None
    connect_timeout: float = 5.0
    _session: aiohttp.ClientSession | None = field(default=None, init=False, repr=False)
    _warned: set[str] = field(default_factory=set, init=False, repr=False)

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

    def declare(self, names: Iterable[str]) -> None:
        """Variables a resource file declares it reads (called while resource files load)."""
        self.declared.update(names)

    def env(self, name: str) -> str:
        """A declared variable's value ('' when unset). A variable no resource file declares reads
        as unset, and says so once in the log."""
        if name and self.declared and name not in self.declared and name not in self._warned:
            self._warned.add(name)
            log.warning("a resource read %s, which no resource file declares, so it reads as unset; "
                        "add it to the resource file's \"env\" list", name)
        return (self.environ.get(name) or "").strip()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def unavailable(what: str, variable: str) -> SkillUnavailableError:
    """The 503 a resource answers, before any quote, when a setting it needs is missing."""
    return SkillUnavailableError(f"{what} is not configured on this gateway: set {variable} to "
                                 "enable it; nothing was charged")


JSON = dict[str, Any]
