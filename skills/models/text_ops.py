"""Model operations (see OPERATION_FACTORIES in model_skills)."""

from __future__ import annotations

from typing import Any

FACTORIES: dict[str, Any] = {}
