"""sipp against ``voxgate serve --agent-kind flow --flow-file deploy/flows/account.toml``: the
caller keys four digits and # (SIP INFO, ``flow_account_info.xml``) and the flow branches on
them; which prompt follows the keys is read from ``/api/events``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.interop.conftest import EventFeed, GatewayFactory, Sipp

pytestmark = [pytest.mark.slow, pytest.mark.interop]

ACCOUNT_FLOW = Path(__file__).resolve().parents[2] / "deploy" / "flows" / "account.toml"
PREMIUM = "Thank you. As a premium customer, you have a dedicated advisor."


async def test_four_digits_then_pound_branch_the_flow(
    gateway_factory: GatewayFactory, sipp: Sipp
) -> None:
    gateway = gateway_factory("--agent-kind", "flow", "--flow-file", str(ACCOUNT_FLOW))
    for keys, branch in (("9123", PREMIUM), ("4321", "Thank you.")):
        async with EventFeed(gateway.http) as feed:
            sets = [a for i, k in enumerate(keys, 1) for a in ("-set", f"k{i}", k)]
            result = await sipp.run("flow_account_info.xml", target=gateway.sip,
                                    args=["-m", "1", "-s", "bank", *sets])  # fmt: skip
            result.assert_ok()
            (answered,) = [e for e in feed.of("call.state") if e["state"] == "answered"]
            cid = answered["call_id"]
            await feed.wait_for("call.state", call_id=cid, state="ended")
            digits = [(d["digit"], d["source"]) for d in feed.of("dtmf", cid)]
            assert digits == [(k, "info") for k in keys + "#"], digits
            pound = feed.of("dtmf", cid)[-1]["ts"]
            after = [e["text"] for e in feed.of("utterance.started", cid) if e["ts"] > pound]
            assert after[:2] == [
                branch,
                f"For the balance of account {keys}, press 1. To speak with an agent, press 0.",
            ], after
        await gateway.wait_no_calls()
