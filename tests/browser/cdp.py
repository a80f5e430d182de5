"""Headless Chromium driven over the DevTools protocol (no Node.js, no Playwright): enough to
open a page, run script in it and read the result."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.get_running_loop().create_task(self._read())
        self.console: list[str] = []

    async def send(self, method: str, **params: object) -> dict[str, Any]:
        msg_id = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = fut
        await self._ws.send_str(json.dumps({"id": msg_id, "method": method, "params": params}))
        reply = await asyncio.wait_for(fut, 30)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return dict(reply.get("result", {}))

    async def eval(self, expression: str) -> Any:
        """Evaluate in the page (promises awaited, as a user gesture); return the JSON value."""
        result = await self.send(
            "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True,
            userGesture=True,
        )  # fmt: skip
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait(self, expression: str, timeout: float = 15.0) -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            value = await self.eval(expression)
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"page never satisfied: {expression}")
            await asyncio.sleep(0.05)

    async def _read(self) -> None:
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(msg.data)
            fut = self._pending.pop(data.get("id", -1), None)
            if fut is not None and not fut.done():
                fut.set_result(data)
            elif data.get("method") == "Runtime.consoleAPICalled":
                args = data["params"].get("args", [])
                self.console.append(" ".join(str(a.get("value", "")) for a in args))


class Browser:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, profile: str) -> None:
        self.proc = proc
        self.port = port
        self.profile = profile

    def kill(self) -> None:
        """Vanish like a crashed browser: no hang-up, no close, nothing more on the wire."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    @contextlib.asynccontextmanager
    async def page(self, url: str) -> AsyncIterator[Page]:
        async with aiohttp.ClientSession() as http:
            async with http.put(f"http://127.0.0.1:{self.port}/json/new?{url}") as r:
                target = await r.json(content_type=None)
            async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.send("Runtime.enable")
                # The new tab starts on about:blank; wait until it has loaded the URL.
                await page.wait(
                    f"location.href.startsWith({json.dumps(url)}) && "
                    "document.readyState === 'complete'"
                )
                try:
                    yield page
                finally:
                    page._reader.cancel()


@contextlib.asynccontextmanager
async def chromium(*, fake_audio: Path | None = None) -> AsyncIterator[Browser]:
    exe = chromium_path()
    if exe is None:
        raise RuntimeError("chromium is not installed (make test installs it)")
    profile = tempfile.mkdtemp(prefix="voxgate-chromium-")
    args = [
        exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--remote-debugging-port=0", f"--user-data-dir={profile}",
        "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        "--autoplay-policy=no-user-gesture-required",
        # Real host addresses in ICE candidates (a granted microphone gives the same).
        "--disable-features=WebRtcHideLocalIpsWithMdns",
        "about:blank",
    ]  # fmt: skip
    if fake_audio is not None:
        args.insert(-1, f"--use-file-for-fake-audio-capture={fake_audio}")
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    browser: Browser | None = None
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and port_file.read_text().strip():
                break
            if proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {proc.returncode}")
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError("chromium did not open its DevTools port")
        port = int(port_file.read_text().split()[0])
        browser = Browser(proc, port, profile)
        yield browser
    finally:
        if proc.poll() is None:
            (browser or Browser(proc, 0, profile)).kill()
        shutil.rmtree(profile, ignore_errors=True)
