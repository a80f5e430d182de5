"""The softphone page in a real browser: Debian's Chromium, headless, with a fake microphone
playing a WAV file, driven over the DevTools protocol against a live gateway."""

from __future__ import annotations

import time
import wave
from pathlib import Path

import numpy as np
import pytest

from dsp.wideband import wideband
from gateway.call.control import DtmfReceived, UtteranceStarted
from synth.engines import load_engine
from synth.engines.base import Engine
from tests.browser.cdp import chromium, chromium_path
from tests.waiting import wait_for
from voxgate.bench.localgw import local_gateway

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(chromium_path() is None, reason="chromium not installed (make test does)"),
]

RATE = 48000
# The microphone: silence, then the caller talks while the greeting is still playing, then
# silence (Chromium loops the file).
SPEECH_AT_S = 4.0
FILE_S = 14.0


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load_engine("onnx")


@pytest.fixture(scope="module")
def mic_wav(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The caller's voice: the agent's model declared at 26 kHz (1.18 × higher), -20 dBFS.
    voice = np.asarray(
        wideband(engine.synthesize("Excuse me, I need to talk to a person please."), 26000, RATE),
        np.float64,
    )
    voice *= 10 ** (-20 / 20) / float(np.sqrt(np.mean(voice[np.abs(voice) > 1e-3] ** 2)))
    pcm = np.zeros(int(FILE_S * RATE), np.float64)
    at = int(SPEECH_AT_S * RATE)
    pcm[at : at + len(voice)] = voice[: len(pcm) - at]
    path = tmp_path_factory.mktemp("mic") / "caller.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(np.clip(pcm * 32767, -32768, 32767).astype("<i2").tobytes())
    return path


async def test_softphone_call_in_chromium(engine: Engine, mic_wav: Path) -> None:
    async with (
        local_gateway(engine, name="browser") as lg,
        chromium(fake_audio=mic_wav) as browser,
        browser.page(f"{lg.http}/phone") as page,
    ):
        await page.wait("document.readyState === 'complete'")
        assert await page.eval("document.getElementById('status').textContent") == "idle"
        await page.eval("document.getElementById('call').click()")
        call_id = await page.wait("window.voxphone.callId", timeout=20)
        call = lg.gw.manager.calls[call_id]
        assert call.info.leg == "webrtc"
        # The agent's greeting arrives: audible energy in the browser, and the page's figures.
        await page.wait("window.voxphone.maxRxRms > 0.02", timeout=15)
        ttfa = await page.eval("window.voxphone.ttfaMs")
        assert 0 < ttfa < 5000
        assert await page.eval("document.getElementById('status').textContent") == "in call"
        await page.wait("window.voxphone.stats.rttMs !== undefined", timeout=5)
        assert "opus" in (await page.eval("document.getElementById('codec').textContent")).lower()

        # Speaking over the agent (the fake microphone's sentence) triggers barge-in.
        await wait_for(lambda: bool(call.bargeins), timeout=15)
        record = call.bargeins[0]
        assert record.zero_ms - record.decision_ms <= 20.0
        await page.wait("window.voxphone.events.some(e => e.type === 'bargein')", timeout=5)

        # A keypad press reaches the agent as DTMF and the IVR answers it.
        await page.eval("document.querySelector('[data-key=\"1\"]').click()")
        await wait_for(lambda: any(isinstance(e, DtmfReceived) for e in call.history), 5)
        dtmf = next(e for e in call.history if isinstance(e, DtmfReceived))
        assert (dtmf.digit, dtmf.source) == ("1", "datachannel")
        menu1 = lg.cfg.ivr.menu["1"]
        await wait_for(
            lambda: any(isinstance(e, UtteranceStarted) and e.text == menu1 for e in call.history),
            5,
        )
        assert await page.eval("document.getElementById('digits').value") == "1"

        # Hang-up ends the call on the server.
        await page.eval("document.getElementById('hangup').click()")
        await wait_for(lambda: call_id not in lg.gw.manager.calls, timeout=5)
        assert call.info.end_reason == "remote hangup"
        assert await page.eval("document.getElementById('status').textContent") == "idle"


async def test_killed_browser_is_cleaned_up(engine: Engine, mic_wav: Path) -> None:
    overrides = {"webrtc.media_timeout_s": 2.0}
    async with local_gateway(engine, name="browser", overrides=overrides) as lg:
        async with (
            chromium(fake_audio=mic_wav) as browser,
            browser.page(f"{lg.http}/phone") as page,
        ):
            await page.wait("document.readyState === 'complete'")
            await page.eval("document.getElementById('call').click()")
            call_id = await page.wait("window.voxphone.callId", timeout=20)
            await page.wait("window.voxphone.maxRxRms > 0.02", timeout=15)
            call = lg.gw.manager.calls[call_id]
            browser.kill()  # no hang-up message, no DTLS close: the browser is just gone
            t0 = time.monotonic()
        await wait_for(lambda: call_id not in lg.gw.manager.calls, timeout=8)
        assert time.monotonic() - t0 < 5.0
        assert call.info.end_reason in ("media timeout", "connection failed", "connection closed")


async def test_softphone_asks_for_the_token(engine: Engine, mic_wav: Path) -> None:
    # With gateway.api_token set the page's API calls need it: the first try shows the token
    # field; with the token typed in, the call goes through.
    overrides = {"gateway.api_token": "phone-secret"}
    async with (
        local_gateway(engine, name="browser", overrides=overrides) as lg,
        chromium(fake_audio=mic_wav) as browser,
        browser.page(f"{lg.http}/phone") as page,
    ):
        assert await page.eval("document.getElementById('token-row').hidden") is True
        await page.eval("document.getElementById('call').click()")
        await page.wait("window.voxphone.status === 'failed'", timeout=10)
        assert "token" in await page.eval("window.voxphone.error")
        assert await page.eval("document.getElementById('token-row').hidden") is False
        assert lg.gw.manager.list_calls() == []
        await page.eval("document.getElementById('token').value = 'phone-secret'")
        await page.eval("document.getElementById('call').click()")
        call_id = await page.wait("window.voxphone.callId", timeout=20)
        await page.wait("window.voxphone.maxRxRms > 0.02", timeout=15)
        assert lg.gw.manager.calls[call_id].info.leg == "webrtc"
        await page.eval("document.getElementById('hangup').click()")
        await wait_for(lambda: call_id not in lg.gw.manager.calls, timeout=5)
