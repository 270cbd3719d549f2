"""The A2A face: an AgentExecutor that turns A2A messages into pipeline calls.

Payment, both ways, through the same `Gateway.call` as REST (same price, ledger, claim):
- HTTP level: a `PAYMENT-SIGNATURE` / `X-PAYMENT` header on the POST to /a2a is passed to the
  pipeline; the receipt goes to the task's status metadata (and, via `HttpPaymentScope`, to the
  HTTP response headers).
- In band (a2a-x402 v0.2, or v0.1: either URI activates it): an unpaid call leaves the task
  `input-required` with `x402.payment.required` (x402's v1 form for a v0.1-only client); the
  client answers on the same task with `payment-submitted` and `x402.payment.payload`; the task
  completes with `x402.payment.receipts` or fails with `x402.payment.error`.

Cancellation never cuts a settlement halfway. `PaywireRequestHandler` (a2a_tasks) refuses a
cancel unless the task waits for payment with no call in flight, so the SDK never cancels running
work on a caller's request. When the SDK cancels an execution anyway (shutdown), a call whose
settlement had not begun is stopped (nothing is charged: `SettleGuard`), and one whose settlement
had begun runs to its end and its result and receipt are stored on the task.

A paid result reaches its payer through the task (its owner, or the wallet that paid, reads it
with tasks/get whoever is still connected): it counts as delivered once the completed task
holding it is stored, and not if it could not be (a retry of the payment then gets it).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

from a2a.extensions.common import get_requested_extensions
from a2a.helpers.proto_helpers import new_data_part, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue_v2 import EventQueue
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.tasks import TaskStore, TaskUpdater
from a2a.server.tasks.task_manager import append_artifact_to_task
from a2a.types import (
    Message,
    Part,
    Role,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Struct
from starlette.requests import Request

from agent.a2a.messages import (
    ERROR_KEY,
    PAYER_KEY,
    PAYLOAD_KEY,
    RECEIPTS_KEY,
    REQUEST_KEY,
    REQUIRED_KEY,
    STATUS_KEY,
    X402_EXTENSION,
    X402_V01_EXTENSIONS,
    MessageError,
    SkillCall,
    message_metadata,
    parse_skill_call,
)
from agent.edge.http_io import json_bytes, json_value
from agent.edge.identity import wallet_owner
from agent.pipeline.gateway import Gateway
from agent.pipeline.outcomes import Delivered, Outcome, PaymentDemanded, Refused
from agent.pipeline.requests import CallRequest, Payment
from agent.pipeline.shielding import SettleGuard, settle_guard


@dataclass
class HttpPaymentScope:
    """Per-HTTP-request slot: the payment header the HTTP layer read (kept out of the SDK's call
    context, which its debug logs print), and what the executor leaves for the HTTP answer."""

    payment: Payment | None = None
    receipt: Any = None
    demanded: PaymentDemanded | None = None
    outcomes: list[Outcome] = field(default_factory=list)

    def __repr__(self) -> str:  # it travels in the SDK's call context, which DEBUG logs print
        return f"HttpPaymentScope(payment={'set' if self.payment else None})"


# request.state / call-context state keys, filled by the HTTP layer (a2a_http):
OWNER_STATE = "paywire_owner"  # who owns the tasks this call creates: `wallet:..` or `token:<sha256>`
PAYMENT_STATE = "paywire_http_payment"  # the HttpPaymentScope of the HTTP request
PRINCIPALS_STATE = "paywire_principals"  # every identity the caller proved; reads match any of them
CLIENT_STATE = "paywire_client"  # the caller's address (per-client limits)
LEGACY_EXTENSIONS_HEADER = "X-A2A-Extensions"  # A2A 0.3's name of the A2A-Extensions header
NOBODY = "nobody"  # the owner of a call that proved nothing (it can only read nothing)
# Headers that prove or pay: dropped from the SDK's call context (its DEBUG logs print contexts).
SECRET_HEADERS = ("authorization", "cookie", "paywire-task-token", "sign-in-with-x",
                  "payment-signature", "x-payment")


class OwnerContextBuilder(DefaultServerCallContextBuilder):
    """Carries the identity the HTTP layer proved (SIWX, task token) into the A2A call context."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        headers = context.state.get("headers")
        if isinstance(headers, dict):
            for name in SECRET_HEADERS:
                headers.pop(name, None)
        context.state[OWNER_STATE] = getattr(request.state, OWNER_STATE, NOBODY)
        context.state[PRINCIPALS_STATE] = tuple(getattr(request.state, PRINCIPALS_STATE, ()))
        context.state[PAYMENT_STATE] = getattr(request.state, PAYMENT_STATE, None)
        context.state[CLIENT_STATE] = request.client.host if request.client is not None else None
        # 0.3-era clients activate extensions with X-A2A-Extensions (the SDK reads A2A-Extensions)
        context.requested_extensions |= get_requested_extensions(
            request.headers.getlist(LEGACY_EXTENSIONS_HEADER))
        return context


def wants_v1_quote(requested: set[str]) -> bool:
    """A client that activated a2a-x402 v0.1 only gets the in-band quote in x402's v1 form
    (`x402Version` 1, `maxAmountRequired`, v1 network names), the form v0.1 defines; it may pay
    with a v1 or a v2 payload either way."""
    return bool(requested & X402_V01_EXTENSIONS) and X402_EXTENSION not in requested


def task_owner(context: ServerCallContext) -> str:
    """The owner a new task is stored under: the caller's proven wallet, else its task token's
    hash. A stored task keeps the owner that created it (see `a2a_tasks.OwnedTaskStore`)."""
    return str(context.state.get(OWNER_STATE, NOBODY))


def caller_principals(context: ServerCallContext) -> tuple[str, ...]:
    """Every identity the caller proved: it may read a task owned by, or paid by, any of them."""
    return tuple(context.state.get(PRINCIPALS_STATE, ()))


def caller_address(context: RequestContext) -> str | None:
    """The caller's address (OwnerContextBuilder copies it from the request)."""
    state = context.call_context.state if context.call_context else {}
    found = state.get(CLIENT_STATE)
    return found if isinstance(found, str) else None


def http_scope(context: RequestContext) -> HttpPaymentScope | None:
    """The HTTP request's payment slot, handed over in the SDK's call context (a2a_http puts it in
    the request state; OwnerContextBuilder copies it)."""
    state = context.call_context.state if context.call_context else {}
    scope = state.get(PAYMENT_STATE)
    return scope if isinstance(scope, HttpPaymentScope) else None


def _struct(data: dict[str, Any]) -> Struct:
    s = Struct()
    ParseDict(data, s)
    return s


def _agent_message(context_id: str, task_id: str, text: str, metadata: dict[str, Any] | None = None
                   ) -> Message:
    msg = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_AGENT, context_id=context_id,
                  task_id=task_id, parts=[new_text_part(text)])
    if metadata:
        msg.metadata.CopyFrom(_struct(metadata))
    return msg


def json_text(value: Any) -> str:
    """JSON text exactly as the REST face sends it (the edge's codec)."""
    return json_bytes(value).decode()


def _dump(model: Any) -> dict[str, Any]:
    return model.model_dump(by_alias=True, exclude_none=True)


class PaywireExecutor(AgentExecutor):
    def __init__(self, gateway: Gateway, rpc_url: str, store: TaskStore | None = None) -> None:
        self.gateway = gateway
        self.rpc_url = rpc_url
        self.store = store  # where a task is saved when the SDK dropped its queue (shutdown)
        self._running: set[str] = set()  # tasks with a call in the pipeline (it may settle)
        self._canceling: set[str] = set()  # tasks a cancel holds: no payment for them starts

    def reserve_cancel(self, task: Task) -> bool:
        """May `task` be canceled now? Only one waiting for payment with no call in flight; from
        here until `release_cancel`, no payment for it starts. Synchronous, so nothing can start
        between the check and the reservation."""
        if (task.id in self._running or task.id in self._canceling
                or task.status.state != TaskState.TASK_STATE_INPUT_REQUIRED):
            return False
        self._canceling.add(task.id)
        return True

    def release_cancel(self, task_id: str) -> None:
        self._canceling.discard(task_id)

    def resolve(self, message: Message) -> SkillCall:
        """Parse and check the skill exists: errors become JSON-RPC invalid params."""
        try:
            call = parse_skill_call(message)
        except MessageError as exc:
            raise InvalidParamsError(message=exc.message, data={"field": exc.field}) from None
        if self.gateway.registry.get(call.skill_id) is None:
            raise InvalidParamsError(
                message=f"unknown skill '{call.skill_id}'; the agent card lists the skills",
                data={"field": "skill", "skill": call.skill_id})
        return call

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = context.task_id or ""
        if task_id in self._canceling:
            return  # a cancel holds this task: its payment is not taken, the cancel ends it
        self._running.add(task_id)
        recorder = _Recorder(event_queue, context)
        guard = SettleGuard()
        reset = settle_guard.set(guard)
        try:  # the work runs as its own task: a cancelled execute decides whether it stops
            work = asyncio.ensure_future(self._execute(context, recorder))
        finally:
            settle_guard.reset(reset)
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            await self._interrupted(work, guard, recorder)
            raise
        finally:
            self._running.discard(task_id)
            await self._store_dropped(recorder, context)

    async def _interrupted(self, work: asyncio.Future[None], guard: SettleGuard,
                           recorder: _Recorder) -> None:
        """The SDK cancelled this execution (shutdown). Before settlement the call is stopped (the
        pipeline releases its claim: nothing is charged) and the task fails saying so; once
        settlement has begun the call runs to its end and the task gets its result and receipt
        (stored by `_store_dropped` if the SDK already closed its queue)."""
        stopped = guard.stop()
        if stopped:
            work.cancel()
        while not work.done():
            try:
                await asyncio.shield(work)
            except asyncio.CancelledError:
                continue  # cancelled again: the work still has to finish
            except Exception:  # noqa: BLE001 - its own failure ends the task like any failure
                break
        task = recorder.task
        if task.id and task.status.state not in _TERMINAL:
            text = ("paywire stopped this call before its payment settled; nothing was charged; "
                    "send it again" if stopped else
                    "this call failed after its payment began to settle; the ledger has the outcome")
            await TaskUpdater(recorder, task.id, task.context_id).failed(_agent_message(
                task.context_id, task.id, text,
                {"paywire.error": {"code": "interrupted", "status": 503}}))

    async def _store_dropped(self, recorder: _Recorder, context: RequestContext) -> None:
        """The SDK closed the task's queue (shutdown) before the executor's last events: the task
        those events built is saved here, and a result it holds counts as delivered once it is
        (not at all if it cannot be: a retry of the payment gets it)."""
        if not recorder.dropped:
            return
        stored = False
        try:
            if self.store is not None and recorder.task.id and context.call_context:
                await self.store.save(recorder.task, context.call_context)
                stored = True
        finally:
            await recorder.stored(stored)

    async def _execute(self, context: RequestContext, event_queue: _Recorder) -> None:
        message = context.message
        assert message is not None
        task = context.current_task
        meta = message_metadata(message)
        submitted = meta.get(STATUS_KEY) == "payment-submitted"
        if task is not None and submitted:
            await self._pay_pending(context, event_queue, task, meta)
            return
        call = self.resolve(message)
        task_id, context_id = context.task_id or str(uuid.uuid4()), context.context_id or str(
            uuid.uuid4())
        if task is None:
            task = Task(id=task_id, context_id=context_id,
                        status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED), history=[message])
            task.metadata.CopyFrom(_struct({REQUEST_KEY: json_text(
                {"skill": call.skill_id, "input": call.input, "operation": call.operation})}))
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        scope = http_scope(context)
        payment = scope.payment if scope is not None else None
        if payment is not None:
            await updater.start_work()
        outcome = await self.gateway.call(CallRequest(
            skill_id=call.skill_id, payload=call.input, resource_url=self.rpc_url, payment=payment,
            stream=True, operation=call.operation, client=caller_address(context)))
        await self._finish(updater, event_queue, outcome, scope, paid_attempt=payment is not None,
                           v1_quote=wants_v1_quote(context.requested_extensions))

    async def _pay_pending(self, context: RequestContext, event_queue: _Recorder, task: Task,
                           meta: dict[str, Any]) -> None:
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        stored = MessageToDict(task.metadata).get(REQUEST_KEY) if task.HasField("metadata") else None
        if task.status.state != TaskState.TASK_STATE_INPUT_REQUIRED or not stored:
            raise InvalidParamsError(
                message=f"task {task.id} is not waiting for a payment (state "
                        f"{TaskState.Name(task.status.state)})", data={"field": "message.taskId"})
        request = json_value(stored)
        late = self.gateway.late_payment(
            time.time() - task.status.timestamp.ToDatetime(UTC).timestamp())
        if late is not None:
            await updater.failed(_agent_message(
                task.context_id, task.id, late,
                {STATUS_KEY: "payment-failed", ERROR_KEY: "payment_window_expired",
                 RECEIPTS_KEY: []}))
            return
        payload = meta.get(PAYLOAD_KEY)
        if not isinstance(payload, dict):
            await updater.failed(_agent_message(
                task.context_id, task.id,
                f"metadata '{PAYLOAD_KEY}' must hold the signed x402 PaymentPayload object",
                {STATUS_KEY: "payment-failed", ERROR_KEY: "invalid_payload",
                 RECEIPTS_KEY: []}))
            return
        await updater.start_work()
        outcome = await self.gateway.call(CallRequest(
            skill_id=request["skill"], payload=request["input"], resource_url=self.rpc_url,
            payment=Payment.from_object(payload, PAYLOAD_KEY), stream=True,
            operation=request.get("operation"), client=caller_address(context)))
        await self._finish(updater, event_queue, outcome, http_scope(context), paid_attempt=True)

    async def _finish(self, updater: TaskUpdater, recorder: _Recorder, outcome: Outcome,
                      scope: HttpPaymentScope | None, *, paid_attempt: bool,
                      v1_quote: bool = False) -> None:
        if scope is not None:
            scope.outcomes.append(outcome)
        ctx, tid = updater.context_id, updater.task_id
        if isinstance(outcome, Delivered):
            if scope is not None and outcome.receipt is not None:
                scope.receipt = outcome.receipt
            # The result reaches the payer through its task, stored whoever is still connected
            # (read with tasks/get by its owner, or by the wallet that paid): delivered once the
            # completed task holding all of it is handed to the task store.
            stored = False
            try:
                stored = await (self._stream_to_task(updater, outcome) if outcome.stream is not None
                                else self._result_to_task(updater, outcome))
            finally:
                recorder.handed_over(outcome, stored)
            if scope is not None and outcome.receipt is not None:  # (a stream charged at its end)
                scope.receipt = outcome.receipt
            return
        if isinstance(outcome, PaymentDemanded):
            if not paid_attempt:
                required = _dump(outcome.required_v1 if v1_quote else outcome.required)
                await updater.requires_input(_agent_message(
                    ctx, tid, "Payment is required: sign one of the accepted x402 requirements "
                              "and send it on this task.",
                    {STATUS_KEY: "payment-required", REQUIRED_KEY: required}))
                return
            if scope is not None:
                scope.demanded = outcome
            receipts = [_dump(outcome.receipt)] if outcome.receipt is not None else []
            await updater.failed(_agent_message(
                ctx, tid, outcome.message or f"payment failed: {outcome.reason}",
                {STATUS_KEY: "payment-failed", ERROR_KEY: outcome.reason or "payment_failed",
                 RECEIPTS_KEY: receipts}))
            return
        assert isinstance(outcome, Refused)
        meta: dict[str, Any] = {"paywire.error": {
            "code": outcome.code, "message": outcome.message, "param": outcome.param,
            "status": outcome.status, "retry_after": outcome.retry_after}}
        if outcome.receipt is not None:  # a settlement not confirmed yet: its transaction
            meta[RECEIPTS_KEY] = [_dump(outcome.receipt)]
            if scope is not None:
                scope.receipt = outcome.receipt
        await updater.failed(_agent_message(ctx, tid, outcome.message, meta))

    async def _result_to_task(self, updater: TaskUpdater, outcome: Delivered) -> bool:
        """A result as the task's artifact, and the task completed with its receipt (True)."""
        body = outcome.result.body
        parts: list[Part] = []
        if isinstance(body, bytes | bytearray) and _is_json(outcome.result.media_type):
            body = _json_or_bytes(bytes(body))  # a forwarded upstream's JSON: a data part
        if isinstance(body, bytes | bytearray):
            parts.append(Part(raw=bytes(body), media_type=outcome.result.media_type))
        else:
            # The data part is convenient but protobuf turns its integers into doubles;
            # the JSON text part is the REST body exactly.
            parts.append(new_data_part(body, "application/json"))
            parts.append(new_text_part(json_text(body), "application/json"))
            text = _answer_text(body)
            if text:
                parts.append(new_text_part(text))
        await updater.add_artifact(parts, name="result", last_chunk=True)
        receipts = [_dump(outcome.receipt)] if outcome.receipt is not None else []
        meta = {STATUS_KEY: "payment-completed", RECEIPTS_KEY: receipts} if receipts else {}
        await updater.update_status(TaskState.TASK_STATE_COMPLETED,
                                    _agent_message(updater.context_id, updater.task_id, "Done.", meta),
                                    metadata=_payer_grant(outcome))
        return True

    async def _stream_to_task(self, updater: TaskUpdater, outcome: Delivered) -> bool:
        """A delivered stream as the task's artifact, appended chunk by chunk; the task completes
        (True) or, if the upstream broke after settlement, fails with the receipt (False)."""
        assert outcome.stream is not None
        ctx, tid = updater.context_id, updater.task_id
        receipts = [_dump(outcome.receipt)] if outcome.receipt is not None else []
        artifact_id = str(uuid.uuid4())
        count = 0
        try:
            async for chunk in outcome.stream:
                await updater.add_artifact([_chunk_part(chunk)], artifact_id=artifact_id,
                                           name="result", append=count > 0, last_chunk=False)
                count += 1
        except Exception as exc:  # noqa: BLE001 - the upstream broke after settlement
            await updater.update_status(TaskState.TASK_STATE_FAILED, _agent_message(
                ctx, tid, f"the result stream broke after {count} chunks "
                          f"({type(exc).__name__}); the payment had settled: its receipt is "
                          "attached", {STATUS_KEY: "payment-completed", RECEIPTS_KEY: receipts,
                                       "paywire.error": {"code": "stream_broken"}}),
                metadata=_payer_grant(outcome))
            return False
        await updater.add_artifact([new_text_part("")], artifact_id=artifact_id, name="result",
                                   append=True, last_chunk=True)
        if outcome.receipt is not None:  # a stream charged at its end has its receipt now
            receipts = [_dump(outcome.receipt)]
        meta = {STATUS_KEY: "payment-completed", RECEIPTS_KEY: receipts} if receipts else {}
        await updater.update_status(TaskState.TASK_STATE_COMPLETED,
                                    _agent_message(ctx, tid, "Done.", meta),
                                    metadata=_payer_grant(outcome))
        return True

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Reached only for a task `reserve_cancel` admitted (waiting for payment, nothing running):
        the SDK cancels the executor's producer after this, and nothing of a call is cut."""
        task = context.current_task
        if task is None or task.id not in self._canceling:
            raise TaskNotCancelableError(message=NOT_CANCELABLE)
        await TaskUpdater(event_queue, task.id, task.context_id).cancel()


NOT_CANCELABLE = ("only a task waiting for payment can be canceled; a paid call runs to the end "
                  "and keeps its result and receipt")
_TERMINAL = {TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_CANCELED,
             TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_REJECTED}


class _Recorder:
    """The queue the executor writes to: passes each event on to the SDK's queue and applies it to
    a copy of the task, as the SDK's TaskManager does. At shutdown the SDK closes its queue and
    drops what follows; a call that settled still ends, and `PaywireExecutor._store_dropped`
    stores this copy itself (the pipeline's word on its result waits for that save)."""

    def __init__(self, queue: EventQueue, context: RequestContext) -> None:
        self.queue = queue
        self.task = Task()
        self.dropped = False
        self._unsaved: list[Delivered] = []  # results in this copy of the task, not saved yet
        if context.current_task is not None:
            self.task.CopyFrom(context.current_task)
            message = context.message
            if message is not None and all(m.message_id != message.message_id
                                           for m in self.task.history):
                self.task.history.append(message)

    async def enqueue_event(self, event: Any) -> None:
        if isinstance(event, Task):
            self.task.CopyFrom(event)
        elif isinstance(event, TaskStatusUpdateEvent):
            if self.task.status.HasField("message"):
                self.task.history.append(self.task.status.message)
            if event.HasField("metadata"):
                self.task.metadata.MergeFrom(event.metadata)
            self.task.status.CopyFrom(event.status)
        elif isinstance(event, TaskArtifactUpdateEvent):
            append_artifact_to_task(self.task, event)
        if self._closed():
            self.dropped = True  # the SDK's consumer is gone: not passed on, stored at the end
            return
        await self.queue.enqueue_event(event)
        if self._closed():  # closed meanwhile: the SDK dropped the event without a word
            self.dropped = True

    def _closed(self) -> bool:
        is_closed = getattr(self.queue, "is_closed", None)
        return is_closed is not None and bool(is_closed())

    def handed_over(self, outcome: Delivered, stored: bool) -> None:
        """The pipeline's word on a result put in this task (`stored`: the completed task holding
        it went to the SDK, which stores it), or not. A task the SDK's queue dropped is saved by
        the executor at the end (`stored`): its word waits for that save."""
        if stored and self.dropped:
            self._unsaved.append(outcome)
        else:
            outcome.handed_over(stored)

    async def stored(self, saved: bool) -> None:
        """The executor saved this copy of the task (`saved`), or could not: the word on the
        results it holds, written before the shutting-down process goes on."""
        waiting, self._unsaved = self._unsaved, []
        for outcome in waiting:
            await outcome.record_handover(saved)


def _payer_grant(outcome: Delivered) -> dict[str, Any] | None:
    """Task metadata naming the wallet that paid: it may read the task too (its signature came in
    the creator's own request), whoever owns it."""
    payer = outcome.receipt.payer if outcome.receipt is not None else None
    return {PAYER_KEY: wallet_owner(payer)} if payer else None


def _is_json(media_type: str) -> bool:
    kind = media_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def _json_or_bytes(raw: bytes) -> Any:
    try:
        return json_value(raw)
    except ValueError:
        return raw


def _chunk_part(chunk: Any) -> Part:
    """A streamed chunk as a part: text as it arrives (chat deltas), other JSON as data."""
    if isinstance(chunk, str):
        return new_text_part(chunk)
    if isinstance(chunk, dict):
        choices = chunk.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            delta = choices[0].get("delta") or {}
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                return new_text_part(delta["content"])
    return new_data_part(chunk, "application/json")


def _answer_text(body: Any) -> str | None:
    """The human-readable answer inside a result, when there is one (chat, help)."""
    if isinstance(body, dict):
        choices = body.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            msg = choices[0].get("message") or {}
            if isinstance(msg, dict) and isinstance(msg.get("content"), str):
                return msg["content"]
        if isinstance(body.get("text"), str):
            return body["text"]
    return None
