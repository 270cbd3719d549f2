"""Whose A2A task is it, and when may it be canceled.

- `OwnedTaskStore`: the SDK's `DatabaseTaskStore` (same table, same rows) where a task keeps the
  owner that created it forever (a later save under another caller's context cannot move it), and
  a read matches any identity the caller proved (`caller_principals`): the task's owner, or the
  wallet that paid for it (`paywire.payer` in the task's metadata, written by the executor when
  the payment settles). A caller that proved nothing reads nothing.
- `PaywireRequestHandler`: the SDK's handler, except that `CancelTask` is refused before it
  reaches the SDK's `ActiveTask.cancel` unless the task waits for payment with no call in flight.
  (The SDK's cancel cancels the executor's producer even when the executor refuses, and marks the
  task failed: a refused cancel during settlement left the payer charged and the task empty.)
  The card it checks capabilities against is the one /.well-known/agent.json serves now (a card
  factory: rebuilt when the registry grows or the operator's switches change), not the card as
  it was at startup.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from a2a.compat.v0_3.conversions import to_compat_task_status
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import DatabaseTaskStore
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    ListTasksRequest,
    ListTasksResponse,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError, TaskNotFoundError
from a2a.utils.task import decode_list_tasks_cursor, encode_list_tasks_cursor
from sqlalchemy import case, func, or_, select

from agent.a2a.executor import NOT_CANCELABLE, PaywireExecutor, caller_principals
from agent.a2a.messages import PAYER_KEY


class OwnedTaskStore(DatabaseTaskStore):
    """Tasks readable only by the identities that created or paid for them (see the module)."""

    def _readable_by(self, principals: tuple[str, ...]) -> Any:
        model = self.task_model
        owned = model.owner.in_(principals)
        wallets = [p for p in principals if p.startswith("wallet:")]  # only wallets pay
        if not wallets:
            return owned  # (served by the SDK's owner index)
        return or_(owned, model.task_metadata[PAYER_KEY].as_string().in_(wallets))

    async def save(self, task: Task, context: ServerCallContext) -> None:
        """Insert under the caller's owner; an existing row keeps the owner it was created with."""
        await self._ensure_initialized()
        async with self.async_session_maker.begin() as session:
            existing = await session.get(self.task_model, task.id)
            owner = existing.owner if existing is not None else self.owner_resolver(context)
            await session.merge(self._to_orm(task, owner))

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        principals = caller_principals(context)
        if not principals:
            return None
        await self._ensure_initialized()
        async with self.async_session_maker() as session:
            found = (await session.execute(select(self.task_model).where(
                self.task_model.id == task_id, self._readable_by(principals)))).scalar_one_or_none()
            return self._from_orm(found) if found is not None else None

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """The SDK's listing (filters, newest first, cursor pages), over the caller's tasks."""
        principals = caller_principals(context)
        page_size = params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE
        if not principals:
            return ListTasksResponse(tasks=[], total_size=0, page_size=page_size)
        await self._ensure_initialized()
        model = self.task_model
        stmt = select(model).where(self._readable_by(principals))
        if params.context_id:
            stmt = stmt.where(model.context_id == params.context_id)
        if params.status:  # the 1.0 name, or the 0.3 one rows written by older versions hold
            stmt = stmt.where(model.status["state"].as_string().in_([
                TaskState.Name(params.status),
                to_compat_task_status(TaskStatus(state=params.status)).state.value]))
        if params.HasField("status_timestamp_after"):
            stmt = stmt.where(model.last_updated >= params.status_timestamp_after.ToDatetime())
        async with self.async_session_maker() as session:
            total = (await session.execute(
                select(func.count()).select_from(stmt.subquery()))).scalar_one()
            ordered = stmt.order_by(case((model.last_updated.is_(None), 1), else_=0).asc(),
                                    model.last_updated.desc(), model.id.desc())
            if params.page_token:
                cursor = decode_list_tasks_cursor(params.page_token)
                if cursor is None:
                    raise InvalidParamsError(f"Invalid page token: {params.page_token}")
                ordered = ordered.where(self._after_cursor(cursor))
            rows = (await session.execute(ordered.limit(page_size + 1))).scalars().all()
        page = rows[:page_size]
        next_token = (encode_list_tasks_cursor(self._cursor_for(page[-1]))
                      if len(rows) == page_size + 1 else None)
        return ListTasksResponse(tasks=[self._from_orm(r) for r in page], total_size=total,
                                 next_page_token=next_token, page_size=page_size)


class PaywireRequestHandler(DefaultRequestHandler):
    """The SDK's request handler over the card as it is now (`card`: the card factory the
    well-known routes serve); a cancel it would let cut a running call is refused first."""

    def __init__(self, *, card: Callable[[], AgentCard], **kwargs: Any) -> None:
        self._current_card = card
        super().__init__(agent_card=card(), **kwargs)

    # The SDK reads `self._agent_card` wherever it checks the card (capabilities, the extended
    # card, input modes): a property over the factory, so no check sees the startup card.
    @property
    def _agent_card(self) -> AgentCard:
        return self._current_card()

    @_agent_card.setter
    def _agent_card(self, _startup: AgentCard) -> None:
        """The SDK's __init__ stores the card it was given: the factory has it already."""

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext
                             ) -> Task | None:
        executor = self.agent_executor
        assert isinstance(executor, PaywireExecutor)
        task = await self.task_store.get(params.id, context)  # owner-scoped: strangers get -32001
        if task is None:
            raise TaskNotFoundError
        if not executor.reserve_cancel(task):
            raise TaskNotCancelableError(
                message=f"task {task.id} is {TaskState.Name(task.status.state)}: {NOT_CANCELABLE}")
        try:
            return await super().on_cancel_task(params, context)
        finally:
            executor.release_cancel(task.id)
