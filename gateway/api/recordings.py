"""Control-API routes of call recordings, over ``RecordingControl`` (``CallManager``).

``GET /api/calls/{id}/recordings`` — ``{"recordings": [...]}``: each with ``id``, ``name``
(under ``[recording] dir``), ``path``, ``channels``, ``rate``, ``state`` (starting |
recording | stopped | failed), ``started_at``, ``ended_at``, ``duration_s``, ``bytes``,
``frames_dropped``, ``error``/``code``. Live calls and calls that ended recently.
``GET /api/calls/{id}/recordings/{rid}`` — the WAV (``audio/wav``; while still recording,
what is written so far, its header up to date within a couple of seconds).
``POST /api/calls/{id}/recordings`` ``{"channels": "both"|"caller"}`` (``{}``: both) — start
recording: 201 with the recording, ``Location`` its download.
``DELETE /api/calls/{id}/recordings`` or ``POST /api/calls/{id}/recordings/stop`` — stop
recording: 204 (409 when nothing is being recorded); the file is finalised in the background
(``recording`` event ``stopped`` on ``/api/events``).

They sit under ``/api/``: the control API's middleware asks for the bearer token when one is
configured (loopback Host/Origin otherwise), and errors have its JSON shape.
"""

from __future__ import annotations

import asyncio
import os

from aiohttp import web

from gateway.api.routes import json_object
from gateway.call.control import BadRequest, RecordingControl, UnknownRecording

WAV_TYPE = "audio/wav"


class RecordingRoutes:
    def __init__(self, control: RecordingControl) -> None:
        self.control = control

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/calls/{id}/recordings", self.list, allow_head=False),
            web.post("/api/calls/{id}/recordings", self.start),
            web.delete("/api/calls/{id}/recordings", self.stop),
            web.post("/api/calls/{id}/recordings/stop", self.stop),
            web.get("/api/calls/{id}/recordings/{rid}", self.download, allow_head=False),
        ]

    async def list(self, request: web.Request) -> web.Response:
        recordings = self.control.list_recordings(request.match_info["id"])
        return web.json_response({"recordings": recordings})

    async def start(self, request: web.Request) -> web.Response:
        call_id = request.match_info["id"]
        body = await json_object(request)
        unknown = sorted(set(body) - {"channels"})
        if unknown:
            raise BadRequest(f"unknown field {unknown[0]!r}")
        channels = body.get("channels", "both")
        if not isinstance(channels, str):
            raise BadRequest("field 'channels' must be a string: both or caller")
        recording = self.control.start_recording(call_id, channels)
        location = f"/api/calls/{call_id}/recordings/{recording['id']}"
        return web.json_response(recording, status=201, headers={"Location": location})

    async def stop(self, request: web.Request) -> web.Response:
        self.control.stop_recording(request.match_info["id"])
        return web.Response(status=204)

    async def download(self, request: web.Request) -> web.StreamResponse:
        call_id, rid = request.match_info["id"], request.match_info["rid"]
        path = self.control.recording_file(call_id, rid)
        # The disk is looked at off the event loop (the media ticker runs on it).
        if not await asyncio.to_thread(os.path.isfile, path):
            raise UnknownRecording(f"the file of recording {rid} is gone (retention?)")
        name = os.path.basename(path)
        return web.FileResponse(
            path,
            headers={
                "Content-Type": WAV_TYPE,
                "Content-Disposition": f'attachment; filename="{name}"',
                "Cache-Control": "no-store",
            },
        )


def recording_routes(control: RecordingControl) -> list[web.RouteDef]:
    """The routes, for ``make_app(..., extra_routes=...)``."""
    return RecordingRoutes(control).routes()
