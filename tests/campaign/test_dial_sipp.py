"""The campaign dialler against real callees: an in-process gateway (memory bus, the real onnx
worker, its SIP user agent on loopback) runs :class:`CallDialer` in the test's loop, and sipp
UASs from ``sip-fixtures/campaign`` answer as a person, an answering machine, busy, nobody and
an overloaded trunk, with audio made by espeak-ng and sox (``tests/campaign/audio.py``).

The voicemail's timing is checked on the wire. The gateway latches its RTP to the source of
what it receives (symmetric RTP, ``gateway.rtp.latch``): listening beside a sipp that streams
would hear nothing, since the gateway answers sipp's own port. So in that test the callee's
SDP names the test's own socket (``callee_at_port.xml``), which plays the machine's greeting
and beep and records every packet the gateway sends back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.call.calls import Call
from gateway.call.control import AmdResult, Event, UtteranceStarted
from gateway.campaign.contacts import Contact
from gateway.campaign.dialer import CallDialer
from gateway.campaign.outcomes import Outcome
from gateway.campaign.runner import DialResult
from gateway.campaign.spec import CampaignSpec
from gateway.campaign.store import Claim
from gateway.stt.base import to_stt_rate
from tests.campaign import audio
from tests.interop.conftest import Sipp, SippResult, free_port
from voxgate.bench.localgw import LocalGateway
from voxgate.bench.sipclient import RtpPeer, rms

pytestmark = [pytest.mark.interop, pytest.mark.slow]

FIXTURES = Path(__file__).resolve().parents[2] / "sip-fixtures" / "campaign"
VOICEMAIL = "Hello Dana, this is Acme Dental reminding you of your appointment tomorrow at ten."
SPEECH_RMS = 300.0  # a 20 ms frame of synthesised speech is far above this; held silence is 0


class Events:
    """Every event of the gateway's calls (the /api/events feed, in process)."""

    def __init__(self, local: LocalGateway) -> None:
        self.sub = local.gw.manager.subscribe_events()
        self.events: list[Event] = []
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for event in self.sub:
            self.events.append(event)

    async def close(self) -> None:
        self.task.cancel()
        await self.sub.aclose()

    def amd(self, contact: int) -> list[AmdResult]:
        return [e for e in self.events if isinstance(e, AmdResult) and e.contact == contact]

    def of_call(self, call_id: str) -> list[Event]:
        return [e for e in self.events if e.call_id == call_id]


def claim(index: int, to: str) -> Claim:
    return Claim("c1", index, Contact(to), "gw-test", time.time() + 600)


def spec(**kw: Any) -> CampaignSpec:
    return CampaignSpec(agent={"kind": "ivr"}, ring_timeout_s=kw.pop("ring_timeout_s", 20.0), **kw)


async def uas(sipp: Sipp, scenario: str, *args: str) -> tuple[tuple[Any, str], int]:
    port = free_port()
    started = await sipp.start(
        str(FIXTURES / scenario), target=None, sip_port=port, args=["-m", "1", *args]
    )
    return started, port


def no_errors(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not bad, [f"{r.name}: {r.getMessage()}" for r in bad]


async def test_outcomes_against_sipp_callees(
    gw: LocalGateway, sipp: Sipp, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Person, machine (voicemail after the beep), busy, no answer and a 503, all at once."""
    caplog.set_level(logging.INFO)
    audio.person(tmp_path)  # sipp streams these from its working directory (tmp_path)
    machine_clip = audio.machine(tmp_path)
    events = Events(gw)
    manager = gw.gw.manager
    callees = {
        "person": await uas(sipp, "person.xml"),
        "machine": await uas(sipp, "machine.xml"),
        "busy": await uas(sipp, "busy.xml"),
        "no_answer": await uas(sipp, "no_answer.xml"),
        "trunk_503": await uas(sipp, "unavailable.xml"),
    }
    await asyncio.sleep(0.3)  # the UASs are listening
    amd_vm = CallDialer(manager, "c1", spec(amd=True, voicemail=VOICEMAIL))
    plain = CallDialer(manager, "c1", spec(amd=False, ring_timeout_s=2.0))
    index = {name: i for i, name in enumerate(callees)}

    async def dial(name: str, dialer: CallDialer) -> tuple[DialResult, float]:
        t0 = time.monotonic()
        port = callees[name][1]
        result = await dialer(claim(index[name], f"sip:{name}@127.0.0.1:{port}"))
        return result, time.monotonic() - t0

    try:
        results = dict(
            zip(
                callees,
                await asyncio.wait_for(
                    asyncio.gather(
                        dial("person", amd_vm),
                        dial("machine", amd_vm),
                        dial("busy", plain),
                        dial("no_answer", plain),
                        dial("trunk_503", plain),
                    ),
                    60,
                ),
                strict=True,
            )
        )
        sipps: dict[str, SippResult] = {}
        for name, (started, _) in callees.items():
            sipps[name] = await asyncio.wait_for(sipp.wait(started), 30)
    finally:
        await events.close()
    for res in sipps.values():
        res.assert_ok()  # each callee saw the dialogue its scenario expects (BYE, CANCEL, ACK)

    # A person: "Hello?" then silence is human; the agent (the IVR) greets only after that.
    person, _ = results["person"]
    assert person == DialResult(Outcome.HUMAN), person
    amd = events.amd(index["person"])
    assert [e.type for e in amd] == ["amd.human"], amd
    call_id = amd[0].call_id
    greetings = [e for e in events.of_call(call_id) if isinstance(e, UtteranceStarted)]
    assert greetings, "the agent never spoke after amd.human"
    assert min(g.ts for g in greetings) >= amd[0].ts
    print(f"person: amd.human {amd[0].at_ms} ms after the answer ({amd[0].cause})")

    # A machine: the agent never starts; the voicemail is said after the beep, then BYE.
    machine, _ = results["machine"]
    assert machine.outcome is Outcome.MACHINE and machine.voicemail_left, machine
    assert machine.reason is not None and "beep" in machine.reason
    amd = events.amd(index["machine"])
    assert [e.type for e in amd] == ["amd.machine", "amd.beep"], amd
    assert amd[1].frequency_hz is not None and abs(amd[1].frequency_hz - audio.BEEP_HZ) < 30
    call_id = amd[0].call_id
    spoken = [e for e in events.of_call(call_id) if isinstance(e, UtteranceStarted)]
    assert [u.text for u in spoken] == [VOICEMAIL], "only the voicemail, never the agent"
    assert spoken[0].ts >= amd[1].ts
    assert machine_clip.beep_ms is not None
    print(
        f"machine: amd.machine {amd[0].at_ms} ms ({amd[0].cause}), amd.beep {amd[1].at_ms} ms "
        f"after the answer (the beep ends {machine_clip.beep_ms[1]} ms into sipp's stream)"
    )

    assert results["busy"][0] == DialResult(Outcome.BUSY, 486, reason="486 Busy Here")
    no_answer, took = results["no_answer"]
    assert no_answer.outcome is Outcome.NO_ANSWER, no_answer
    assert 1.9 <= took < 10, took  # the 2 s ring timeout, then CANCEL
    failed, _ = results["trunk_503"]
    assert (failed.outcome, failed.sip_status, failed.retry_after) == (Outcome.FAILED, 503, 2.0)
    assert not manager.calls
    no_errors(caplog)


async def test_voicemail_heard_after_the_beep_on_the_wire(
    gw: LocalGateway, sipp: Sipp, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The machine's audio comes from the test's socket; what the gateway sends back is
    recorded, decoded (PCMU) and timed: silence (the agent held) until after the beep has
    ended, then the voicemail."""
    caplog.set_level(logging.INFO)
    clip = audio.machine(tmp_path)
    assert clip.beep_ms is not None
    pcm = audio.pcm(clip)
    peer = await RtpPeer.open("127.0.0.1")
    events = Events(gw)
    manager = gw.gw.manager
    started, port = await uas(sipp, "callee_at_port.xml", "-set", "rtpport", str(peer.local_port))
    await asyncio.sleep(0.3)
    dialer = CallDialer(manager, "c1", spec(amd=True, voicemail=VOICEMAIL))
    try:
        task = asyncio.create_task(dialer(claim(7, f"sip:vm@127.0.0.1:{port}")))
        call = await _the_call(manager.calls, timeout=10)
        await _answered(call, timeout=10)
        leg: Any = call.leg
        peer.configure(("127.0.0.1", leg.endpoint.local_port), "PCMU", 0, None)
        peer.send_audio(pcm)
        sent_at = time.time()
        peer.start_sending()
        result = await asyncio.wait_for(task, 45)
        sipp_result = await asyncio.wait_for(sipp.wait(started), 30)
    finally:
        peer.close()
        await events.close()
    sipp_result.assert_ok()
    assert result.outcome is Outcome.MACHINE and result.voicemail_left, result

    # The beep's last packet leaves on its 20 ms slot (the sender is never early).
    beep_end = sent_at + clip.beep_ms[1] / 1000
    packets = peer.audio()
    before = [p for p in packets if p.arrival <= beep_end]
    assert len(before) > 100, "the gateway sent no RTP during the greeting"
    loud = [p for p in packets if rms(peer.codec.decode(p.payload)) > SPEECH_RMS]
    assert loud, "no voicemail was heard"
    first = loud[0].arrival
    # Nothing but silence from the gateway during the greeting and the beep (the agent is
    # held, the voicemail waits) ...
    assert first > beep_end, (first - beep_end, "voicemail before the beep ended")
    assert first - beep_end < 5.0, "the voicemail came long after the beep"
    # ... and then the whole message: speech for over a second (the text is ~5 s of it).
    speech_s = len(loud) * 0.02
    assert speech_s > 1.0, speech_s
    heard = np.concatenate([peer.codec.decode(p.payload) for p in packets if p.arrival >= first])
    amd = events.amd(7)
    assert [e.type for e in amd] == ["amd.machine", "amd.beep"], amd
    # What the machine recorded after its beep is the message (the bundled recogniser).
    text = await asyncio.to_thread(_transcribe, heard)
    assert {"appointment", "tomorrow"} <= set(text.lower().replace(",", " ").split()), text
    print(
        f"wire: beep ends {beep_end:.3f}, voicemail's first loud packet {first:.3f} "
        f"(+{(first - beep_end) * 1000:.0f} ms), {speech_s:.1f} s of speech in "
        f"{len(heard) / 8000:.1f} s (sender late by <= {peer.send_late_max * 1000:.0f} ms); "
        f"amd.machine {amd[0].at_ms} ms, amd.beep {amd[1].at_ms} ms; "
        f"heard {text!r}"
    )
    no_errors(caplog)


def _transcribe(pcm: np.ndarray) -> str:
    from gateway.stt.whisper import SttUnavailable, WhisperStt

    try:
        stt = WhisperStt()
    except SttUnavailable as exc:  # pragma: no cover - the model ships with the test extras
        pytest.skip(f"no speech-to-text model: {exc}")
    return stt.transcribe(to_stt_rate(pcm, 8000)).text


async def _the_call(calls: dict[str, Call], *, timeout: float) -> Call:
    deadline = time.monotonic() + timeout
    while not calls:
        assert time.monotonic() < deadline, "the dialler placed no call"
        await asyncio.sleep(0.01)
    return next(iter(calls.values()))


async def _answered(call: Call, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while call.info.state != "answered":
        assert call.info.state != "ended", call.info
        assert time.monotonic() < deadline, "not answered"
        await asyncio.sleep(0.005)
