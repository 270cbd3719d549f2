"""paywire's version, defined once: pyproject.toml's `version`, read from the installed package's
metadata (`pip install .` or `-e .` writes it). Running from a source tree that was never installed,
the version is unknown rather than a second copy that could drift."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("paywire")
except PackageNotFoundError:  # not installed: a checkout on sys.path
    VERSION = "0+unknown"
