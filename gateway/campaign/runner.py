"""A small asyncio loop that runs one campaign on one gateway: the :class:`Pacer` says when,
the store hands out a contact (atomically, so other gateways may run the same campaign), and a
``dial`` callable passed in places the call and returns its :class:`DialResult` (the lead passes
the real dialler; tests pass a fake).

Order per dial: claim → ``start_attempt`` (durable, *before* the INVITE) → ``dial`` → record the
outcome and the retry time (:func:`retry_at`). Gateways running the same campaign split its
``max_concurrent`` evenly between them (:func:`gateway.campaign.store.fair_share`). A live call
renews its claim's lease every third of the lease so no other gateway settles it as interrupted.
A 503 with Retry-After (or without: the pacer's default) pauses this gateway's dialling
(RFC 3261 §21.5.4).

Events go to ``emit(name, fields)``: ``campaign.dial``, ``campaign.attempt``,
``campaign.trunk_backoff`` and ``campaign.finished``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.campaign.outcomes import Outcome
from gateway.campaign.pacing import Pacer, retry_at
from gateway.campaign.spec import CampaignSpec
from gateway.campaign.store import (
    Attempt,
    CampaignRecord,
    CampaignState,
    CampaignStore,
    Claim,
    active_dialers,
    fair_share,
)

log = logging.getLogger("voxgate.campaign")


@dataclass(frozen=True, slots=True)
class DialResult:
    outcome: Outcome
    sip_status: int | None = None
    # Seconds, from the Retry-After of a 503 (RFC 3261 §20.33); None: none given.
    retry_after: float | None = None
    voicemail_left: bool = False
    reason: str | None = None


Dial = Callable[[Claim], Awaitable[DialResult]]
Emit = Callable[[str, dict[str, Any]], None]


def _no_events(name: str, fields: dict[str, Any]) -> None:
    pass


class CampaignRunner:
    def __init__(
        self,
        store: CampaignStore,
        campaign_id: str,
        spec: CampaignSpec,
        dial: Dial,
        *,
        owner: str | None = None,
        emit: Emit = _no_events,
        clock: Callable[[], float] = time.time,
        lease_s: float = 120.0,
        poll_s: float = 1.0,
        share_s: float | None = None,
    ) -> None:
        self.store = store
        self.campaign_id = campaign_id
        self.spec = spec
        self.dial = dial
        self.owner = owner or f"gw-{uuid.uuid4().hex[:12]}"
        self.emit = emit
        self.clock = clock
        self.lease_s = lease_s
        self.poll_s = poll_s
        # This runner asks for a claim at least every poll_s while it wants to dial, so three
        # polls without an ask mean it has stopped (see store.fair_share).
        self.share_s = 3.0 * poll_s if share_s is None else share_s
        self.pacer = Pacer(spec.cps, spec.max_concurrent, spec.window)
        self._live: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()

    async def run(self) -> CampaignState:
        """Dial until the campaign is done or cancelled and this gateway's calls have ended;
        returns the final state. Paused: waits, polling the store every ``poll_s``."""
        try:
            while True:
                now = self.clock()
                at = self.pacer.next_dial_at(now)
                if at is None:  # at max_concurrent: a call ending opens the gate
                    await self._sleep(None)
                    continue
                if at > now:
                    # Outside the window or in a trunk hold, possibly for hours: still notice
                    # a cancel made through another gateway or the API.
                    if at - now > self.poll_s and (state := await self._finished()) is not None:
                        return state
                    await self._sleep(min(at - now, self.poll_s))
                    continue
                claim = await self.store.claim(
                    self.campaign_id,
                    self.owner,
                    now,
                    self.lease_s,
                    min_interval_s=self.pacer.interval,
                    max_in_flight=self.spec.max_concurrent,
                    share_s=self.share_s,
                )
                if claim is None:
                    if (state := await self._idle(now)) is not None:
                        return state
                    continue
                await self._start(claim, now)
        finally:
            for task in self._live:
                task.cancel()
            await asyncio.gather(*self._live, return_exceptions=True)

    async def _finished(self) -> CampaignState | None:
        record = await self.store.get(self.campaign_id)
        assert record is not None
        return self._over(record)

    def _over(self, record: CampaignRecord) -> CampaignState | None:
        """The campaign's final state once it is over and this gateway's calls have ended."""
        if record.state in (CampaignState.DONE, CampaignState.CANCELLED) and not self._live:
            self.emit(
                "campaign.finished", {"campaign": self.campaign_id, "state": record.state.value}
            )
            return record.state
        return None

    async def _idle(self, now: float) -> CampaignState | None:
        """No claim now: finished (returns the state), or wait until the next contact is due
        and the campaign-wide gates (another gateway's last dial, a trunk hold) open, a call
        of ours ends, or ``poll_s`` passes, whichever comes first."""
        record = await self.store.get(self.campaign_id)
        assert record is not None
        if (state := self._over(record)) is not None:
            return state
        wake_at = now + self.poll_s
        # At our share of the cap, the next slot is not ours: wait for a call of ours to end
        # (or the next poll) instead of racing the others at every gate.
        share = fair_share(
            self.spec.max_concurrent, active_dialers(record.dialers, now, self.share_s)
        )
        if record.totals.in_flight < self.spec.max_concurrent and len(self._live) < share:
            due = await self.store.next_due(self.campaign_id)
            if due is not None:
                gate = record.hold_until
                if record.last_dial_at is not None:
                    gate = max(gate, record.last_dial_at + self.pacer.interval)
                wake_at = min(wake_at, max(due, gate))
        # A floor against a hot loop when another gateway took the contact we were about to.
        # From the clock now, not ``now``: the store round trips since then would make this
        # gateway wake late at every shared gate and lose every race to the one dialling.
        await self._sleep(max(wake_at - self.clock(), 0.001))
        return None

    async def _start(self, claim: Claim, now: float) -> None:
        """Dial a claimed contact; ``now`` is the claim's time, which the store's cps gate
        recorded as the campaign's last dial."""
        # The local gates may have shut while the claim was in flight (the window closed, a
        # 503 came in): give the contact back untouched.
        later = self.clock()
        if not (self.pacer.may_dial(now) and self.pacer.may_dial(later)):
            nxt = self.pacer.next_dial_at(later)
            await self.store.release(self.campaign_id, claim.index, self.owner, nxt or now)
            return
        # Taken locally before the next await, so a 503 arriving meanwhile cannot find the
        # gates open and shut at once; given back if the store says the claim was lost.
        self.pacer.started(now)
        if not await self.store.start_attempt(self.campaign_id, claim.index, self.owner, now):
            self.pacer.finished()
            return  # the claim was lost (lease expired): another gateway settles it
        self.emit(
            "campaign.dial",
            {
                "campaign": self.campaign_id,
                "contact": claim.index,
                "to": claim.contact.to,
                "attempt": len(claim.attempts) + 1,
                "at": now,
            },
        )
        task = asyncio.create_task(self._call(claim, now), name=f"campaign-dial-{claim.index}")
        self._live.add(task)
        task.add_done_callback(self._live.discard)

    async def _call(self, claim: Claim, started_at: float) -> None:
        renew = asyncio.create_task(self._renew(claim))
        try:
            try:
                result = await self.dial(claim)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("campaign %s: dial to %s failed", self.campaign_id, claim.contact.to)
                result = DialResult(Outcome.FAILED, reason=f"dial error: {exc}")
        finally:
            renew.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renew
        ended = self.clock()
        self.pacer.finished()
        if result.sip_status == 503:
            until = self.pacer.trunk_overloaded(ended, result.retry_after)
            # Shared, so that the other gateways on this campaign hold off too.
            until = await self.store.hold(self.campaign_id, until)
            self.emit(
                "campaign.trunk_backoff",
                {"campaign": self.campaign_id, "until": until, "retry_after": result.retry_after},
            )
        previous = [a.outcome for a in claim.attempts if a.outcome is not None]
        nxt = retry_at(result.outcome, previous, ended, self.spec.retries)
        attempt = Attempt(
            started_at,
            ended,
            result.outcome,
            result.sip_status,
            result.reason,
            result.voicemail_left,
        )
        recorded = await self.store.finish_attempt(
            self.campaign_id, claim.index, self.owner, attempt, nxt
        )
        self.emit(
            "campaign.attempt",
            {
                "campaign": self.campaign_id,
                "contact": claim.index,
                "to": claim.contact.to,
                **attempt.to_json(),
                "retry_at": nxt,
                "recorded": recorded,
            },
        )
        self._wake.set()

    async def _renew(self, claim: Claim) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            until = self.clock() + self.lease_s
            if not await self.store.renew(self.campaign_id, claim.index, self.owner, until):
                log.warning("campaign %s: lost the claim on %s", self.campaign_id, claim.index)
                return

    async def _sleep(self, seconds: float | None) -> None:
        """Sleep ``seconds`` (None: until woken), cut short when a call ends."""
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
