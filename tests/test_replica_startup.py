"""Replicas starting together on a new database: the schema and the a2a SDK's task table are
created once, and no replica fails to start because another created them first."""

from __future__ import annotations

import asyncio

from a2a.server.tasks import DatabaseTaskStore
from sqlalchemy.ext.asyncio import create_async_engine

from agent.app import initialize_task_store
from payments.schema import ensure_current, schema_state
from tests.support.postgres import PostgresServer


async def test_replicas_starting_together_create_everything_once(
    postgres_server: PostgresServer,
) -> None:
    url = postgres_server.fresh_url()
    engines = [create_async_engine(url) for _ in range(4)]  # four replicas, four pools
    try:
        await asyncio.gather(*(ensure_current(e) for e in engines))
        stores = [DatabaseTaskStore(e) for e in engines]
        await asyncio.gather(*(initialize_task_store(s) for s in stores))
        assert (await schema_state(engines[0]))[0] == "current"
        assert all(s._initialized for s in stores)
    finally:
        await asyncio.gather(*(e.dispose() for e in engines))
