"""The operator's API for the controls (payments/controls.py): skill switches and the payer deny
list. Changes are written to the database (every replica follows within
PAYWIRE_CONTROLS_REFRESH_SECONDS; this one at once).

    GET    /skills/disabled           the skills switched off
    PUT    /skills/{skill_id}         {"enabled": false, "reason": "upstream outage"} / {"enabled": true}
    GET    /payers/denied             the denied payers
    PUT    /payers/denied/{payer}     {"reason": "chargeback abuse"} (body optional)
    DELETE /payers/denied/{payer}     allowed again

`control_routes` gives the routes; agent/operator/admin.py mounts them under /admin behind the operator's
token (PAYWIRE_ADMIN_TOKEN), beside the accounting API.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from agent.edge.http_io import HttpProblem, client_address, read_json_object
from agent.pipeline.catalogue import Catalogue
from payments.controls import ControlError, Controls, checked_reason, normalize_payer

MAX_BODY_BYTES = 4096  # {"enabled": ..., "reason": <at most 500 characters>} fits many times over


def control_routes(controls: Controls, catalogue: Catalogue) -> list[BaseRoute]:
    async def disabled_skills(request: Request) -> Response:
        return JSONResponse({"disabled": [s.as_json() for s in await controls.disabled_skills()]})

    async def switch_skill(request: Request) -> Response:
        skill_id = request.path_params["skill_id"]
        if catalogue.get(skill_id) is None:
            raise HttpProblem(404, "unknown_skill", f"no skill named '{skill_id[:200]}'; GET "
                              "/api/marketplace/apis and /v1/models list them", "skill_id")
        body = await _body(request, {"enabled", "reason"})
        enabled = body.get("enabled")
        if not isinstance(enabled, bool):
            raise HttpProblem(400, "invalid_body", "'enabled' is required: true (switch the skill "
                              "on) or false (switch it off)", "enabled")
        switch = await _control(controls.set_skill(
            skill_id, enabled=enabled, reason=_reason(body), changed_by=_who(request)))
        if switch is None:
            return JSONResponse({"skill_id": skill_id, "enabled": True})
        return JSONResponse(switch.as_json())

    async def denied_payers(request: Request) -> Response:
        return JSONResponse({"denied": [p.as_json() for p in await controls.denied_payers()]})

    async def deny_payer(request: Request) -> Response:
        body = await _body(request, {"reason"})
        denied = await _control(controls.deny_payer(request.path_params["payer"], reason=_reason(body)))
        return JSONResponse({**denied.as_json(), "denied": True})

    async def allow_payer(request: Request) -> Response:
        try:
            payer = normalize_payer(request.path_params["payer"])
        except ControlError as exc:
            raise HttpProblem(400, "invalid_payer", exc.message, exc.field) from None
        was = await controls.allow_payer(payer)
        return JSONResponse({"payer": payer, "denied": False, "was_denied": was})

    return [
        Route("/skills/disabled", disabled_skills, methods=["GET"]),
        Route("/skills/{skill_id:path}", switch_skill, methods=["PUT"]),
        Route("/payers/denied", denied_payers, methods=["GET"]),
        Route("/payers/denied/{payer}", deny_payer, methods=["PUT"]),
        Route("/payers/denied/{payer}", allow_payer, methods=["DELETE"]),
    ]


async def _body(request: Request, allowed: set[str]) -> dict[str, Any]:
    body = await read_json_object(request, MAX_BODY_BYTES)
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise HttpProblem(400, "invalid_body", f"unknown field(s) {', '.join(map(repr, unknown))}; "
                          f"accepted: {', '.join(sorted(allowed))}", unknown[0])
    return body


def _reason(body: dict[str, Any]) -> str | None:
    try:
        return checked_reason(body.get("reason"))
    except ControlError as exc:
        raise HttpProblem(400, "invalid_body", exc.message, exc.field) from None


async def _control(change: Any) -> Any:
    try:
        return await change
    except ControlError as exc:
        raise HttpProblem(400, f"invalid_{exc.field}", exc.message, exc.field) from None


def _who(request: Request) -> str:
    return f"operator API ({client_address(request) or 'in process'})"
