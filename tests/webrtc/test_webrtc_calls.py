"""Browser calls end to end over real WebRTC (ICE, DTLS-SRTP, SCTP, Opus) on this machine:
an aiortc client — what the softphone page does, in Python — against a live gateway."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from dsp.wideband import wideband
from gateway.call.control import BargeIn, DtmfReceived, UtteranceFinished, UtteranceStarted
from synth.engines.base import Engine
from tests.waiting import wait_for
from voxgate.bench.localgw import local_gateway
from voxgate.bench.webrtc_client import WebRtcClient

pytestmark = pytest.mark.slow


def caller_speech(engine: Engine, text: str, dbfs: float = -20.0) -> np.ndarray:
    # A different voice from the agent's: the same model's samples declared at 26 kHz (1.18 ×
    # higher), at 48 kHz as a browser microphone delivers it.
    x = np.asarray(wideband(engine.synthesize(text), 26000, 48000), np.float64)
    rms = float(np.sqrt(np.mean(x[np.abs(x) > 1e-3] ** 2)))
    return np.clip(x * (10 ** (dbfs / 20) / rms) * 32768, -32768, 32767).astype(np.int16)


async def test_greeting_keypad_and_hangup(engine: Engine) -> None:
    async with local_gateway(engine, name="webrtc") as lg:
        client = WebRtcClient(lg.http)
        call_id = await client.connect()
        first = await client.wait_audio(timeout=10)
        assert first < 5.0
        call = lg.gw.manager.calls[call_id]
        assert call.info.leg == "webrtc" and call.info.state == "answered"
        assert call.info.codec == "opus/48000/2" and call.rate == 48000
        await asyncio.sleep(1.0)
        # The greeting is speech at a normal level (about -20 dBFS), not a trickle.
        assert client.heard.rms_since(client.heard.first_audio_at or 0) > 1000
        hello = await client.wait_message("hello")
        assert hello["call_id"] == call_id

        client.press("1")
        await wait_for(lambda: any(isinstance(e, DtmfReceived) for e in call.history))
        dtmf = next(e for e in call.history if isinstance(e, DtmfReceived))
        assert (dtmf.digit, dtmf.source) == ("1", "datachannel")
        # The IVR acts on it: the "1" prompt starts (and the page hears of it).
        menu1 = lg.cfg.ivr.menu["1"]
        await client.wait_message("utterance.started", text=menu1)
        # A key that is not a DTMF key is refused on the channel, the call goes on.
        client.send({"type": "dtmf", "digit": "x"})
        err = await client.wait_message("error")
        assert "not a DTMF key" in err["message"]

        await client.hangup()
        await wait_for(lambda: call_id not in lg.gw.manager.calls, timeout=3)
        assert (call.info.state, call.info.end_reason) == ("ended", "remote hangup")


async def test_g711_only_browser_gets_pcmu(engine: Engine) -> None:
    # A client that offers only PCMU: the fallback path (aiortc encodes frames) still speaks.
    async with local_gateway(engine, name="webrtc") as lg:
        client = WebRtcClient(lg.http, codec="PCMU")
        call_id = await client.connect()
        await client.wait_audio()
        assert lg.gw.manager.calls[call_id].info.codec == "PCMU/8000"
        await asyncio.sleep(1.0)
        assert client.heard.rms_since(client.heard.first_audio_at or 0) > 1000
        await client.hangup()


async def test_hostile_data_channel_messages_do_not_hurt_the_call(engine: Engine) -> None:
    async with local_gateway(engine, name="webrtc") as lg:
        client = WebRtcClient(lg.http)
        other = WebRtcClient(lg.http)
        call_id = await client.connect()
        other_id = await other.connect()
        await client.wait_audio()
        client.send_raw(b"\x00\xff binary")
        client.send({"type": "dtmf", "digit": "1" * 10})
        client.send_raw("x" * 10_000)
        client.send_raw("{not json")
        client.send({"type": "dtmf"})
        client.send({"type": "dtmf", "digit": "5", "duration_ms": "long"})
        for _ in range(500):
            client.send({"type": "ping", "t": 1})
        await wait_for(
            lambda: sum(m.get("type") == "pong" for m in client.messages) == 500, timeout=10
        )
        errors = [m for m in client.messages if m.get("type") == "error"]
        assert len(errors) == 5, errors
        call = lg.gw.manager.calls[call_id]
        # The odd duration was clamped to the default, the digit itself reached the agent.
        await wait_for(lambda: any(isinstance(e, DtmfReceived) for e in call.history), 5)
        digits = [e for e in call.history if isinstance(e, DtmfReceived)]
        assert [(d.digit, d.duration_ms) for d in digits] == [("5", 100)]
        # Both calls are still up and the other one never noticed.
        assert call.info.state == "answered"
        assert lg.gw.manager.calls[other_id].info.state == "answered"
        assert not any(m.get("type") == "error" for m in other.messages)
        await client.hangup()
        await other.hangup()


async def test_control_api_drives_browser_calls(engine: Engine) -> None:
    async with local_gateway(engine, name="webrtc") as lg, aiohttp.ClientSession() as http:
        client = WebRtcClient(lg.http)
        call_id = await client.connect()
        async with http.get(f"{lg.http}/api/calls") as r:
            listed = await r.json()
        assert any(c["id"] == call_id and c["leg"] == "webrtc" for c in listed["calls"])
        async with http.post(
            f"{lg.http}/api/calls/{call_id}/say",
            json={"text": "This is the control API speaking.", "interrupt": True},
        ) as r:
            assert r.status == 202, await r.text()
        await client.wait_message("utterance.started", text="This is the control API speaking.")
        async with http.post(f"{lg.http}/api/calls/{call_id}/dtmf", json={"digits": "42"}) as r:
            assert r.status == 202, await r.text()
        sent = await client.wait_message("dtmf", direction="outbound")
        assert sent["digits"] == "42"
        async with http.delete(f"{lg.http}/api/calls/{call_id}") as r:
            assert r.status in (200, 202, 204), await r.text()
        await client.wait_message("call.state", state="ended")
        await wait_for(lambda: call_id not in lg.gw.manager.calls, timeout=3)
        await client.close()


async def test_caller_speech_stops_the_agent(engine: Engine) -> None:
    speech = caller_speech(engine, "Excuse me, I need to speak to someone about my bill.")
    async with local_gateway(engine, name="webrtc") as lg:
        client = WebRtcClient(lg.http)
        call_id = await client.connect()
        await client.wait_audio()
        call = lg.gw.manager.calls[call_id]
        await asyncio.sleep(1.5)  # well into the greeting
        assert call.info.speaking
        greeting_rms = client.heard.rms_since(time.monotonic() - 1.0)
        client.mic.play(speech)
        await wait_for(lambda: bool(call.bargeins), timeout=3)
        record = call.bargeins[0]
        assert isinstance(record, BargeIn)
        # On the media clock: decision → zero within 20 ms (the frame in flight + the fade).
        assert record.zero_ms - record.decision_ms <= 20.0
        assert 0 <= record.decision_ms - record.onset_ms < 400
        msg = await client.wait_message("bargein")
        assert msg["utterance_id"] == record.utterance_id
        # What the browser hears after the fade (plus the network path) is silence while the
        # caller goes on talking.
        await asyncio.sleep(0.3)
        t = time.monotonic()
        await asyncio.sleep(0.8)
        after = client.heard.rms_since(t)
        assert after < greeting_rms / 30, (after, greeting_rms)
        finished = [
            e
            for e in call.history
            if isinstance(e, UtteranceFinished) and e.outcome == "interrupted"
        ]
        assert finished and finished[0].heard  # which words the caller heard
        assert not any(
            isinstance(e, UtteranceStarted) and e.ts > msg["ts"] for e in call.history
        ), "nothing new may start while the caller talks"
        await client.hangup()


async def test_vanished_browser_is_cleaned_up(engine: Engine) -> None:
    async with local_gateway(
        engine, name="webrtc", overrides={"webrtc.media_timeout_s": 1.5}
    ) as lg:
        client = WebRtcClient(lg.http)
        call_id = await client.connect()
        await client.wait_audio()
        call = lg.gw.manager.calls[call_id]
        assert call.info.speaking
        client.mic.mute()  # the tab froze or the network went: no more packets, no BYE
        t0 = time.monotonic()
        await wait_for(lambda: call_id not in lg.gw.manager.calls, timeout=6)
        assert time.monotonic() - t0 < 4.0
        assert call.info.end_reason == "media timeout"
        # The utterance playing was cancelled on the worker.
        assert any(
            getattr(e, "outcome", None) in ("interrupted", "cancelled") for e in call.history
        )
        await client.close()


async def test_bad_offers_get_400_with_a_reason(engine: Engine) -> None:
    async with local_gateway(engine, name="webrtc") as lg, aiohttp.ClientSession() as http:
        url = f"{lg.http}/api/webrtc/offer"
        cases = [
            ({"sdp": "garbage", "type": "offer"}, "malformed SDP"),
            ({"sdp": "v=0", "type": "answer"}, '"offer"'),
            ({"type": "offer"}, "'sdp'"),
        ]
        for body, reason in cases:
            async with http.post(url, json=body) as r:
                assert r.status == 400
                err = (await r.json())["error"]
                assert err["code"] == "bad_offer" and reason in err["message"], err
        async with http.post(
            url, data=b"{not json", headers={"Content-Type": "application/json"}
        ) as r:
            assert r.status == 400
        # A real offer without audio (data channel only).
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.createDataChannel("control")
        await pc.setLocalDescription(await pc.createOffer())
        async with http.post(url, json={"sdp": pc.localDescription.sdp, "type": "offer"}) as r:
            assert r.status == 400
            assert "no audio" in (await r.json())["error"]["message"]
        await pc.close()
        assert lg.gw.manager.list_calls() == []  # nothing half-made left behind


async def test_token_call_limit_and_ice_config(engine: Engine) -> None:
    overrides = {
        "gateway.api_token": "s3cret",
        "gateway.max_calls": 1,
        "webrtc.ice_servers": "stun:stun.example.net:3478",
    }
    async with local_gateway(engine, name="webrtc", overrides=overrides) as lg:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{lg.http}/api/webrtc/config") as r:
                assert r.status == 401
            auth = {"Authorization": "Bearer s3cret"}
            async with http.get(f"{lg.http}/api/webrtc/config", headers=auth) as r:
                assert (await r.json())["iceServers"] == [{"urls": "stun:stun.example.net:3478"}]
        anonymous = WebRtcClient(lg.http)
        with pytest.raises(RuntimeError, match="401"):
            await anonymous.connect()
        await anonymous.close()
        first = WebRtcClient(lg.http, token="s3cret")
        await first.connect()
        second = WebRtcClient(lg.http, token="s3cret")
        with pytest.raises(RuntimeError, match="503"):
            await second.connect()
        await second.close()
        await first.hangup()


async def test_phone_page_is_served(engine: Engine) -> None:
    async with local_gateway(engine, name="webrtc") as lg, aiohttp.ClientSession() as http:
        async with http.get(f"{lg.http}/phone") as r:
            assert r.status == 200
            assert r.content_type == "text/html"
            assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
            page = await r.text()
        for needle in (
            'id="call"',
            'id="hangup"',
            'id="keypad"',
            "/api/webrtc/offer",
            'role="status"',
        ):
            assert needle in page
    off = {"webrtc.enabled": False}
    async with (
        local_gateway(engine, name="webrtc", overrides=off) as lg,
        aiohttp.ClientSession() as http,
        http.get(f"{lg.http}/phone") as r,
    ):
        assert r.status == 404
