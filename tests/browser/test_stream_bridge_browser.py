"""A browser call bridged to an unmodified pipecat bot: the softphone page in headless Chromium
(fake microphone playing a WAV file) calls a live gateway whose agent is ``kind = "stream"``,
pointed at the pipecat Twilio bot (``voxgate.bench.pipecat_bot``) in its own process, as
``tests/gateway_e2e/test_stream_bridge.py`` runs it for a SIP caller.

This is the wideband leg of the bridge: the call runs at 48 kHz Opus, so the bot's 8 kHz
μ-law is upsampled and paced onto the browser's 20 ms clock, and the browser's audio is
downsampled to 8 kHz μ-law for the bot. Checked from what the browser receives (recorded in
the page by an AudioWorklet on the remote track, 20 ms blocks on the AudioContext clock): the
greeting is heard and is not garbled (its energy lies in the telephone speech band, nothing
mirrored above 4 kHz, it lasts as long as the audio the bot sent, no long gaps); a keypad
press reaches the bot as ``InputDTMFFrame`` and its answer is heard; the caller talking over
the answer makes pipecat send ``clear`` and the browser goes silent; hanging up in the page
sends ``stop`` and the bot sees the disconnect. Printed (``-s``), not asserted: the caller's
speech onset → silence in the browser, and what the browser's jitter buffer concealed."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from dsp.wavio import write_wav_s16
from dsp.wideband import wideband
from gateway.agents.stream import StreamAgent
from gateway.legs.webrtc.leg import WebRtcLeg
from synth.engines import load_engine
from synth.engines.base import Engine
from tests.browser.cdp import Page, chromium, chromium_path
from tests.gateway_e2e.bot_process import BotProcess, run_bot
from tests.waiting import wait_for
from voxgate.bench.localgw import local_gateway

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(chromium_path() is None, reason="chromium not installed (make test does)"),
]

RATE = 48000
BLOCK = RATE // 50  # the recorder's 20 ms blocks
AUDIBLE_RMS = 0.02 * 32768  # the page's own "agent audio arrived" level
SILENT_RMS = 30.0  # about -60 dBFS: digital silence after Opus, no speech
# The caller's first syllable (-50 dBFS; the microphone's file has digital silence between
# sentences, and the muted track sends zeros).
SPEECH_ONSET_RMS = 100.0


# The recorders: an AudioWorklet per track (they run on the audio thread: a busy page loses
# nothing), posting 20 ms blocks with their first frame on one AudioContext's clock, for the
# test to fetch as base64 int16. Times in this test are frames of that clock, the browser's
# own: the agent's track as the caller hears it and the caller's microphone as sent line up on
# it, whatever the load on this machine does to wall-clock stamps.
RECORDERS_JS = r"""
(async () => {
  const code = `class Rec extends AudioWorkletProcessor {
    constructor() { super(); this.buf = new Float32Array(960); this.n = 0; }
    process(inputs) {
      const ch = inputs[0] && inputs[0][0];
      for (let i = 0; i < 128; i++) {
        this.buf[this.n++] = ch ? ch[i] : 0;
        if (this.n === 960) {
          this.port.postMessage({ pcm: this.buf, frame: currentFrame + i + 1 - 960 });
          this.buf = new Float32Array(960); this.n = 0;
        }
      }
      return true;
    }
  }
  registerProcessor("rec", Rec);`;
  const ctx = new AudioContext({ sampleRate: 48000 });
  const blob = new Blob([code], { type: "text/javascript" });
  await ctx.audioWorklet.addModule(URL.createObjectURL(blob));
  const record = (stream) => {
    const R = { blocks: [], frames: [] };
    const node = new AudioWorkletNode(ctx, "rec");
    node.port.onmessage = (e) => { R.blocks.push(e.data.pcm); R.frames.push(e.data.frame); };
    ctx.createMediaStreamSource(stream).connect(node);
    node.connect(ctx.destination);  // (it outputs silence; connected, it is pulled)
    R.take = (from) => {
      const blocks = R.blocks.slice(from);
      const pcm = new Int16Array(blocks.length * 960);
      blocks.forEach((b, j) => {
        for (let i = 0; i < 960; i++) {
          pcm[j * 960 + i] = Math.max(-32768, Math.min(32767, Math.round(b[i] * 32767)));
        }
      });
      const bytes = new Uint8Array(pcm.buffer);
      let bin = "";
      for (let i = 0; i < bytes.length; i += 0x8000) {
        bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
      }
      return { b64: btoa(bin), frames: R.frames.slice(from) };
    };
    return R;
  };
  window.rec = {
    ctx, agent: record(document.getElementById("remote").srcObject),
    mic: record(window.voxphone.mic),
  };
  await ctx.resume();
  return ctx.state;
})()
"""

# The microphone starts disabled (a disabled track sends silence): the caller talks only when
# the test enables it, over the bot's answer, rather than wherever Chromium's file loop is.
MUTED_MIC_JS = r"""
(() => {
  const md = navigator.mediaDevices, gum = md.getUserMedia.bind(md);
  md.getUserMedia = async (c) => {
    const s = await gum(c);
    s.getAudioTracks().forEach((t) => { t.enabled = false; });
    return s;
  };
})()
"""


async def without_csp(page: Page) -> None:
    """Reload the page with its Content-Security-Policy bypassed: the policy allows inline
    script only, and the recorder's worklet module comes from a blob: URL. (The page's own
    code is unchanged; CSP is applied when a document loads, hence the reload.)"""
    await page.send("Page.setBypassCSP", enabled=True)
    await page.eval("window.beforeReload = true")
    await page.send("Page.reload")
    await page.wait("!window.beforeReload && document.readyState === 'complete'")


class Ear:
    """One track as the page's recorder has it (``agent``: what the browser received;
    ``mic``: what the caller sent): int16 at 48 kHz in 20 ms blocks, each with its first frame
    on the page's AudioContext clock."""

    def __init__(self, page: Page, track: str) -> None:
        self.page = page
        self.track = track
        self._pcm: list[npt.NDArray[np.int16]] = []
        self._levels: list[npt.NDArray[np.float64]] = []
        self._frames: list[int] = []

    async def pull(self) -> None:
        """Fetch the new blocks. (Incremental: this runs on the gateway's event loop, and
        re-reading the whole recording each time would hold up its media ticks.)"""
        got = await self.page.eval(f"window.rec.{self.track}.take({len(self._frames)})")
        pcm = np.frombuffer(base64.b64decode(got["b64"]), "<i2")
        if pcm.size:
            blocks = pcm.astype(np.float64).reshape(-1, BLOCK)
            self._pcm.append(pcm)
            self._levels.append(np.sqrt(np.mean(blocks * blocks, axis=1)))
        self._frames += got["frames"]

    async def now(self) -> int:
        """The page's audio clock now, in frames."""
        return int(await self.page.eval("Math.round(window.rec.ctx.currentTime * 48000)"))

    @property
    def pcm(self) -> npt.NDArray[np.int16]:
        return np.concatenate(self._pcm) if self._pcm else np.zeros(0, np.int16)

    def levels(self) -> npt.NDArray[np.float64]:
        """The RMS of each block."""
        return np.concatenate(self._levels) if self._levels else np.zeros(0)

    def frames(self) -> npt.NDArray[np.int64]:
        """The first frame of each block."""
        return np.asarray(self._frames, np.int64)

    async def wait_for_audio(
        self, *, after: int = 0, level: float = AUDIBLE_RMS, timeout: float = 15.0
    ) -> int:
        """The first frame of the first block over ``level`` from frame ``after`` on."""
        deadline = time.monotonic() + timeout
        while True:
            await self.pull()
            hits = np.nonzero((self.levels() > level) & (self.frames() >= after))[0]
            if hits.size:
                return int(self.frames()[hits[0]])
            if time.monotonic() > deadline:
                raise TimeoutError("the browser heard nothing")
            await asyncio.sleep(0.1)

    async def wait_for_quiet(self, *, quiet_s: float, timeout: float = 20.0) -> int:
        """After audio: the frame where the last ``quiet_s`` of silence began."""
        n = int(quiet_s * 50)
        deadline = time.monotonic() + timeout
        while True:
            await self.pull()
            lv = self.levels()
            if len(lv) >= n and (lv[-n:] < SILENT_RMS).all() and (lv > AUDIBLE_RMS).any():
                return int(self.frames()[-n])
            if time.monotonic() > deadline:
                raise TimeoutError("the browser never went quiet")
            await asyncio.sleep(0.1)

    async def wait_until(self, frame: int, timeout: float = 10.0) -> None:
        """Until the recording reaches ``frame``."""
        deadline = time.monotonic() + timeout
        while True:
            await self.pull()
            if self._frames and self._frames[-1] + BLOCK >= frame:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("the recording stopped")
            await asyncio.sleep(0.1)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load_engine("onnx")


@pytest.fixture(scope="module")
def bot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BotProcess]:
    with run_bot(tmp_path_factory.mktemp("stream-bot")) as bot:
        yield bot


@pytest.fixture(scope="module")
def mic_wav(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The caller, talking without a break (Chromium loops the file): one unpunctuated
    sentence (no pauses), trimmed, repeated 50 ms apart, -14 dBFS; so the caller is talking
    whenever the test unmutes the microphone."""
    text = "I have a question about the bill that came in the mail this morning"
    voice = np.asarray(wideband(engine.synthesize(text), engine.sample_rate, RATE), np.float64)
    voiced = np.nonzero(np.abs(voice) > 1e-3)[0]
    voice = voice[voiced[0] : voiced[-1] + 1]
    voice *= 10 ** (-14 / 20) / float(np.sqrt(np.mean(voice[np.abs(voice) > 1e-3] ** 2)))
    pcm = np.concatenate([voice, np.zeros(int(0.05 * RATE))])
    path = tmp_path_factory.mktemp("mic") / "caller.wav"
    write_wav_s16(path, RATE, pcm)
    return path


def band_fractions(x: npt.NDArray[np.float64]) -> tuple[float, float]:
    """Shares of the energy in the speech band (250-3800 Hz) and above 4.4 kHz (where an
    upsampler's images of the bot's 8 kHz audio would land), over 4096-sample Hann frames."""
    n = 4096
    win = np.hanning(n)
    frames = [x[i : i + n] * win for i in range(0, len(x) - n, n // 2)]
    power = np.sum(np.abs(np.fft.rfft(frames, axis=1)) ** 2, axis=0)
    freqs = np.fft.rfftfreq(n, 1 / RATE)
    total = float(power[freqs > 60].sum())
    speech = float(power[(freqs >= 250) & (freqs <= 3800)].sum())
    images = float(power[freqs >= 4400].sum())
    return speech / total, images / total


async def inbound_stats(page: Page) -> dict[str, Any]:
    stats: dict[str, Any] = await page.eval("""
      (async () => {
        const out = {};
        (await window.voxphone.pc.getStats()).forEach((s) => {
          if (s.type === "inbound-rtp" && s.kind === "audio") Object.assign(out, s);
        });
        return out;
      })()
    """)
    return stats


async def test_a_browser_call_is_bridged_to_a_pipecat_bot(
    bot: BotProcess, engine: Engine, mic_wav: Path
) -> None:
    overrides = {"agent.kind": "stream", "stream.url": bot.url("/ws")}
    async with (
        local_gateway(engine, name="bridge-browser", overrides=overrides) as lg,
        chromium(fake_audio=mic_wav) as browser,
        browser.page(f"{lg.http}/phone") as page,
    ):
        before = {e: len(bot.events(e)) for e in ("start", "disconnected", "InterruptionFrame")}
        await without_csp(page)
        await page.eval(MUTED_MIC_JS)
        await page.eval("document.getElementById('call').click()")
        call_id = await page.wait("window.voxphone.callId", timeout=20)
        call = lg.gw.manager.calls[call_id]
        assert call.info.leg == "webrtc" and call.rate == RATE  # the wideband leg
        await page.wait("document.getElementById('remote').srcObject !== null", timeout=10)
        assert await page.eval(RECORDERS_JS) == "running"
        ear, mic = Ear(page, "agent"), Ear(page, "mic")
        await wait_for(lambda: isinstance(call.agent, StreamAgent), timeout=10)
        agent = call.agent
        assert isinstance(agent, StreamAgent)

        # The greeting (the bot builds its pipeline per call: a few seconds), in the page's
        # own meter and in the recording, which began before it.
        first = await ear.wait_for_audio(timeout=30)
        await page.wait("window.voxphone.maxRxRms > 0.02", timeout=5)
        start = await bot.wait_for("start", count=before["start"] + 1)
        # A browser has no number: the leg's addresses, as the call lists them.
        assert start["body"] == {"from_number": "browser:127.0.0.1", "to_number": "webrtc"}
        assert start["call_id"].startswith("CA") and start["stream_id"].startswith("MZ")
        quiet = await ear.wait_for_quiet(quiet_s=0.8, timeout=20)
        frames, levels = ear.frames(), ear.levels()
        assert levels[0] < SILENT_RMS  # the recording holds all of the greeting
        loud = np.nonzero((levels > SILENT_RMS) & (frames < quiet))[0]
        heard_s = (loud[-1] - loud[0] + 1) / 50
        sent_s = agent.stats.samples_received / 8000
        greeting = ear.pcm[loud[0] * BLOCK : (loud[-1] + 1) * BLOCK].astype(np.float64)
        speech, images = band_fractions(greeting)
        gap_s = _longest_quiet(levels[loud[0] : loud[-1] + 1]) / 50
        print(f"greeting: heard {heard_s:.2f} s of {sent_s:.2f} s sent; speech band {speech:.3f}, "
              f"above 4.4 kHz {images:.5f}; longest pause {gap_s:.2f} s; "
              f"first audio {(first - frames[0]) / RATE:.2f} s into the recording")  # fmt: skip
        # Upsampled, not played at another rate (2x or 6x fast or slow), not broken up. (The
        # margins are the browser's time-stretching and the ticks a starved gateway skips on
        # a loaded 2-core box: up to +20 % seen; the bot's own pauses are ~0.35 s.)
        assert 0.75 * sent_s <= heard_s <= 1.5 * sent_s
        assert speech > 0.9 and images < 0.01
        assert gap_s < 0.8
        # The muted microphone sent silence: nothing interrupted the greeting.
        assert agent.stats.clears == 0
        assert len(bot.events("InterruptionFrame")) == before["InterruptionFrame"]

        # A key in the page's keypad: the data channel, a DTMF event, Twilio's "dtmf", pipecat's
        # InputDTMFFrame; the bot's answer is heard.
        n_keys = len(bot.events("InputDTMFFrame"))
        at_key = await ear.now()
        await page.eval("document.querySelector('[data-key=\"5\"]').click()")
        key = await bot.wait_for("InputDTMFFrame", count=n_keys + 1)
        assert key["digit"] == "5"
        await ear.wait_for_audio(after=at_key, timeout=15)

        # The caller talks over the answer: pipecat's VAD interrupts it, its serializer sends
        # "clear", voxgate fades the queue out, and the browser hears silence. (This bot sends
        # at real time, 40-140 ms ahead of the playout: the fade itself, tested in
        # tests/agents/test_stream_agent.py, cuts little here.)
        await asyncio.sleep(1.0)
        assert call.info.speaking and agent.stats.clears == 0
        n_interruptions = len(bot.events("InterruptionFrame"))
        at_talk = await page.eval(
            "window.voxphone.mic.getAudioTracks()[0].enabled = true, "
            "Math.round(window.rec.ctx.currentTime * 48000)"
        )
        await wait_for(lambda: agent.stats.clears > 0, timeout=10, step=0.005)
        at_clear = await ear.now()
        await bot.wait_for("InterruptionFrame", count=n_interruptions + 1)
        await ear.wait_until(at_clear + int(1.5 * RATE))
        frames, levels = ear.frames(), ear.levels()
        after = (frames >= at_clear) & (frames < at_clear + int(1.5 * RATE))
        loud = frames[after & (levels >= SILENT_RMS)]
        # Measured from the page's clock as read once the clear was seen (later than the
        # clear itself): the check that the browser goes silent, not a latency figure.
        assert (loud[-1] + BLOCK - at_clear if loud.size else 0) < 0.5 * RATE
        # The figure: the caller's speech onset, as the page sent it, to the last of the bot
        # the browser heard (Opus both ways, the bridge, pipecat's VAD, its clear, the fade).
        # It varies from run to run with more than the bridge: Chromium's echo canceller
        # holds the caller down at times while the bot plays, and the bot's own pauses.
        onset = await mic.wait_for_audio(after=at_talk, level=SPEECH_ONSET_RMS, timeout=5)
        heard = frames[(frames >= onset) & (levels >= SILENT_RMS)]
        silent_at = heard[-1] + BLOCK if heard.size else onset
        print(f"caller speech onset -> silence in the browser: {(silent_at - onset) / 48:.0f} ms "
              f"(the clear seen by the test after {(at_clear - onset) / 48:.0f} ms)")  # fmt: skip
        assert agent.stats.media_dropped == 0 and agent.stats.samples_dropped == 0
        assert agent.error is None

        # Figures only: what the browser's jitter buffer had to conceal, and the gateway's
        # late and skipped media ticks (both follow this machine's load more than the bridge).
        rx = await inbound_stats(page)
        concealed = rx["concealedSamples"] / max(1, rx["totalSamplesReceived"])
        track = call.leg.track if isinstance(call.leg, WebRtcLeg) else None
        print(f"browser: {rx['packetsReceived']} packets, {rx['packetsLost']} lost, "
              f"{concealed:.2%} concealed, jitter {rx['jitter'] * 1000:.0f} ms; gateway: "
              f"{track and track.late_sends} late sends, {track and track.skipped_ticks} "
              "skipped ticks")  # fmt: skip

        # Hanging up in the page: the call ends, the bot gets "stop" and its socket closes.
        await page.eval("document.getElementById('hangup').click()")
        await wait_for(lambda: call_id not in lg.gw.manager.calls, timeout=5)
        assert call.info.end_reason == "remote hangup"
        await bot.wait_for("disconnected", count=before["disconnected"] + 1, timeout=10)
        assert agent.closed_by == "call" and agent.error is None


def _longest_quiet(levels: npt.NDArray[np.float64]) -> int:
    """The longest run of silent blocks."""
    best = run = 0
    for quiet in levels < SILENT_RMS:
        run = run + 1 if quiet else 0
        best = max(best, run)
    return best
