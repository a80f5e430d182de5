"""HTTP side of the browser leg: the softphone page and offer/answer signalling.

``GET /phone`` — the softphone (one static HTML file, no build step).
``GET /api/webrtc/config`` — the ICE servers the page should use (same list as the server).
``POST /api/webrtc/offer`` — ``{"sdp", "type": "offer"}`` → ``{"sdp", "type": "answer",
"call_id"}``. The answer carries all our candidates (aiortc gathers before answering), so no
trickle endpoint is needed; the page waits for its own gathering to finish before posting.

The ``/api/`` routes sit behind the control API's middleware: the bearer token when one is
configured, loopback Host/Origin otherwise. Refusals: 400 with the reason for a bad offer, 503
over ``gateway.max_calls`` (shared with SIP calls), 404 when the leg is disabled.
"""

from __future__ import annotations

import contextlib
import logging
from importlib import resources

from aiohttp import web

from gateway.api.routes import HttpError, json_object
from gateway.call.control import BadRequest
from gateway.call.manager import CallManager
from gateway.legs.webrtc.leg import WebRtcLeg
from gateway.legs.webrtc.offer import OfferError, check_offer
from voxgate.contract.config import WebrtcConfig

log = logging.getLogger("voxgate.webrtc")


def phone_page() -> bytes:
    return resources.files("gateway.static").joinpath("phone.html").read_bytes()


class WebRtcService:
    def __init__(self, manager: CallManager, cfg: WebrtcConfig, *, rate: int = 48000) -> None:
        self.manager = manager
        self.cfg = cfg
        self.rate = rate
        self.legs: set[WebRtcLeg] = set()
        self._page = phone_page()

    def routes(self) -> list[web.RouteDef]:
        if not self.cfg.enabled:
            return []
        return [
            web.get("/phone", self.phone, allow_head=False),
            web.get("/api/webrtc/config", self.config, allow_head=False),
            web.post("/api/webrtc/offer", self.offer),
        ]

    async def phone(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self._page,
            content_type="text/html",
            charset="utf-8",
            headers={
                "Cache-Control": "no-cache",
                # The page talks only to this origin; nothing else may frame or script it.
                "Content-Security-Policy": (
                    "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                    "connect-src 'self' ws: wss:; media-src 'self' blob: mediastream:; "
                    "frame-ancestors 'none'"
                ),
                "X-Content-Type-Options": "nosniff",
            },
        )

    async def config(self, request: web.Request) -> web.Response:
        servers: list[dict[str, object]] = []
        for url in self.cfg.ice_urls():
            entry: dict[str, object] = {"urls": url}
            if url.startswith("turn") and self.cfg.ice_username:
                entry.update(username=self.cfg.ice_username, credential=self.cfg.ice_credential)
            servers.append(entry)
        return web.json_response({"iceServers": servers, "rate": self.rate})

    async def offer(self, request: web.Request) -> web.Response:
        try:
            body = await json_object(request)
            checked = check_offer(body)
        except (BadRequest, OfferError) as exc:
            raise HttpError(400, "bad_offer", str(exc)) from None
        peer = request.remote or "unknown"
        call = self.manager.new_call(
            "webrtc", "inbound", f"browser:{peer}", "webrtc", rate=self.rate, profile="wideband"
        )  # 503 (Unavailable) at the call limit
        leg = WebRtcLeg(call, self.cfg, codec=checked.codec, sends_audio=checked.sends_audio)
        call.leg = leg
        try:
            answer = await leg.accept(checked.sdp)
        except Exception as exc:  # aiortc's own refusal of what passed our checks
            await leg.hangup("bad offer")
            log.info("webrtc offer refused by aiortc: %s", exc)
            raise HttpError(400, "bad_offer", f"the offer could not be applied: {exc}") from None
        self.legs.add(leg)
        leg.on_close = self.legs.discard
        return web.json_response({"type": "answer", "sdp": answer, "call_id": call.id})

    async def close(self) -> None:
        """Gateway shutdown: hang up every browser call."""
        legs, self.legs = list(self.legs), set()
        for leg in legs:
            with contextlib.suppress(Exception):
                await leg.hangup("shutdown")
