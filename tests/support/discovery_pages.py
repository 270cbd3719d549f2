"""Every item of a gateway's GET /discovery/resources, page after page."""

from __future__ import annotations

from typing import Any

import httpx


async def all_discovered(http: httpx.AsyncClient) -> list[dict[str, Any]]:
    """The discovery items of the gateway `http` is based on, read 100 at a time to the end."""
    items: list[dict[str, Any]] = []
    offset = 0
    while True:
        page = (await http.get("/discovery/resources", params={"limit": 100, "offset": offset})).json()
        items += page["items"]
        offset += len(page["items"])
        if not page["items"] or offset >= page["pagination"]["total"]:
            return items
