"""The operator's controls, shared by every replica through the ledger's database: skill switches
(a skill switched off answers 503 before any quote) and the payer deny list (a denied payer's
payment is refused before any facilitator is asked).

The pipeline reads a snapshot held in memory (`Controls.current`: two dicts, no database read on
the hot path). `refresh` replaces it when the one-row change counter (`paywire_controls_version`)
moved, so each replica's periodic check (`run_forever`, every `refresh_seconds`) is one tiny
query; a change made through this object refreshes its own replica at once, the others within
one period. A database that cannot be read keeps the last snapshot (logged once per outage).
"""

from __future__ import annotations

import asyncio
import logging
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .ledger_schema import controls_version_table, denied_payers_table, skill_switches_table

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 500
MAX_CHANGED_BY_CHARS = 200
MAX_SKILL_ID_CHARS = 200
_EVM_ADDRESS = re.compile(r"0x[0-9a-fA-F]{40}")
_BASE58 = re.compile(r"[1-9A-HJ-NP-Za-km-z]{32,44}")


class ControlError(ValueError):
    """A value an operator gave is not acceptable: `field` names it, the message says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class SkillSwitch:
    """A skill the operator switched off."""

    skill_id: str
    reason: str | None
    changed_by: str
    changed_at: datetime

    def refusal(self) -> str:
        """What a caller of the skill is told."""
        why = f": {self.reason}" if self.reason else ""
        return (f"'{self.skill_id}' is switched off by the operator{why}; nothing was charged, try "
                "again later or choose another skill")

    def as_json(self) -> dict[str, Any]:
        return {"skill_id": self.skill_id, "enabled": False, "reason": self.reason,
                "changed_by": self.changed_by, "changed_at": self.changed_at.isoformat()}


@dataclass(frozen=True)
class DeniedPayer:
    payer: str
    reason: str | None
    created_at: datetime

    def as_json(self) -> dict[str, Any]:
        return {"payer": self.payer, "reason": self.reason, "created_at": self.created_at.isoformat()}


@dataclass(frozen=True)
class ControlsSnapshot:
    """The controls as one replica last read them; `version` is the change counter's value."""

    version: int = -1
    disabled: Mapping[str, SkillSwitch] = field(default_factory=lambda: MappingProxyType({}))
    denied: Mapping[str, DeniedPayer] = field(default_factory=lambda: MappingProxyType({}))


def normalize_payer(value: str) -> str:
    """A payer as the ledger keys it: an EVM address in lower case (checksum or not), a Solana
    address (base58) as it is. ControlError otherwise."""
    text = value.strip() if isinstance(value, str) else ""
    if _EVM_ADDRESS.fullmatch(text):
        return text.lower()
    if _BASE58.fullmatch(text):
        from solders.pubkey import Pubkey

        try:
            if str(Pubkey.from_string(text)) == text:
                return text
        except ValueError:
            pass
    raise ControlError("payer", "payer must be an EVM address (0x + 40 hex digits) or a base58 "
                       f"Solana address, got {text[:60]!r}")


def checked_reason(value: Any) -> str | None:
    """A reason as stored: None or text of at most MAX_REASON_CHARS printable characters
    (surrounding blanks dropped; blank counts as none). ControlError otherwise."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ControlError("reason", f"reason must be a string, got {type(value).__name__}")
    text = value.strip()
    if len(text) > MAX_REASON_CHARS:
        raise ControlError("reason", f"reason must be at most {MAX_REASON_CHARS} characters, got "
                           f"{len(text)}")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs") for c in text):
        raise ControlError("reason", "reason must be printable text (no control characters)")
    return text or None


class Controls:
    """The controls store over the ledger's engine, and this replica's snapshot of it."""

    def __init__(self, engine: AsyncEngine, *, refresh_seconds: float = 2.0) -> None:
        self._engine = engine
        self.refresh_seconds = refresh_seconds
        self.current = ControlsSnapshot()
        self._failing = False

    # -- the hot path: dict lookups on the snapshot
    def disabled(self, skill_id: str) -> SkillSwitch | None:
        return self.current.disabled.get(skill_id)

    def denied(self, payer: str) -> DeniedPayer | None:
        return self.current.denied.get(payer)

    # -- keeping the snapshot current
    async def refresh(self) -> bool:
        """Read the controls again if they changed since the snapshot; True when it was replaced.
        The counter is read first, so the tables read after it are at least as new."""
        async with self._engine.connect() as conn:
            version = await _version(conn)
            if version == self.current.version:
                return False
            switches = (await conn.execute(select(skill_switches_table).where(
                skill_switches_table.c.enabled.is_(False)))).mappings().all()
            payers = (await conn.execute(select(denied_payers_table))).mappings().all()
        if version < self.current.version:  # a concurrent refresh already read a newer one
            return False
        self.current = ControlsSnapshot(
            version,
            MappingProxyType({r["skill_id"]: _switch(r) for r in switches}),
            MappingProxyType({r["payer"]: _denied(r) for r in payers}))
        log.info("operator controls (version %d): %d skill(s) switched off, %d payer(s) denied",
                 version, len(switches), len(payers))
        return True

    async def run_forever(self) -> None:
        """Refresh every `refresh_seconds` until cancelled; a failing database keeps the last
        snapshot and is logged once until it answers again."""
        while True:
            await asyncio.sleep(self.refresh_seconds)
            try:
                await self.refresh()
                if self._failing:
                    log.info("operator controls are read again")
                self._failing = False
            except Exception as exc:  # noqa: BLE001 - whatever it is, the last snapshot holds
                if not self._failing:
                    log.warning("could not read the operator controls (%s); keeping the last ones",
                                type(exc).__name__)
                self._failing = True

    # -- changes (operator API, CLI): written, counted, then this replica's snapshot refreshed
    async def set_skill(self, skill_id: str, *, enabled: bool, reason: str | None = None,
                        changed_by: str) -> SkillSwitch | None:
        """Switch a skill off (returns its switch) or on again (returns None)."""
        if not skill_id or len(skill_id) > MAX_SKILL_ID_CHARS:
            raise ControlError("skill_id", f"skill_id must be 1 to {MAX_SKILL_ID_CHARS} characters")
        row = {"skill_id": skill_id, "enabled": enabled, "reason": checked_reason(reason),
               "changed_by": changed_by[:MAX_CHANGED_BY_CHARS], "changed_at": _now()}
        async with self._engine.begin() as conn:
            await _upsert(conn, skill_switches_table, row, ["skill_id"])
            await _bump(conn)
        await self.refresh()
        return None if enabled else _switch(row)

    async def deny_payer(self, payer: str, *, reason: str | None = None) -> DeniedPayer:
        row = {"payer": normalize_payer(payer), "reason": checked_reason(reason), "created_at": _now()}
        async with self._engine.begin() as conn:
            await _upsert(conn, denied_payers_table, row, ["payer"])
            await _bump(conn)
        await self.refresh()
        return _denied(row)

    async def allow_payer(self, payer: str) -> bool:
        """Take a payer off the deny list; False when it was not on it."""
        key = normalize_payer(payer)
        async with self._engine.begin() as conn:
            gone = await conn.execute(delete(denied_payers_table).where(
                denied_payers_table.c.payer == key))
            if gone.rowcount:
                await _bump(conn)
        await self.refresh()
        return bool(gone.rowcount)

    # -- reading the database itself (the operator's view, not the snapshot)
    async def disabled_skills(self) -> list[SkillSwitch]:
        async with self._engine.connect() as conn:
            rows = (await conn.execute(select(skill_switches_table).where(
                skill_switches_table.c.enabled.is_(False)).order_by(
                skill_switches_table.c.skill_id))).mappings().all()
        return [_switch(r) for r in rows]

    async def denied_payers(self) -> list[DeniedPayer]:
        async with self._engine.connect() as conn:
            rows = (await conn.execute(select(denied_payers_table).order_by(
                denied_payers_table.c.payer))).mappings().all()
        return [_denied(r) for r in rows]


def _now() -> datetime:
    return datetime.now(UTC)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)  # SQLite: naive UTC


def _switch(row: Mapping[str, Any]) -> SkillSwitch:
    return SkillSwitch(row["skill_id"], row["reason"], row["changed_by"], _aware(row["changed_at"]))


def _denied(row: Mapping[str, Any]) -> DeniedPayer:
    return DeniedPayer(row["payer"], row["reason"], _aware(row["created_at"]))


async def _version(conn: AsyncConnection) -> int:
    found = await conn.scalar(select(controls_version_table.c.version).where(
        controls_version_table.c.id == 1))
    return int(found or 0)


async def _upsert(conn: AsyncConnection, table: Any, row: dict[str, Any], keys: list[str]) -> None:
    """INSERT ... ON CONFLICT (keys) DO UPDATE, in SQLite's and PostgreSQL's dialect alike."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    statement = insert(table).values(**row)
    await conn.execute(statement.on_conflict_do_update(
        index_elements=keys, set_={k: statement.excluded[k] for k in row if k not in keys}))


async def _bump(conn: AsyncConnection) -> None:
    """The change counter + 1 (its one row created by the first change), in the change's own
    transaction: replicas reading the new counter read the change with it."""
    table = controls_version_table
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    statement = insert(table).values(id=1, version=1, changed_at=_now())
    await conn.execute(statement.on_conflict_do_update(
        index_elements=["id"], set_={"version": table.c.version + 1,
                                     "changed_at": statement.excluded.changed_at}))
