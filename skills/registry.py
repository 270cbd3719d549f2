"""The skill registry: every skill paywire sells, by id. Its `version` moves with every change (a
skill added, replaced or removed): what is cached from it is keyed by that, never by its size."""

from __future__ import annotations

from collections.abc import Iterable

from .skill import Skill


class SkillRegistry:
    def __init__(self, skills: Iterable[Skill] = ()) -> None:
        self._skills: dict[str, Skill] = {}
        self.version = 0  # moves with every add, replace and remove
        for skill in skills:
            self.add(skill)

    def add(self, skill: Skill) -> None:
        if skill.id in self._skills:
            other = self._skills[skill.id].source or "built-in"
            raise ValueError(f"skill id {skill.id!r} from {skill.source} is already taken by {other}")
        self._skills[skill.id] = skill
        self.version += 1

    def replace(self, skill: Skill) -> None:
        """The skill of the same id, changed (a new price, a new description), in its place."""
        if skill.id not in self._skills:
            raise KeyError(skill.id)
        self._skills[skill.id] = skill
        self.version += 1

    def remove(self, skill_id: str) -> Skill | None:
        """The skill withdrawn (None: there was none of that id)."""
        removed = self._skills.pop(skill_id, None)
        if removed is not None:
            self.version += 1
        return removed

    def get(self, skill_id: str) -> Skill | None:
        return self._skills.get(skill_id)

    def all(self) -> list[Skill]:
        return list(self._skills.values())

    def of_kind(self, kind: str) -> list[Skill]:
        return [s for s in self._skills.values() if s.kind == kind]

    def __len__(self) -> int:
        return len(self._skills)
