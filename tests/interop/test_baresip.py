"""baresip (a real softphone, headless) calls the gateway and records what it hears.

baresip runs with a generated config: ``aufile`` plays a silent WAV as the microphone,
``aubridge`` is a dummy player (no audio device), ``sndfile`` dumps the decoded receive audio
to ``dump-*-dec.wav``, ``g711`` is the only codec module, and ``menu`` lets ``-e`` dial.
baresip advertises its eth0 address in SDP although it talks from 127.0.0.1, so the gateway
only reaches it by latching RTP to the source of the first packet (symmetric RTP).

The recording must hold the greeting: speech soon after the answer, seconds of it without
long holes, then silence once the greeting is over (the IVR waits for a key).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.request
import wave
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tests.interop.conftest import (
    EventFeed,
    GatewayProc,
    free_port,
    need,
    port_block,
    start_gateway,
)

pytestmark = [pytest.mark.slow, pytest.mark.interop]

GREETING = "Thank you for calling voxgate. This is the interop test line."
FRAME = 160  # 20 ms at 8 kHz
SPEECH_RMS = 300.0  # well above G.711 idle noise; quiet syllables of the voice reach ~100-300
SILENCE_RMS = 30.0  # decoded G.711 silence is 0-8
CALL_S = 8


def write_silence(path: Path, seconds: float) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\0\0" * int(8000 * seconds))


def baresip_config(root: Path, sip_port: int, answer: str = "manual") -> Path:
    cfg = root / "baresip"
    rec = root / "rec"
    cfg.mkdir()
    rec.mkdir()
    mic = root / "silence.wav"
    write_silence(mic, 30)
    rtp = port_block(20)
    lines = [
        "poll_method epoll",
        f"sip_listen 127.0.0.1:{sip_port}",
        "sip_trans_def udp",
        f"rtp_ports {rtp[0]}-{rtp[1]}",
        "audio_player aubridge,nowhere",
        "audio_alert aubridge,nowhere",
        f"audio_source aufile,{mic}",
        "ausrc_srate 8000",
        "auplay_srate 8000",
        "ausrc_channels 1",
        "auplay_channels 1",
        "module_path /usr/lib/baresip/modules",
        "module g711.so",
        "module aufile.so",
        "module aubridge.so",
        "module sndfile.so",
        "module menu.so",
        "module_app account.so",
        f"snd_path {rec}",
    ]
    (cfg / "config").write_text("\n".join(lines) + "\n")
    (cfg / "accounts").write_text(
        f"<sip:tester@127.0.0.1:{sip_port}>;regint=0;answermode={answer};audio_codecs=PCMU\n"
    )
    (cfg / "contacts").write_text("")
    return cfg


@contextlib.asynccontextmanager
async def baresip(
    cfg: Path, log: Path, *commands: str, seconds: int
) -> AsyncIterator[asyncio.subprocess.Process]:
    args = ["baresip", "-f", str(cfg), "-t", str(seconds)]
    for c in commands:
        args += ["-e", c]
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *args, cwd=cfg.parent, stdin=asyncio.subprocess.DEVNULL, stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


def frame_rms(path: Path) -> npt.NDArray[np.float64]:
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (8000, 1, 2)
        x = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float64)
    n = len(x) // FRAME
    frames = x[: n * FRAME].reshape(n, FRAME)
    rms: npt.NDArray[np.float64] = np.sqrt((frames**2).mean(axis=1))
    return rms


def check_greeting(rms: npt.NDArray[np.float64]) -> str:
    """The recording's shape: greeting first, then silence. Returns a summary for messages."""
    secs = len(rms) * 0.02
    loud = np.flatnonzero(rms > SPEECH_RMS)
    summary = f"{secs:.1f} s recorded; 100 ms RMS: " + " ".join(
        f"{v:.0f}" for v in rms[: len(rms) // 5 * 5].reshape(-1, 5).mean(axis=1)
    )
    assert secs >= CALL_S - 3, summary
    assert len(loud) > 0, f"no speech at all: {summary}"
    first, last = loud[0] * 0.02, loud[-1] * 0.02
    assert first <= 1.0, f"first audio {first:.2f} s after the answer: {summary}"
    # Several seconds of speech: the greeting is ~4 s of audio.
    assert last - first >= 2.0, f"speech only {first:.2f}-{last:.2f} s: {summary}"
    assert len(loud) * 0.02 >= 1.2, f"only {len(loud) * 0.02:.2f} s loud: {summary}"
    # No hole inside the greeting longer than a sentence pause (underruns would make them).
    gaps = np.diff(loud) * 0.02
    assert gaps.max(initial=0) < 1.0, f"a {gaps.max():.2f} s hole in the greeting: {summary}"
    # Silence before the first word and after the last one (the IVR waits for a key).
    assert (rms[: max(loud[0] - 3, 0)] < SILENCE_RMS).all(), f"noise before speech: {summary}"
    tail = rms[loud[-1] + 25 :]  # from 0.5 s after the last loud frame (decay, last syllable)
    assert len(tail) * 0.02 >= 1.5, f"the greeting never ended: {summary}"
    assert (tail < SILENCE_RMS).all(), f"not silent after the greeting: {summary}"
    return summary


@pytest.fixture(scope="module")
def short_greeting_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProc]:
    """A gateway whose greeting is short (~4 s), so the recording also shows the silence after
    it; shared by both directions."""
    need("baresip")
    gw = start_gateway(
        tmp_path_factory.mktemp("baresip-gw"),
        "--ivr-greeting", GREETING, "--ivr-idle-timeout-s", "60",
    )  # fmt: skip
    try:
        yield gw
    finally:
        gw.stop()
    problems = gw.log_problems()
    assert not problems, f"gateway logged errors:\n{gw.log()[-6000:]}"


@pytest.mark.parametrize("direction", ["inbound", "outbound"])
async def test_baresip_hears_the_greeting(
    short_greeting_gateway: GatewayProc, tmp_path: Path, direction: str
) -> None:
    gw = short_greeting_gateway
    sip_port = free_port()
    cfg = baresip_config(tmp_path, sip_port, "auto" if direction == "outbound" else "manual")
    log = tmp_path / "baresip.log"
    commands = [f"/dial sip:ivr@{gw.sip}"] if direction == "inbound" else []
    async with EventFeed(gw.http) as feed, baresip(cfg, log, *commands, seconds=CALL_S) as proc:
        if direction == "outbound":
            await asyncio.sleep(1.0)  # baresip binds its SIP socket
            call = await asyncio.to_thread(_post_call, gw, f"sip:tester@127.0.0.1:{sip_port}")
            cid = call["id"]
        else:
            cid = (await feed.wait_for("call.state", state="ringing", timeout=10))["call_id"]
        await feed.wait_for("call.state", call_id=cid, state="answered", timeout=10)
        await asyncio.wait_for(proc.wait(), CALL_S + 10)
        ended = await feed.wait_for("call.state", call_id=cid, state="ended", timeout=10)
        text = log.read_text(errors="replace")
        assert "Call established" in text, text[-3000:]
        assert ended["reason"] == "remote hangup", ended
        (info,) = [e for e in feed.of("call.state", cid) if e["state"] == "answered"]
        finished = await feed.wait_for("utterance.finished", call_id=cid)
        assert finished["outcome"] == "done", finished
        assert finished["heard"].startswith("Thank you for calling voxgate"), finished
    # baresip's SDP names its eth0 address, yet media flowed: the gateway latched.
    assert "incoming rtp for 'audio' established" in text, text[-3000:]
    (dec,) = sorted((tmp_path / "rec").glob("dump-*-dec.wav"))
    check_greeting(frame_rms(dec))
    assert info["call_id"] == cid
    await gw.wait_no_calls()


def _post_call(gw: GatewayProc, to: str) -> dict[str, Any]:
    req = urllib.request.Request(
        gw.http + "/api/calls", data=json.dumps({"to": to}).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = json.loads(resp.read())
    assert isinstance(body, dict)
    return body
