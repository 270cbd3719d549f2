"""The A2A face: an AgentExecutor that turns A2A messages into pipeline calls.

Payment, both ways, through the same `Gateway.call` as REST (same price, ledger, claim):
- HTTP level: a `PAYMENT-SIGNATURE` / `X-PAYMENT` header on the POST to /a2a is passed to the
  pipeline; the receipt goes to the task's status metadata (and, via `HttpPaymentScope`, to the
  HTTP response headers).
- In band (a2a-x402 v0.2): an unpaid call leaves the task `input-required` with
  `x402.payment.required`; the client answers on the same task with `payment-submitted` and
  `x402.payment.payload`; the task completes with `x402.payment.receipts` or fails with
  `x402.payment.error`.
"""

from __future__ import annotations

import contextvars
import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

from a2a.helpers.proto_helpers import new_data_part, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue_v2 import EventQueue
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.tasks import TaskUpdater
from a2a.types import Message, Part, Role, Task, TaskState, TaskStatus
from a2a.utils.errors import InvalidParamsError, TaskNotCancelableError
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.struct_pb2 import Struct
from starlette.requests import Request

from payments.codec import encode_json_b64, read_payment_header
from payments.identity import wallet_owner

from .a2a_messages import (
    ERROR_KEY,
    PAYLOAD_KEY,
    RECEIPTS_KEY,
    REQUEST_KEY,
    REQUIRED_KEY,
    STATUS_KEY,
    X402_EXTENSION,
    MessageError,
    SkillCall,
    message_metadata,
    parse_skill_call,
)
from .gateway import CallRequest, Delivered, Gateway, Outcome, PaymentDemanded, Refused


@dataclass
class HttpPaymentScope:
    """Per-HTTP-request slot where the executor leaves what the HTTP layer must answer with."""

    receipt: Any = None
    demanded: PaymentDemanded | None = None
    outcomes: list[Outcome] = field(default_factory=list)


OWNER_STATE = "paywire_owner"  # request.state key / call-context state key of the caller's identity


class OwnerContextBuilder(DefaultServerCallContextBuilder):
    """Carries the identity the HTTP layer proved (SIWX) into the A2A call context."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state[OWNER_STATE] = getattr(request.state, OWNER_STATE, "anonymous")
        return context


def task_owner(context: ServerCallContext) -> str:
    """Owner of the tasks a call creates or may read: a proven or paying wallet, else anonymous.

    Anonymous tasks are those nobody paid for (quotes, free help, refused calls): a task a payer
    paid for is owned by that payer's wallet and is readable only with a SIWX proof of it.
    """
    return str(context.state.get(OWNER_STATE, "anonymous"))


http_payment_scope: contextvars.ContextVar[HttpPaymentScope | None] = contextvars.ContextVar(
    "paywire_http_payment_scope", default=None)


def extension_requested(context: RequestContext) -> bool:
    if X402_EXTENSION in context.requested_extensions:
        return True
    headers = (context.call_context.state or {}).get("headers", {}) if context.call_context else {}
    legacy = headers.get("x-a2a-extensions", "")
    return X402_EXTENSION in {v.strip() for v in legacy.split(",")}


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


def _dump(model: Any) -> dict[str, Any]:
    return model.model_dump(by_alias=True, exclude_none=True)


class PaywireExecutor(AgentExecutor):
    def __init__(self, gateway: Gateway, rpc_url: str, payment_window_seconds: float = 900) -> None:
        self.gateway = gateway
        self.rpc_url = rpc_url
        self.payment_window = payment_window_seconds

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
            task.metadata.CopyFrom(_struct({REQUEST_KEY: json.dumps(
                {"skill": call.skill_id, "input": call.input, "operation": call.operation})}))
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        headers = (context.call_context.state or {}).get("headers", {}) if context.call_context else {}
        payment = read_payment_header(headers)
        outcome = await self.gateway.call(CallRequest(
            skill_id=call.skill_id, payload=call.input, resource_url=self.rpc_url, payment=payment,
            stream=True, operation=call.operation))
        await self._finish(updater, outcome, context, paid_attempt=payment is not None)

    async def _pay_pending(self, context: RequestContext, event_queue: EventQueue, task: Task,
                           meta: dict[str, Any]) -> None:
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        stored = MessageToDict(task.metadata).get(REQUEST_KEY) if task.HasField("metadata") else None
        if task.status.state != TaskState.TASK_STATE_INPUT_REQUIRED or not stored:
            raise InvalidParamsError(
                message=f"task {task.id} is not waiting for a payment (state "
                        f"{TaskState.Name(task.status.state)})", data={"field": "message.taskId"})
        request = json.loads(stored)
        waited = time.time() - task.status.timestamp.ToDatetime(UTC).timestamp()
        if waited > self.payment_window:
            await updater.failed(_agent_message(
                task.context_id, task.id,
                f"this task waited {waited:.0f}s for payment, longer than the "
                f"{self.payment_window:.0f}s window; send the request again for a fresh quote",
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
        header = "PAYMENT-SIGNATURE" if payload.get("x402Version") == 2 else "X-PAYMENT"
        outcome = await self.gateway.call(CallRequest(
            skill_id=request["skill"], payload=request["input"], resource_url=self.rpc_url,
            payment=(header, encode_json_b64(payload)), stream=True,
            operation=request.get("operation")))
        await self._finish(updater, outcome, context, paid_attempt=True)

    async def _finish(self, updater: TaskUpdater, outcome: Outcome, context: RequestContext, *,
                      paid_attempt: bool) -> None:
        scope = http_payment_scope.get()
        receipt = getattr(outcome, "receipt", None)
        if isinstance(outcome, Delivered) and receipt is not None and receipt.payer:
            _take_ownership(context, receipt.payer)
        if scope is not None:
            scope.outcomes.append(outcome)
        ctx, tid = updater.context_id, updater.task_id
        if isinstance(outcome, Delivered) and outcome.stream is not None:
            if scope is not None and outcome.receipt is not None:
                scope.receipt = outcome.receipt
            artifact_id = str(uuid.uuid4())
            count = 0
            async for chunk in outcome.stream:
                await updater.add_artifact([_chunk_part(chunk)], artifact_id=artifact_id,
                                           name="result", append=count > 0, last_chunk=False)
                count += 1
            await updater.add_artifact([new_text_part("")], artifact_id=artifact_id, name="result",
                                       append=True, last_chunk=True)
            receipts = [_dump(outcome.receipt)] if outcome.receipt is not None else []
            meta = {STATUS_KEY: "payment-completed", RECEIPTS_KEY: receipts} if receipts else {}
            await updater.complete(_agent_message(ctx, tid, "Done.", meta))
            return
        if isinstance(outcome, Delivered):
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
                parts.append(new_text_part(json.dumps(body, ensure_ascii=False), "application/json"))
                text = _answer_text(body)
                if text:
                    parts.append(new_text_part(text))
            await updater.add_artifact(parts, name="result", last_chunk=True)
            receipts = [_dump(outcome.receipt)] if outcome.receipt is not None else []
            if scope is not None and outcome.receipt is not None:
                scope.receipt = outcome.receipt
            meta = {STATUS_KEY: "payment-completed", RECEIPTS_KEY: receipts} if receipts else {}
            await updater.complete(_agent_message(ctx, tid, "Done.", meta))
            return
        if isinstance(outcome, PaymentDemanded):
            if not paid_attempt:
                required = _dump(outcome.required)
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
        await updater.failed(_agent_message(
            ctx, tid, outcome.message,
            {"paywire.error": {"code": outcome.code, "message": outcome.message,
                               "param": outcome.param, "status": outcome.status}}))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        if task is None or task.status.state != TaskState.TASK_STATE_INPUT_REQUIRED:
            raise TaskNotCancelableError(
                message="only a task waiting for payment can be canceled; paid calls run to the end")
        await TaskUpdater(event_queue, task.id, task.context_id).cancel()


def _is_json(media_type: str) -> bool:
    kind = media_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def _json_or_bytes(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _take_ownership(context: RequestContext, payer: str) -> None:
    """A paid task belongs to its payer from now on (unless a proven wallet created it)."""
    state = context.call_context.state if context.call_context else None
    if state is not None and state.get(OWNER_STATE, "anonymous") == "anonymous":
        state[OWNER_STATE] = wallet_owner(payer)


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
