"""Issue 17: a browser hanging up mid-greeting stops the worker's synthesis of it.

Before the fix the cancel was only spawned as a task by ``Call.ended``, which then cancelled
the call's tasks; on the embedded memory bus nothing in between suspends, so the cancel never
ran and the worker rendered the whole greeting for a call that was gone. The next caller's
first chunk queued behind it: 0.5–4 s of silence before the greeting, in one call of three
when calls come one after another (the bimodal tail of ``voxgate bench webrtc``).

These tests check the mechanism, not a latency: the greeting's utterance carries a cancel
marker on the bus once the leg has closed, and the worker stops serving it. Both ways a
browser leaves: the softphone's "hangup" on its data channel, and a bare audio client (no data
channel) closing its peer connection.
"""

from __future__ import annotations

import pytest

from gateway.call.control import UtteranceStarted
from synth.engines.base import Engine
from tests.waiting import wait_for
from voxgate.bench.localgw import local_gateway
from voxgate.bench.webrtc_client import WebRtcClient

pytestmark = pytest.mark.slow

# A greeting far longer than the seconds the test waits: rendered to the end (the bug), the
# worker would be busy with it for well over a minute of audio.
SENTENCE = "Thank you for calling, every word of this greeting is rendered for the caller. "
LONG_GREETING = SENTENCE * 40


@pytest.mark.parametrize("datachannel", [True, False], ids=["datachannel", "bare-audio"])
async def test_hangup_mid_greeting_cancels_its_synthesis(engine: Engine, datachannel: bool) -> None:
    overrides = {"ivr.greeting": LONG_GREETING, "webrtc.media_timeout_s": 2.0}
    async with local_gateway(engine, name="webrtc", overrides=overrides) as lg:
        client = WebRtcClient(lg.http, datachannel=datachannel)
        call_id = await client.connect()
        await client.wait_audio(timeout=15)
        call = lg.gw.manager.calls[call_id]
        started = [e for e in call.history if isinstance(e, UtteranceStarted)]
        assert len(started) == 1
        greeting = started[0].utterance_id
        assert lg.worker.in_flight == 1  # still rendering the rest of the greeting
        assert not await lg.bus.is_cancelled(greeting)

        if datachannel:
            await client.hangup()  # {"type": "hangup"} on the data channel, then close
        else:
            await client.close()  # DTLS close_notify; at worst the media timeout ends it
        await wait_for(lambda: call_id not in lg.gw.manager.calls, timeout=10)

        # The marker is on the bus before the call is torn down, so the worker sees it at its
        # next chunk boundary and stops: nothing is left rendering for a call that is gone.
        assert await lg.bus.is_cancelled(greeting)
        await wait_for(lambda: lg.worker.in_flight == 0, timeout=10)
