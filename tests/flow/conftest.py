"""Building flow agents for the tests: flows from TOML text, services with a webhook client on
a real aiohttp session (closed after the test)."""

from __future__ import annotations

import tomllib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.flow.engine import FlowAgent, FlowServices
from gateway.flow.source import Webhook, WebhookSettings
from gateway.flow.verbs import FlowBook, Limits, parse_book

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_FLOW = ROOT / "gateway" / "flow" / "default.toml"
ACCOUNT_FLOW = ROOT / "deploy" / "flows" / "account.toml"


def book_of(text: str, *, files: Path | None = None, **limits: Any) -> FlowBook:
    return parse_book(tomllib.loads(text), limits=Limits(files=files, **limits))


MakeServices = Callable[..., FlowServices]


@pytest.fixture
async def make_services() -> AsyncIterator[MakeServices]:
    sessions: list[aiohttp.ClientSession] = []

    def session() -> aiohttp.ClientSession:
        if not sessions or sessions[-1].closed:
            sessions.append(aiohttp.ClientSession())
        return sessions[-1]

    def make(
        book: FlowBook | None = None, *, settings: WebhookSettings | None = None, **kw: Any
    ) -> FlowServices:
        limits = Limits(flows=frozenset(book.flows) if book is not None else frozenset())
        kw.setdefault("limits", limits)
        return FlowServices(
            webhook=Webhook(settings or WebhookSettings(), session), book=book, **kw
        )

    yield make
    for s in sessions:
        await s.close()


def agent_of(services: FlowServices, **kw: Any) -> FlowAgent:
    return FlowAgent(services, **kw)
