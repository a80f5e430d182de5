"""Flows from a webhook: a real aiohttp server in the test answers verbs, checks every
request's HMAC signature, and gets each verb's result at its ``action`` URL; bad answers
(garbage, slow, 5xx retried then given up, 4xx, oversized, verbs that do not fit the schema)
each make the caller hear the fallback line, end the call cleanly and report
``flow_webhook_<kind>``."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import time
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.call.control import AgentError
from gateway.flow.engine import FlowAgent
from gateway.flow.source import SIGNATURE_HEADER, WebhookSettings, sign, verify_signature
from tests.flow.callsim import AudioSimCall, SimCall
from tests.flow.conftest import MakeServices, book_of
from tests.waiting import wait_for

SECRET = b"flow-test-secret"
FALLBACK = "Sorry, something went wrong. Goodbye."


@dataclass
class Hook:
    """The test's webhook server: what it was sent, and whether each was signed right."""

    base: str = ""
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    signed: list[bool] = field(default_factory=list)
    hits: dict[str, int] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return self.base + path

    def payloads(self, path: str) -> list[dict[str, Any]]:
        return [p for name, p in self.requests if name == path]


def wav_bytes(seconds: float = 0.1, rate: int = 8000) -> bytes:
    pcm = (np.sin(np.arange(int(seconds * rate)) * 0.3) * 5000).astype(np.int16)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return out.getvalue()


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    h = Hook()

    async def handle(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        h.hits[name] = h.hits.get(name, 0) + 1
        body = await request.read()
        ok = verify_signature(SECRET, request.headers.get(SIGNATURE_HEADER, ""), body)
        h.signed.append(ok)
        if not ok:
            return web.Response(status=401)
        payload = json.loads(body) if body else {}
        h.requests.append((name, payload))
        if name == "start":
            return web.json_response([
                {"say": "Hello {caller}, this is {vars_from_hook}."},
                {"gather": {"num_digits": 2, "say": "Enter two digits.",
                            "action": h.url("/digits")}},
                {"say": "Not reached: the action's verbs replace these."},
            ])  # fmt: skip
        if name == "digits":
            digits = payload["result"]["digits"]
            return web.json_response([{"say": f"You pressed {digits}."}, {"hangup": {}}])
        if name == "jambonz":
            return web.json_response([
                {"verb": "say", "text": "Flat verbs too."},
                {"verb": "redirect", "flow": "menu"},
            ])  # fmt: skip
        if name == "empty":
            return web.Response(status=204)
        if name == "transferred":
            return web.json_response([{"say": "Nothing left to say this to."}])
        if name == "garbage":
            return web.Response(text="<Response><Say>TwiML is not JSON</Say></Response>")
        if name == "object":
            return web.json_response({"verbs": []})
        if name == "invalid":
            return web.json_response([{"say": "ok"}, {"gather": {"num_digits": "two"}}])
        if name == "slow":
            await asyncio.sleep(3)
            return web.json_response([{"say": "Too late."}])
        if name == "error":
            return web.Response(status=503)
        if name == "flaky":  # fails twice, then answers
            if h.hits[name] <= 2:
                return web.Response(status=500)
            return web.json_response([{"say": "Third time lucky."}])
        if name == "missing":
            return web.Response(status=404)
        if name == "big":
            return web.json_response([{"say": "x" * 100}] * 100)  # ~11 kB
        if name == "stream-big":  # no Content-Length: cut off while reading
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for _ in range(20):
                await resp.write(b" " * 1024)
            await resp.write_eof()
            return resp
        if name == "hold.wav":
            return web.Response(body=wav_bytes(), content_type="audio/wav")
        return web.Response(status=404)

    app = web.Application()
    app.router.add_route("*", "/{name}", handle)
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    h.base = str(srv.make_url("")).rstrip("/")
    yield h
    await srv.close()


def settings(**kw: Any) -> WebhookSettings:
    base: dict[str, Any] = {"timeout_s": 0.5, "retries": 2, "max_response_bytes": 4096,
                            "secret": SECRET, "backoff_s": 0.01}  # fmt: skip
    return WebhookSettings(**(base | kw))


async def call_for(services: Any, *, url: str, audio: bool = False, **kw: Any) -> SimCall:
    agent = FlowAgent(services, url=url, **kw)
    call = (AudioSimCall if audio else SimCall)(agent)
    await call.start()
    return call


def kinds(call: SimCall) -> list[str]:
    return [e.kind for e in call.events if isinstance(e, AgentError)]


# --- the happy path -----------------------------------------------------------------------------
async def test_verbs_from_the_webhook_and_results_to_the_action(
    hook: Hook, make_services: MakeServices
) -> None:
    services = make_services(settings=settings())
    call = await call_for(services, url=hook.url("/start"),
                          variables={"vars_from_hook": "the test"})  # fmt: skip
    await wait_for(lambda: call.texts == ["Hello caller, this is the test.", "Enter two digits."])
    (start,) = hook.payloads("start")
    assert start["event"] == "start"
    assert {k: start[k] for k in ("call_id", "caller", "callee", "caller_uri", "direction",
                                  "leg")} == {
        "call_id": "call-1", "caller": "caller", "callee": "agent",
        "caller_uri": "sip:caller@example.com", "direction": "inbound", "leg": "sip",
    }  # fmt: skip
    assert start["vars"] == {"vars_from_hook": "the test"}
    await call.keys("42")
    await wait_for(lambda: call.texts[-1] == "You pressed 42.", timeout=3)
    (digits,) = hook.payloads("digits")
    assert digits["event"] == "action" and digits["verb"] == "gather"
    assert digits["path"] == "webhook[1].gather"
    assert digits["result"] == {"reason": "num_digits", "digits": "42", "speech": ""}
    assert digits["vars"]["digits"] == "42"
    assert "Not reached: the action's verbs replace these." not in call.texts
    await call.finish_all()
    await wait_for(lambda: call.hangups == ["flow"], timeout=3)
    await call.close_call()
    assert hook.signed == [True, True]
    assert kinds(call) == []


async def test_the_signature_is_hmac_over_timestamp_and_body() -> None:
    body = b'{"event":"start"}'
    header = sign(SECRET, body, 1700000000)
    import hashlib
    import hmac

    mac = hmac.new(SECRET, b"1700000000." + body, hashlib.sha256).hexdigest()
    assert header == f"t=1700000000,v1={mac}"
    assert verify_signature(SECRET, header, body, now=1700000100)
    assert not verify_signature(SECRET, header, body + b" ", now=1700000100)  # body changed
    assert not verify_signature(b"other", header, body, now=1700000100)  # wrong secret
    assert not verify_signature(SECRET, header, body, now=1700000000 + 301)  # replayed late
    assert not verify_signature(SECRET, "v1=" + mac, body, now=time.time())  # no timestamp


async def test_a_wrong_secret_is_refused_by_the_server(
    hook: Hook, make_services: MakeServices
) -> None:
    services = make_services(settings=settings(secret=b"not the secret"), fallback=FALLBACK)
    call = await call_for(services, url=hook.url("/start"))
    await wait_for(lambda: call.texts == [FALLBACK])
    assert kinds(call) == ["flow_webhook_status"]
    assert hook.signed == [False]
    await call.close_call()


async def test_jambonz_form_and_redirect_into_the_file(
    hook: Hook, make_services: MakeServices
) -> None:
    book = book_of('start = "menu"\n[[flows.menu]]\nsay = "The file\'s menu."\n')
    call = await call_for(make_services(book, settings=settings()), url=hook.url("/jambonz"))
    await wait_for(lambda: call.texts == ["Flat verbs too.", "The file's menu."])
    await call.close_call()


async def test_an_empty_action_answer_lets_the_flow_go_on(
    hook: Hook, make_services: MakeServices
) -> None:
    text = f"""
        [[flows.main]]
        gather = {{ num_digits = 1, action = "{hook.url("/empty")}" }}
        [[flows.main]]
        say = "Went on with {{digits}}."
    """
    call = await call_for(make_services(book_of(text), settings=settings()), url="")
    await call.key("7")
    await wait_for(lambda: call.texts == ["Went on with 7."])
    assert hook.payloads("empty")[0]["result"]["digits"] == "7"
    await call.close_call()


async def test_a_transfers_outcome_goes_to_its_action(
    hook: Hook, make_services: MakeServices
) -> None:
    text = f"""
        [[flows.main]]
        transfer = {{ target = "sip:desk@pbx", action = "{hook.url("/transferred")}" }}
        [[flows.main]]
        say = "Not reached."
    """
    call = await call_for(make_services(book_of(text), settings=settings()), url="")
    await wait_for(lambda: bool(hook.payloads("transferred")))
    (sent,) = hook.payloads("transferred")
    assert sent["verb"] == "transfer" and sent["result"] == {
        "result": "completed",
        "status": 202,
        "reason": "accepted",
        "target": "sip:desk@pbx",
    }
    await call.settle()
    assert call.texts == []  # the call is the far end's now: the answer is not acted on
    await call.close_call()


async def test_a_retried_5xx_then_an_answer(hook: Hook, make_services: MakeServices) -> None:
    call = await call_for(make_services(settings=settings()), url=hook.url("/flaky"))
    await wait_for(lambda: call.texts == ["Third time lucky."])
    assert hook.hits["flaky"] == 3
    await call.close_call()


async def test_play_by_url_is_fetched_once(hook: Hook, make_services: MakeServices) -> None:
    text = f"""
        [[flows.main]]
        play = "{hook.url("/hold.wav")}"
        [[flows.main]]
        play = "{hook.url("/hold.wav")}"
    """
    services = make_services(book_of(text), settings=settings())
    call = await call_for(services, url="", audio=True)
    assert isinstance(call, AudioSimCall)
    await wait_for(lambda: len(call.played) == 2)
    assert [(n, r) for _, n, r in call.played] == [(800, 8000), (800, 8000)]
    assert hook.hits["hold.wav"] == 1  # cached for the next verb and the next call
    await call.close_call()


# --- bad answers --------------------------------------------------------------------------------
BAD_ANSWERS = {
    "garbage": ("flow_webhook_malformed", "not JSON", 1),
    "object": ("flow_webhook_malformed", "expected a JSON array of verbs", 1),
    "invalid": ("flow_webhook_invalid", "webhook[1].gather.num_digits: must be an integer", 1),
    "slow": ("flow_webhook_timeout", "no answer within 0.5 s", 1),
    "error": ("flow_webhook_status", "answered 503 (after 3 attempts)", 3),
    "missing": ("flow_webhook_status", "answered 404", 1),
    "big": ("flow_webhook_too_large", "the limit is 4096", 1),
    "stream-big": ("flow_webhook_too_large", "over the limit of 4096 bytes", 1),
}


@pytest.mark.parametrize("name", list(BAD_ANSWERS))
async def test_bad_answers_say_the_fallback_and_end_the_call(
    name: str, hook: Hook, make_services: MakeServices
) -> None:
    kind, message, attempts = BAD_ANSWERS[name]
    services = make_services(settings=settings(), fallback=FALLBACK)
    call = await call_for(services, url=hook.url(f"/{name}"))
    await wait_for(lambda: call.texts == [FALLBACK], timeout=5)
    (err,) = [e for e in call.events if isinstance(e, AgentError)]
    assert err.kind == kind and message in err.message, err
    assert hook.hits[name] == attempts
    assert call.keys_cut[call.ids[0]] is False  # the fallback is heard whole
    assert call.hangups == []  # not before the caller has heard it
    await call.finish()
    await wait_for(lambda: call.hangups == ["flow error"], timeout=3)
    await call.close_call()


async def test_an_unreachable_webhook_is_retried_then_given_up(make_services: MakeServices) -> None:
    with socket.socket() as s:  # free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    services = make_services(settings=settings(), fallback=FALLBACK)
    call = await call_for(services, url=f"http://127.0.0.1:{port}/start")
    await wait_for(lambda: call.texts == [FALLBACK], timeout=5)
    (err,) = [e for e in call.events if isinstance(e, AgentError)]
    assert err.kind == "flow_webhook_unreachable" and "after 3 attempts" in err.message
    assert services.webhook.requests == 3
    await call.close_call()


async def test_a_bad_action_answer_mid_call(hook: Hook, make_services: MakeServices) -> None:
    text = f"""
        [[flows.main]]
        gather = {{ num_digits = 1, say = "Press a key.", action = "{hook.url("/garbage")}" }}
    """
    services = make_services(book_of(text), settings=settings(), fallback=FALLBACK)
    call = await call_for(services, url="")
    await call.key("3")
    await wait_for(lambda: call.texts[-1] == FALLBACK, timeout=3)
    assert kinds(call) == ["flow_webhook_malformed"]
    await call.close_call()
