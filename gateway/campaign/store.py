"""Durable campaign state, behind one interface with two implementations: Redis
(:mod:`gateway.campaign.redis_store`, the bus's Redis) and SQLite
(:mod:`gateway.campaign.sqlite_store`, a local file for ``voxgate serve`` without Redis).

The one property everything rests on: **a contact is claimed atomically before it is dialled.**
:meth:`CampaignStore.claim` hands a due contact to exactly one owner (a gateway's id) with a
lease; several stores over the same Redis or the same SQLite file never hand out the same
contact twice. The life of a claim:

1. ``claim`` — the contact leaves the due set; nobody has been called yet;
2. ``start_attempt`` — recorded *before* the INVITE is sent: from here on somebody may be ringing;
3. ``finish_attempt`` — the outcome is recorded, the claim released, and the contact either
   goes back to the due set (a retry, at ``next_attempt_at``) or gets its final outcome.
   (``release`` gives back a claim that was never started, e.g. the window closed.)

**Restart semantics** (:meth:`CampaignStore.recover`): a claim whose owner died is found when
its lease has expired (or at once, when a restarted gateway recovers its own owner id). If its
attempt never started, nobody was called and the contact is re-queued. If its attempt started but
no outcome was recorded, the call may well have reached the person: it is **not** re-dialled
blindly; that attempt is closed as ``failed`` with reason ``"interrupted"`` and the contact's
final outcome is ``failed``. Calling somebody twice is the failure the issue forbids; losing one
call to a crash is the lesser harm, and it is visible in the record. A live call must therefore
renew its lease (:meth:`CampaignStore.renew`) before it runs out.

**Several gateways on one campaign** share its pacing gates (cps, a trunk hold, the in-flight
cap), all checked inside the claim. The in-flight cap is also *shared out*: an owner that asked
for a claim within the last ``share_s`` seconds is dialling the campaign, and while ``n`` owners
are, none may hold more than ``ceil(max_in_flight / n)`` claims (:func:`fair_share`). Without
that, the gateway whose own call just ended is always first to ask for the freed slot (it is
woken by the hang-up; the others only poll), so the first gateway to fill the cap keeps it and
the others never dial. An owner that stops asking (it died, or its window closed) drops out
after ``share_s`` and the rest may use its part of the cap again.

States: ``running`` ⇄ ``paused``; either → ``cancelled`` (pending contacts get the final outcome
``cancelled``; live calls finish and keep their outcome, without retries); ``running``/``paused``
→ ``done`` by itself when no contact is pending or in flight.
"""

from __future__ import annotations

import abc
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from gateway.campaign.contacts import Contact
from gateway.campaign.outcomes import Outcome

INTERRUPTED = "interrupted"


class CampaignState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    CANCELLED = "cancelled"
    DONE = "done"


# Allowed moves by request (``done`` is reached by itself, never requested).
TRANSITIONS: Mapping[CampaignState, frozenset[CampaignState]] = {
    CampaignState.RUNNING: frozenset({CampaignState.PAUSED, CampaignState.CANCELLED}),
    CampaignState.PAUSED: frozenset({CampaignState.RUNNING, CampaignState.CANCELLED}),
    CampaignState.CANCELLED: frozenset(),
    CampaignState.DONE: frozenset(),
}


class StoreError(Exception):
    """A store operation refused (unknown campaign, duplicate id, bad state transition)."""


class UnknownCampaign(StoreError):
    pass


class BadTransition(StoreError):
    def __init__(self, current: CampaignState, wanted: CampaignState) -> None:
        self.current = current
        self.wanted = wanted
        super().__init__(f"campaign is {current}: cannot become {wanted}")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One dial attempt; ``ended_at``/``outcome`` stay None while it is live."""

    started_at: float
    ended_at: float | None = None
    outcome: Outcome | None = None
    sip_status: int | None = None
    reason: str | None = None
    voicemail_left: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "outcome": None if self.outcome is None else self.outcome.value,
            "sip_status": self.sip_status,
            "reason": self.reason,
            "voicemail_left": self.voicemail_left,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Attempt:
        outcome = obj.get("outcome")
        status = obj.get("sip_status")
        ended = obj.get("ended_at")
        return cls(
            started_at=float(obj["started_at"]),
            ended_at=None if ended is None else float(ended),
            outcome=None if outcome is None else Outcome(outcome),
            sip_status=None if status is None else int(status),
            reason=obj.get("reason"),
            voicemail_left=bool(obj.get("voicemail_left", False)),
        )


@dataclass(frozen=True, slots=True)
class ContactRecord:
    index: int
    to: str
    vars: Mapping[str, str]
    attempts: tuple[Attempt, ...] = ()
    next_attempt_at: float = 0.0
    final: Outcome | None = None
    owner: str | None = None
    lease_until: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "to": self.to,
            "vars": dict(self.vars),
            "attempts": [a.to_json() for a in self.attempts],
            "next_attempt_at": None if self.final is not None else self.next_attempt_at,
            "outcome": None if self.final is None else self.final.value,
            "claimed_by": self.owner,
        }


@dataclass(frozen=True, slots=True)
class Claim:
    """A contact handed to ``owner`` until ``lease_until``; ``attempts`` are its earlier ones."""

    campaign_id: str
    index: int
    contact: Contact
    owner: str
    lease_until: float
    attempts: tuple[Attempt, ...] = ()


@dataclass(frozen=True, slots=True)
class Totals:
    contacts: int = 0
    pending: int = 0
    in_flight: int = 0
    attempts: int = 0
    # Final outcome -> number of contacts that ended with it.
    outcomes: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "contacts": self.contacts,
            "pending": self.pending,
            "in_flight": self.in_flight,
            "attempts": self.attempts,
            "outcomes": dict(self.outcomes),
        }


@dataclass(frozen=True, slots=True)
class CampaignRecord:
    id: str
    spec: Mapping[str, Any]
    state: CampaignState
    created_at: float
    totals: Totals
    # The campaign-wide pacing gates (see :meth:`CampaignStore.claim`): when the last contact
    # was claimed for dialling, and until when a trunk 503 holds all dialling.
    last_dial_at: float | None = None
    hold_until: float = 0.0
    # Owner -> when it last asked for a claim with a ``share_s`` (see :func:`fair_share`).
    dialers: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "spec": dict(self.spec),
            "state": self.state.value,
            "created_at": self.created_at,
            "totals": self.totals.to_json(),
            "last_dial_at": self.last_dial_at,
            "hold_until": self.hold_until,
            "dialers": dict(self.dialers),
        }


@dataclass(frozen=True, slots=True)
class Recovered:
    """What :meth:`CampaignStore.recover` did: contact indexes re-queued and closed."""

    requeued: tuple[int, ...] = ()
    interrupted: tuple[int, ...] = ()


class CampaignStore(abc.ABC):
    """The durable state of campaigns. All times are epoch seconds passed in by the caller."""

    @abc.abstractmethod
    async def create(
        self, campaign_id: str, spec: Mapping[str, Any], contacts: Sequence[Contact], now: float
    ) -> CampaignRecord:
        """Store a new running campaign; :class:`StoreError` if the id exists."""

    @abc.abstractmethod
    async def get(self, campaign_id: str) -> CampaignRecord | None: ...

    @abc.abstractmethod
    async def campaign_ids(self) -> list[str]: ...

    @abc.abstractmethod
    async def contacts(self, campaign_id: str) -> list[ContactRecord]: ...

    @abc.abstractmethod
    async def set_state(self, campaign_id: str, state: CampaignState) -> CampaignState:
        """Pause, resume or cancel; returns the previous state. :class:`BadTransition` if not
        allowed; asking for the current state is a no-op."""

    @abc.abstractmethod
    async def claim(
        self,
        campaign_id: str,
        owner: str,
        now: float,
        lease_s: float,
        *,
        min_interval_s: float = 0.0,
        max_in_flight: int | None = None,
        share_s: float | None = None,
    ) -> Claim | None:
        """Atomically claim one due contact (``next_attempt_at <= now``) of a running campaign,
        after recovering expired claims; None when there is none or a campaign-wide gate is
        shut. The gates make pacing hold across gateways sharing the campaign: at least
        ``min_interval_s`` (1/cps) since the last claim of any gateway, ``now`` not before a
        trunk hold (:meth:`hold`), and fewer than ``max_in_flight`` contacts claimed in all.
        With ``share_s``, the ask is recorded (``dialers``) and ``owner`` may hold no more
        than its :func:`fair_share` of ``max_in_flight``.
        A successful claim is the dial's time: ``last_dial_at`` becomes ``now``."""

    @abc.abstractmethod
    async def hold(self, campaign_id: str, until: float) -> float:
        """Hold all dialling of the campaign, on every gateway, until ``until`` (a trunk 503;
        a shorter hold never cuts a longer one short); returns the hold's end."""

    @abc.abstractmethod
    async def start_attempt(self, campaign_id: str, index: int, owner: str, now: float) -> bool:
        """Record that dialling starts now (before the INVITE); False if ``owner`` lost the
        claim (then it must not dial)."""

    @abc.abstractmethod
    async def renew(self, campaign_id: str, index: int, owner: str, lease_until: float) -> bool:
        """Extend a live claim; False if ``owner`` no longer holds it."""

    @abc.abstractmethod
    async def finish_attempt(
        self,
        campaign_id: str,
        index: int,
        owner: str,
        attempt: Attempt,
        next_attempt_at: float | None,
    ) -> bool:
        """Record the ended ``attempt`` and release the claim: re-queue at ``next_attempt_at``,
        or (None, or the campaign was cancelled) make its outcome final. False if ``owner`` no
        longer holds the claim (nothing is written)."""

    @abc.abstractmethod
    async def release(
        self, campaign_id: str, index: int, owner: str, next_attempt_at: float
    ) -> bool:
        """Give back a claim that was never started; False if not held or already started."""

    @abc.abstractmethod
    async def recover(self, campaign_id: str, now: float, owner: str | None = None) -> Recovered:
        """Settle claims whose lease expired before ``now`` (or, with ``owner``, all of that
        owner's claims: a restarted gateway with a stable id): re-queue the never-started ones,
        close started ones as ``failed``/``interrupted`` (see the module docstring)."""

    @abc.abstractmethod
    async def next_due(self, campaign_id: str) -> float | None:
        """The earliest ``next_attempt_at`` of the pending (unclaimed, not final) contacts."""

    @abc.abstractmethod
    async def close(self) -> None: ...


def active_dialers(dialers: Mapping[str, float], now: float, share_s: float) -> int:
    """How many owners asked for a claim within ``share_s`` of ``now`` (at least 1: the one
    asking counts itself)."""
    return max(1, sum(1 for seen in dialers.values() if seen >= now - share_s))


def fair_share(max_in_flight: int, active: int) -> int:
    """The most claims one of ``active`` owners may hold: the cap split evenly, rounded up so
    that the shares add up to at least the cap (the cap itself still holds in all)."""
    return math.ceil(max_in_flight / max(1, active))


def check_transition(current: CampaignState, wanted: CampaignState) -> None:
    if wanted != current and wanted not in TRANSITIONS[current]:
        raise BadTransition(current, wanted)
