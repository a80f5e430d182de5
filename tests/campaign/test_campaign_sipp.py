"""Campaigns through the REST API against real sipp callees, measured at the callee's side of
the wire (sipp's own message trace, with its receive times):

- pacing: consecutive INVITEs of a campaign at least ``1/cps`` apart (less a little for the
  loop's send jitter), and never more than ``max_concurrent`` calls up at once (an INVITE
  arriving before the BYE of an earlier call ended it counts as overlap);
- retries: a busy callee gets exactly ``1 + max`` INVITEs, each ``backoff_s`` after the last;
- a trunk's 503 with ``Retry-After: 2`` holds the whole campaign's dialling for 2 s.

Three campaigns run at once on one in-process gateway (memory bus, the real worker, the IVR
agent), each against its own sipp UAS.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from synth.engines.base import Engine
from tests.interop.conftest import Sipp, free_port, port_block
from voxgate.bench.campaign import peak_overlap
from voxgate.bench.localgw import LocalGateway, local_gateway

pytestmark = [pytest.mark.interop, pytest.mark.slow]

FIXTURES = Path(__file__).resolve().parents[2] / "sip-fixtures" / "campaign"
# A dial is timed when its contact is claimed; the INVITE leaves a few store calls later, so two
# INVITEs may come closer than 1/cps by that much on a busy box (never on average).
SEND_JITTER_S = 0.06


_ENTRY = re.compile(
    r"^-{20,} (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\n\S+ message (received|sent) .*?\n(.*?)"
    r"(?=^-{20,} |\Z)",
    re.S | re.M,
)


def trace(path: Path) -> list[tuple[float, str, str, str]]:
    """sipp's ``-trace_msg`` file as (time, received|sent, first line, Call-ID)."""
    out = []
    for stamp, way, body in _ENTRY.findall(path.read_text(errors="replace")):
        first = body.strip().split("\n", 1)[0].strip()
        cid = re.search(r"^\s*Call-ID:\s*(\S+)", body, re.M | re.I)
        t = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp()
        out.append((t, way, first, cid[1] if cid else ""))
    return out


def invites(entries: list[tuple[float, str, str, str]]) -> dict[str, float]:
    """Call-ID -> when its first INVITE arrived (retransmissions share the Call-ID)."""
    first: dict[str, float] = {}
    for t, way, line, cid in entries:
        if way == "received" and line.startswith("INVITE ") and cid not in first:
            first[cid] = t
    return first


async def _api(local: LocalGateway, method: str, path: str, body: Any = None) -> Any:
    async with aiohttp.ClientSession() as s, s.request(method, local.http + path, json=body) as r:
        text = await r.text()
        assert r.status < 300, (r.status, text)
        return json.loads(text)


async def _done(local: LocalGateway, cid: str, timeout: float = 90.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        rec: dict[str, Any] = await _api(local, "GET", f"/api/campaigns/{cid}")
        if rec["state"] == "done":
            return rec
        assert time.monotonic() < deadline, rec["totals"]
        await asyncio.sleep(0.3)


async def test_pacing_concurrency_retries_and_trunk_hold_at_the_callee(
    gw: LocalGateway, sipp: Sipp, tmp_path: Path
) -> None:
    answer_port, busy_port, full_port = free_port(), free_port(), free_port()
    _, answer_tag = await sipp.start(
        str(FIXTURES / "answer_hangup.xml"), target=None, sip_port=answer_port,
        args=["-d", "1200"], timeout_s=120,
    )  # fmt: skip
    _, busy_tag = await sipp.start(
        str(FIXTURES / "busy.xml"), target=None, sip_port=busy_port, timeout_s=120
    )
    _, full_tag = await sipp.start(
        str(FIXTURES / "unavailable.xml"), target=None, sip_port=full_port, timeout_s=120
    )
    await asyncio.sleep(0.5)  # the UASs listen
    agent = {"kind": "ivr"}
    paced = {
        "id": "paced", "agent": agent, "cps": 5, "max_concurrent": 2,
        "contacts": [{"to": f"sip:p{i}@127.0.0.1:{answer_port}"} for i in range(8)],
    }  # fmt: skip
    retried = {
        "id": "retried", "agent": agent, "cps": 5, "max_concurrent": 1,
        "retries": {"busy": {"max": 2, "backoff_s": 1}},
        "contacts": [{"to": f"sip:b0@127.0.0.1:{busy_port}"}],
    }  # fmt: skip
    held = {
        "id": "held", "agent": agent, "cps": 20, "max_concurrent": 1,
        "contacts": [{"to": f"sip:t{i}@127.0.0.1:{full_port}"} for i in range(2)],
    }  # fmt: skip
    for body in (paced, retried, held):
        created = await _api(gw, "POST", "/api/campaigns", body)
        assert created["state"] == "running"
    records = {cid: await _done(gw, cid) for cid in ("paced", "retried", "held")}

    # Pacing and concurrency, as the callee saw them.
    entries = trace(tmp_path / f"{answer_tag}.msg")
    starts = invites(entries)
    assert len(starts) == 8, starts
    times = sorted(starts.values())
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 1 / 5 - SEND_JITTER_S, gaps
    assert (times[-1] - times[0]) / 7 >= 1 / 5 - 0.01, gaps  # on average never above cps
    byes = {cid: t for t, way, line, cid in entries if way == "sent" and line.startswith("BYE ")}
    assert set(byes) == set(starts)
    spans = [(starts[cid], byes[cid]) for cid in starts]
    assert peak_overlap(spans) <= 2, spans
    assert peak_overlap(spans) == 2  # the cap was reached, not just respected by slowness
    assert records["paced"]["totals"]["outcomes"] == {"human": 8}

    # Retries: busy, busy after 1 s, busy after 1 s more; then final.
    busy = sorted(invites(trace(tmp_path / f"{busy_tag}.msg")).values())
    assert len(busy) == 3, busy
    assert all(b - a >= 1.0 - SEND_JITTER_S for a, b in itertools.pairwise(busy)), busy
    contact = records["retried"]["contacts"][0]
    assert contact["outcome"] == "busy"
    assert [a["sip_status"] for a in contact["attempts"]] == [486, 486, 486]

    # The trunk's 503 Retry-After: 2 holds the campaign: the second contact (due at once, cps
    # 20) is dialled only once the hold is over.
    full = trace(tmp_path / f"{full_tag}.msg")
    tried = sorted(invites(full).values())
    assert len(tried) == 2, tried
    first_503 = min(t for t, way, line, _ in full if way == "sent" and " 503 " in line)
    assert tried[1] - first_503 >= 2.0 - SEND_JITTER_S, (tried, first_503)
    for c in records["held"]["contacts"]:
        assert c["outcome"] == "failed"
        assert c["attempts"][0]["sip_status"] == 503


async def test_e164_contacts_are_dialled_through_the_trunk(
    engine: Engine, sipp: Sipp, tmp_path: Path
) -> None:
    trunk_port = free_port()
    _, tag = await sipp.start(
        str(FIXTURES / "answer_hangup.xml"), target=None, sip_port=trunk_port,
        args=["-d", "500"], timeout_s=60,
    )  # fmt: skip
    lo, hi = port_block(20)
    overrides = {
        "gateway.rtp_port_min": lo,
        "gateway.rtp_port_max": hi,
        "gateway.trunk": f"sip:127.0.0.1:{trunk_port}",
        "campaign.db": str(tmp_path / "campaigns.sqlite"),
    }
    await asyncio.sleep(0.3)
    async with local_gateway(engine, name="trunk", overrides=overrides) as local:
        body = {
            "id": "numbers", "agent": {"kind": "ivr"}, "cps": 10, "max_concurrent": 2,
            "contacts": [{"to": "+1 (415) 555-0100"}, {"to": "+44 20 7946 0958"}],
        }  # fmt: skip
        await _api(local, "POST", "/api/campaigns", body)
        record = await _done(local, "numbers")
    assert record["totals"]["outcomes"] == {"human": 2}
    lines = [line for _, way, line, _ in trace(tmp_path / f"{tag}.msg") if way == "received"]
    uris = sorted({line.split()[1] for line in lines if line.startswith("INVITE ")})
    # RFC 3261 §19.1.6: a telephone number as the user part at the trunk, user=phone.
    assert uris == [
        f"sip:+14155550100@127.0.0.1:{trunk_port};user=phone",
        f"sip:+442079460958@127.0.0.1:{trunk_port};user=phone",
    ]
