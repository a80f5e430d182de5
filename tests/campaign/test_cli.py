"""``voxgate campaign``, run as a real process against the real campaign API served in this
test's process (its dial injected: the calls are test_restart_sipp.py's business): a CSV to a
finished campaign with its summary, a bad CSV refused with its line numbers and nothing
created, Ctrl-C cancelling the campaign, and status/pause/resume/cancel."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.campaign.test_service import AUTH, TOKEN, FakeDial, Gw, Harness, _until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(tmp_path, "sqlite")
    try:
        yield h
    finally:
        await h.close()


def _url(gw: Gw) -> str:
    return f"http://127.0.0.1:{gw.client.port}"


async def _cli(
    *args: str, gw: Gw | None = None, token: str | None = TOKEN
) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    if token is not None:
        env["VOXGATE_GATEWAY_API_TOKEN"] = token
    url = ["--url", _url(gw)] if gw is not None else []
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "voxgate.cli", "campaign", *args, *url,
        cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def _run_here(*args: str, gw: Gw, token: str = TOKEN) -> tuple[int, str, str]:
    """The same CLI called in a thread of this process (no interpreter start: the control
    commands, whose behaviour does not depend on being a process of their own)."""
    from voxgate.cli import main

    out, err = io.StringIO(), io.StringIO()

    def call() -> int:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return main(["campaign", *args, "--url", _url(gw), "--token", token])

    code = await asyncio.to_thread(call)
    return code, out.getvalue(), err.getvalue()


async def _done(proc: asyncio.subprocess.Process) -> tuple[int, str, str]:
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _csv(tmp_path: Path, rows: list[str], header: str = "to,name") -> str:
    path = tmp_path / "contacts.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return str(path)


async def test_run_a_csv_to_the_end_with_a_summary(harness: Harness, tmp_path: Path) -> None:
    dial = FakeDial(hold_s=0.05)
    gw = await harness.gateway(dial)
    csv = _csv(tmp_path, [f"+1 555 000 {i:04d},Name{i}" for i in range(5)])
    proc = await _cli(
        "run", csv, "--cps", "20", "--concurrency", "3", "--agent-kind", "ivr",
        "--retries", '{"busy": {"max": 1, "backoff_s": 0}}', "--window",
        "00:00-23:59 mon-sun UTC", "--id", "cli-1", "--poll", "0.2", gw=gw,
    )  # fmt: skip
    code, out, err = await _done(proc)
    assert code == 0, err
    assert "[" in err and "5/5" in err  # the progress bar, on stderr
    lines = out.splitlines()
    assert lines[0] == "campaign cli-1: done"
    assert any(line.split() == ["human", "5"] for line in lines), out
    assert any(line.split()[:3] == ["+15550000003", "human", "1"] for line in lines), out
    body = await (await gw.client.get("/api/campaigns/cli-1", headers=AUTH)).json()
    assert body["spec"]["cps"] == 20 and body["spec"]["max_concurrent"] == 3
    assert body["spec"]["window"]["tz"] == "UTC"
    assert body["spec"]["retries"] == {"busy": {"max": 1, "backoff_s": 0.0}}
    assert body["contacts"][1]["vars"] == {"name": "Name1"}
    assert sorted(dial.calls.values()) == [1] * 5


async def test_a_bad_csv_exits_2_with_line_numbers_and_creates_nothing(
    harness: Harness, tmp_path: Path
) -> None:
    gw = await harness.gateway(FakeDial())
    csv = _csv(
        tmp_path,
        ["+15550000001,a", "5551234,b", "sip:bob@example.com,c", "+1555 000 0001,d", "x"],
    )
    code, out, err = await _done(await _cli("run", csv, gw=gw))
    assert code == 2 and out == ""
    assert f"{csv}: line 3:" in err and f"{csv}: line 5:" in err and f"{csv}: line 6:" in err
    assert "line 2:" not in err and "line 4:" not in err
    assert "nothing created" in err
    listing = await (await gw.client.get("/api/campaigns", headers=AUTH)).json()
    assert listing == {"campaigns": []}
    # Refused by the gateway (its agent registry): exit 2 with the field named.
    good = _csv(tmp_path, ["+15550000001,a"])
    code, _out, err = await _run_here("run", good, "--agent-kind", "telepathy", gw=gw)
    assert code == 2 and "field: agent" in err, err
    # A bad flag is caught here before anything is sent.
    code, _out, err = await _run_here("run", good, "--cps", "0", gw=gw)
    assert code == 2 and "cps" in err
    code, _, err = await _run_here("run", str(tmp_path / "none.csv"), gw=gw)
    assert code == 2
    assert (await (await gw.client.get("/api/campaigns", headers=AUTH)).json())["campaigns"] == []
    # A wrong token: refused by the gateway, exit 1.
    code, _, err = await _run_here("run", good, gw=gw, token="wrong")
    assert code == 1 and "token" in err


async def test_ctrl_c_cancels_the_campaign_and_prints_the_summary(
    harness: Harness, tmp_path: Path
) -> None:
    dial = FakeDial(gate=asyncio.Event())
    gw = await harness.gateway(dial)
    csv = _csv(tmp_path, [f"+1555000{i:04d},n" for i in range(6)])
    proc = await _cli(
        "run", csv, "--concurrency", "2", "--cps", "50", "--id", "cc", "--poll", "0.1", gw=gw
    )
    await _until(lambda: dial.live == 2, what="two calls up")
    assert proc.stderr is not None
    # The campaign's first line comes once Ctrl-C is handled (the CLI may print warnings
    # before it; a signal then would find Python's handler, or an inherited SIG_IGN).
    while not (line := await asyncio.wait_for(proc.stderr.readline(), 30)).startswith(
        b"campaign cc:"
    ):
        assert line, "the CLI ended before the campaign's first line"
    proc.send_signal(signal.SIGINT)
    code, out, err = await _done(proc)
    assert code == 130, err
    assert "cancelling campaign cc" in err
    assert out.splitlines()[0] == "campaign cc: cancelled"
    assert any(line.split() == ["cancelled", "4"] for line in out.splitlines()), out
    assert any(line.split() == ["(in", "flight)", "2"] for line in out.splitlines()), out
    dial.gate.set()  # type: ignore[union-attr]  # the live calls finish and keep their outcome
    await _until(lambda: gw.campaign_events("campaign.finished"), what="runner finished")
    body = await (await gw.client.get("/api/campaigns/cc", headers=AUTH)).json()
    assert body["totals"]["outcomes"] == {"cancelled": 4, "human": 2}
    assert sum(dial.calls.values()) == 2


async def test_status_pause_resume_cancel_list(harness: Harness, tmp_path: Path) -> None:
    dial = FakeDial(gate=asyncio.Event())
    gw = await harness.gateway(dial)
    csv = _csv(tmp_path, ["+15550000001,a", "+15550000002,b"])
    code, out, err = await _done(
        await _cli("run", csv, "--concurrency", "1", "--id", "ctl", "--no-wait", gw=gw)
    )
    assert (code, out.strip()) == (0, "ctl"), err
    await _until(lambda: dial.live == 1)
    code, out, _ = await _run_here("pause", "ctl", gw=gw)
    assert code == 0 and out.startswith("campaign ctl: paused")
    code, out, _ = await _run_here("status", "ctl", "--json", gw=gw)
    assert code == 0 and '"state": "paused"' in out
    code, out, _ = await _run_here("resume", "ctl", gw=gw)
    assert code == 0 and out.startswith("campaign ctl: running")
    code, out, _ = await _run_here("list", gw=gw)
    assert code == 0 and "ctl" in out and "running" in out
    code, out, _ = await _run_here("cancel", "ctl", gw=gw)
    assert code == 0 and out.startswith("campaign ctl: cancelled")
    code, _, err = await _run_here("resume", "ctl", gw=gw)
    assert code == 1 and "cannot become running" in err
    code, _, err = await _run_here("status", "nope", gw=gw)
    assert code == 1 and "no campaign" in err
    dial.gate.set()  # type: ignore[union-attr]
