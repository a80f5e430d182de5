"""A flow's ``transfer`` verb against a real transferee: sipp (``refer_decline.xml``) answers the
gateway's REFER with 603 Decline, and the verb's fallback is what the caller hears next (read
from ``/api/events``); the call stays up until the caller hangs up."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.interop.conftest import EventFeed, GatewayFactory, Sipp, port_block

pytestmark = [pytest.mark.slow, pytest.mark.interop]

FLOW = """
[[flows.main]]
say = { text = "Please hold while I connect you.", barge_in = [] }

[[flows.main]]
[flows.main.transfer]
target = "sip:desk@example.test"
fallback = [
    { say = "Sorry, nobody can take your call right now." },
    { pause = { length = 10 } },
]
"""


async def test_a_refused_transfer_plays_the_verbs_fallback(
    gateway_factory: GatewayFactory, sipp: Sipp, tmp_path: Path
) -> None:
    flow = tmp_path / "transfer.toml"
    flow.write_text(FLOW)
    gateway = gateway_factory("--agent-kind", "flow", "--flow-file", str(flow))
    sink = port_block(2)[0]
    async with EventFeed(gateway.http) as feed:
        run = await sipp.start(
            "refer_decline.xml", target=gateway.sip,
            args=["-m", "1", "-s", "desk", "-d", "4000", "-set", "rtpport", str(sink)],
        )  # fmt: skip
        refused = await feed.wait_for("transfer", state="refused", timeout=30)
        cid = refused["call_id"]
        assert refused["status"] == 603, refused
        fallback = await feed.wait_for(
            "utterance.started", call_id=cid, text="Sorry, nobody can take your call right now."
        )
        assert fallback["ts"] >= refused["ts"]
        (await sipp.wait(run)).assert_ok()
        ended = await feed.wait_for("call.state", call_id=cid, state="ended")
        assert ended["reason"] == "remote hangup"
        said = [e["text"] for e in feed.of("utterance.started", cid)]
        assert said == [
            "Please hold while I connect you.",
            "Sorry, nobody can take your call right now.",
        ], said
    await gateway.wait_no_calls()
