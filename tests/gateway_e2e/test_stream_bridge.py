"""An unmodified pipecat bot written for Twilio takes real SIP calls through the ``stream``
agent: the bot runs as its own process (``tests/gateway_e2e/stream_bot.py``: FastAPI +
``FastAPIWebsocketTransport`` + ``TwilioFrameSerializer`` + Silero VAD + Piper), the caller is
the project's SIP UAC against an in-process gateway with ``agent.kind = stream``.

Checked from the caller's side: the bot's greeting is heard; a key press reaches the bot as an
``InputDTMFFrame`` and its answer is heard; talking over the bot makes pipecat send ``clear``
and the caller hears silence; the bot ending the call (socket closed, or Twilio's REST hang-up
with ``auto_hang_up`` and ``base_url`` at voxgate) sends BYE; the caller's BYE ends the bot."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator

import numpy as np
import numpy.typing as npt
import pytest

from gateway.agents.stream import StreamAgent
from gateway.call.calls import Call
from synth.engines.base import Engine
from tests.gateway_e2e.bot_process import BotProcess, free_tcp_port, run_bot
from tests.gateway_e2e.test_bargein import caller_speech
from voxgate.bench.localgw import LocalGateway, local_gateway
from voxgate.bench.sipclient import ClientCall, RtpPeer, SipClient, rms

pytestmark = pytest.mark.slow

TOKEN = "bridge-test-token"
SILENT_RMS = 30.0


@pytest.fixture(scope="module")
def rest_port() -> int:
    """The HTTP port of the gateway the bot's REST hang-up goes to (the bot is told at start)."""
    return free_tcp_port()


@pytest.fixture(scope="module")
def bot(tmp_path_factory: pytest.TempPathFactory, rest_port: int) -> Iterator[BotProcess]:
    work = tmp_path_factory.mktemp("stream-bot")
    with run_bot(work, base_url=f"http://127.0.0.1:{rest_port}", auth_token=TOKEN) as bot:
        yield bot


@contextlib.asynccontextmanager
async def gateway(engine: Engine, **overrides: object) -> AsyncIterator[LocalGateway]:
    async with local_gateway(engine, name="bridge", overrides={"agent.kind": "stream",
                                                                **overrides}) as gw:  # fmt: skip
        yield gw


async def dial(local: LocalGateway) -> tuple[SipClient, ClientCall, RtpPeer, Call, StreamAgent]:
    client = await SipClient.open("127.0.0.1")
    call = await client.invite(local.sip, codecs=("PCMU",))
    assert call.status == 200 and call.media is not None
    (gw_call,) = local.gw.manager.calls.values()
    for _ in range(200):  # the agent starts once the ACK is in
        if gw_call.agent is not None:
            break
        await asyncio.sleep(0.01)
    agent = gw_call.agent
    assert isinstance(agent, StreamAgent)
    return client, call, call.media, gw_call, agent


def loud_speech(engine: Engine) -> npt.NDArray[np.int16]:
    pcm = caller_speech(engine, "Hello? Hello, sorry to interrupt, I have a question on my bill.")
    return np.clip(pcm.astype(np.float64) * 1.5, -32768, 32767).astype(np.int16)


async def test_a_pipecat_bot_greets_hears_keys_is_interrupted_and_hangs_up(
    bot: BotProcess, engine: Engine
) -> None:
    speech = loud_speech(engine)
    url = f"ws://127.0.0.1:{bot.port}/ws"
    async with gateway(engine, **{"stream.url": url}) as local:
        client, call, media, gw_call, agent = await dial(local)
        try:
            # The greeting (the bot builds its pipeline per call: a few seconds).
            await media.wait_for_audio(timeout=30)
            start = await bot.wait_for("start")
            assert start["body"] == {"from_number": "testclient", "to_number": "ivr"}
            assert start["call_id"].startswith("CA") and start["stream_id"].startswith("MZ")
            await media.wait_for_quiet(quiet_s=0.6, timeout=20)
            # A key: pipecat gets an InputDTMFFrame, and its answer is heard.
            t_key = time.time()
            await media.send_dtmf("5", duration_ms=120)
            assert (await bot.wait_for("InputDTMFFrame"))["digit"] == "5"
            await media.wait_for_audio(after=t_key, timeout=15)
            # Talking over the answer: pipecat's VAD interrupts it, its serializer sends
            # "clear", voxgate fades the queue out; the caller hears silence.
            await asyncio.sleep(1.0)
            assert gw_call.info.speaking
            media.send_audio(speech)
            deadline = time.monotonic() + 10
            while agent.stats.clears == 0:
                assert time.monotonic() < deadline, "pipecat sent no clear"
                await asyncio.sleep(0.005)
            t_clear = time.time()
            await bot.wait_for("InterruptionFrame")
            await asyncio.sleep(1.2)
            _, after = media.frames(since=t_clear + 0.1)
            assert len(after) >= 40 and max(rms(p) for p in after) < SILENT_RMS
            assert agent.stats.media_dropped == 0 and agent.error is None
            # The bot ends the call: goodbye, EndFrame, its socket closes, voxgate says BYE.
            await media.wait_for_quiet(quiet_s=0.5, timeout=20)
            t_bye_key = time.time()
            await media.send_dtmf("0", duration_ms=120)
            await media.wait_for_audio(after=t_bye_key, timeout=15)  # "Goodbye."
            await asyncio.wait_for(call.remote_bye.wait(), 20)
            assert gw_call.info.end_reason == "stream closed" and agent.closed_by == "bot"
        finally:
            client.close()


async def test_the_callers_bye_stops_the_bot(bot: BotProcess, engine: Engine) -> None:
    url = f"ws://127.0.0.1:{bot.port}/ws"
    async with gateway(engine, **{"stream.url": url}) as local:
        before = len(bot.events("disconnected"))
        client, call, media, gw_call, agent = await dial(local)
        try:
            await media.wait_for_audio(timeout=30)
            assert await call.bye() == 200
            await bot.wait_for("disconnected", count=before + 1, timeout=10)
            assert gw_call.info.state == "ended" and agent.closed_by == "call"
        finally:
            client.close()


async def test_the_bot_hangs_up_through_the_twilio_rest_api(
    bot: BotProcess, engine: Engine, rest_port: int
) -> None:
    url = f"ws://127.0.0.1:{bot.port}/ws-rest"
    async with gateway(
        engine, **{"stream.url": url, "gateway.http_listen": f"127.0.0.1:{rest_port}",
                   "gateway.api_token": TOKEN}
    ) as local:  # fmt: skip
        client, call, media, gw_call, _ = await dial(local)
        try:
            await media.wait_for_audio(timeout=30)
            assert (await bot.wait_for("start", count=len(bot.events("start"))))["rest"]
            await media.wait_for_quiet(quiet_s=0.5, timeout=20)
            await media.send_dtmf("0", duration_ms=120)
            await asyncio.wait_for(call.remote_bye.wait(), 20)
            # pipecat's serializer POSTed Status=completed with the token as its auth token.
            assert gw_call.info.end_reason == "api"
        finally:
            client.close()
