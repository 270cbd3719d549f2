"""Models sold per call: the model table (`catalog`, its values in `spec`) and what serves it."""

from .catalog import Catalog, CatalogError, load_catalog
from .spec import (
    OPERATIONS,
    TOKEN_OPERATIONS,
    ModelPrices,
    ModelSpec,
    ProviderAccess,
    ProviderSpec,
    ProviderVariables,
    Upstream,
)

__all__ = [
    "OPERATIONS", "TOKEN_OPERATIONS", "Catalog", "CatalogError", "ModelPrices", "ModelSpec", "ProviderAccess",
    "ProviderSpec", "ProviderVariables", "Upstream", "load_catalog",
]
