"""Models sold per call: the model table (`catalog`) and what serves it."""

from .catalog import (
    OPERATIONS,
    TOKEN_OPERATIONS,
    Catalog,
    ModelPrices,
    ModelSpec,
    ProviderSpec,
    Upstream,
    load_catalog,
)

__all__ = [
    "OPERATIONS", "TOKEN_OPERATIONS", "Catalog", "ModelPrices", "ModelSpec", "ProviderSpec", "Upstream",
    "load_catalog",
]
