"""Control-API routes of outbound campaigns, over :class:`gateway.campaign.service.CampaignService`.

``POST /api/campaigns`` — body: the spec's fields (``agent``, ``cps``, ``max_concurrent``,
``window``, ``retries``, ``amd``, ``voicemail``, ``ring_timeout_s``), ``contacts`` (a list of
``{"to", "vars"}``) and an optional ``id``. 201 with the campaign (``Location`` its URL).
Refusals, nothing created:

- 400 ``{"error": {"code": "invalid_spec", "message"}, "field": "cps"}`` — a bad spec field
  (``agent`` when the gateway's agent registry refuses it, ``id``, ``contacts`` when missing);
- 400 ``{"error": {"code": "invalid_contacts", "message"}, "rows": [{"row", "reason"}]}`` —
  every bad contact (``row``: the list index; 0 with a whole-input reason);
- 409 ``conflict`` — the ``id`` exists; 413 ``body_too_large`` — over
  ``[campaign] max_request_bytes`` (its own limit: a campaign's contacts outgrow the API's
  default body size).

``GET /api/campaigns`` — ``{"campaigns": [...]}``, each with ``id``, ``spec``, ``state``,
``created_at`` and ``totals`` (``contacts``, ``pending``, ``in_flight``, ``attempts``,
``outcomes``: final outcome -> contacts).
``GET /api/campaigns/{id}`` — the same plus ``contacts``: each with ``index``, ``to``, ``vars``,
``attempts`` (``started_at``, ``ended_at``, ``outcome``, ``sip_status``, ``reason``,
``voicemail_left``), ``outcome`` (final; null while pending), ``next_attempt_at``,
``claimed_by``. ``?offset=N&limit=M`` pages the contacts; ``?limit=0`` leaves them out (a
progress poll of a large campaign).
``POST /api/campaigns/{id}/pause`` | ``/resume``, ``DELETE /api/campaigns/{id}`` (cancel: no
new calls; live ones finish) — 200 with the campaign; 404 ``unknown_campaign``; 409
``conflict`` for a move its state does not allow (a done or cancelled campaign).

They sit under ``/api/``: the control API's middleware asks for the bearer token when one is
configured (loopback Host/Origin otherwise), and errors have its JSON shape.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from gateway.api.routes import HttpError
from gateway.call.control import Conflict, ControlError
from gateway.campaign.service import (
    BadTransition,
    CampaignExists,
    CampaignService,
    ContactsError,
    SpecError,
    UnknownCampaign,
)


class UnknownCampaignError(ControlError):
    status = 404
    code = "unknown_campaign"


def _too_large(limit: int) -> HttpError:
    return HttpError(413, "body_too_large", f"a campaign request is limited to {limit} bytes")


class CampaignRoutes:
    def __init__(self, service: CampaignService) -> None:
        self.service = service

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/api/campaigns", self.create),
            web.get("/api/campaigns", self.list, allow_head=False),
            web.get("/api/campaigns/{id}", self.get, allow_head=False),
            web.delete("/api/campaigns/{id}", self.cancel),
            web.post("/api/campaigns/{id}/pause", self.pause),
            web.post("/api/campaigns/{id}/resume", self.resume),
        ]

    async def create(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        try:
            campaign = await self.service.create(body)
        except SpecError as exc:
            return _refused({"field": exc.field}, "invalid_spec", str(exc))
        except ContactsError as exc:
            rows = [e.to_json() for e in exc.errors]
            return _refused({"rows": rows}, "invalid_contacts", str(exc))
        except CampaignExists as exc:
            raise Conflict(str(exc)) from None
        location = f"/api/campaigns/{campaign['id']}"
        return web.json_response(campaign, status=201, headers={"Location": location})

    async def list(self, request: web.Request) -> web.Response:
        return web.json_response({"campaigns": await self.service.list()})

    async def get(self, request: web.Request) -> web.Response:
        offset = _query_int(request, "offset", 0) or 0
        limit = _query_int(request, "limit", None)
        try:
            body = await self.service.get(request.match_info["id"], offset=offset, limit=limit)
        except UnknownCampaign as exc:
            raise UnknownCampaignError(str(exc)) from None
        return web.json_response(body)

    async def pause(self, request: web.Request) -> web.Response:
        return await self._call(self.service.pause, request)

    async def resume(self, request: web.Request) -> web.Response:
        return await self._call(self.service.resume, request)

    async def cancel(self, request: web.Request) -> web.Response:
        return await self._call(self.service.cancel, request)

    async def _call(self, op: Any, request: web.Request) -> web.Response:
        try:
            return web.json_response(await op(request.match_info["id"]))
        except UnknownCampaign as exc:
            raise UnknownCampaignError(str(exc)) from None
        except BadTransition as exc:
            raise Conflict(str(exc)) from None

    async def _body(self, request: web.Request) -> dict[str, Any]:
        """The JSON object, read under the campaign limit (not the app's ``client_max_size``:
        reading ``request.content`` directly is bounded by us alone)."""
        ctype = request.content_type
        if ctype != "application/json" and not ctype.endswith("+json"):
            got = request.headers.get("Content-Type", "none")
            raise HttpError(
                415, "unsupported_media_type", f"expected Content-Type: application/json, got {got}"
            )
        limit = self.service.cfg.max_request_bytes
        if request.content_length is not None and request.content_length > limit:
            raise _too_large(limit)  # refused before reading a byte of it
        chunks: list[bytes] = []
        size = 0
        while chunk := await request.content.readany():
            size += len(chunk)
            if size > limit:  # chunked, or a Content-Length that lied
                raise _too_large(limit)
            chunks.append(chunk)
        raw = b"".join(chunks)
        if not raw.strip():
            raise _bad_request("request body is empty; expected a JSON object")
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # RecursionError: nesting too deep
            raise _bad_request(f"request body is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise _bad_request("request body must be a JSON object")
        return value


def _query_int(request: web.Request, name: str, default: int | None) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
        raise _bad_request(f"query parameter {name!r} must be a whole number >= 0, got {raw!r}")
    return int(raw)


def _bad_request(message: str) -> HttpError:
    return HttpError(400, "bad_request", message)


def _refused(extra: dict[str, Any], code: str, message: str) -> web.Response:
    """400 in the API's error shape, with what names the bad input beside it."""
    return web.json_response({"error": {"code": code, "message": message}, **extra}, status=400)


def campaign_routes(service: CampaignService) -> list[web.RouteDef]:
    """The routes, for ``make_app(..., extra_routes=...)``."""
    return CampaignRoutes(service).routes()
