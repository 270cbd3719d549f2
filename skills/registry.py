"""The skill registry: every skill paywire sells, by id."""

from __future__ import annotations

from collections.abc import Iterable

from .skill import Skill


class SkillRegistry:
    def __init__(self, skills: Iterable[Skill] = ()) -> None:
        self._skills: dict[str, Skill] = {}
        for skill in skills:
            self.add(skill)

    def add(self, skill: Skill) -> None:
        if skill.id in self._skills:
            other = self._skills[skill.id].source or "built-in"
            raise ValueError(f"skill id {skill.id!r} from {skill.source} is already taken by {other}")
        self._skills[skill.id] = skill

    def get(self, skill_id: str) -> Skill | None:
        return self._skills.get(skill_id)

    def all(self) -> list[Skill]:
        return list(self._skills.values())

    def of_kind(self, kind: str) -> list[Skill]:
        return [s for s in self._skills.values() if s.kind == kind]

    def __len__(self) -> int:
        return len(self._skills)
