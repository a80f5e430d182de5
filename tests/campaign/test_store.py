"""The campaign store on a real Redis and on SQLite: atomic claims across instances, restart
semantics, retries, and pause/resume/cancel."""

from __future__ import annotations

import asyncio

import pytest

from gateway.campaign.contacts import Contact
from gateway.campaign.outcomes import Outcome
from gateway.campaign.store import (
    INTERRUPTED,
    Attempt,
    BadTransition,
    CampaignState,
    CampaignStore,
    StoreError,
    UnknownCampaign,
    active_dialers,
    fair_share,
)
from tests.campaign.conftest import StoreFactory

SPEC = {"agent": {"kind": "ivr"}, "cps": 1.0, "max_concurrent": 5}
T0 = 1_800_000_000.0


def _contacts(n: int) -> list[Contact]:
    return [Contact(f"+1555{i:07d}", {"i": str(i)}) for i in range(n)]


async def _dial_to_the_end(store: CampaignStore, cid: str, owner: str, outcome: Outcome) -> int:
    """Claim, start and finish every due contact with ``outcome`` (final); returns the count."""
    n = 0
    while (c := await store.claim(cid, owner, T0, 60)) is not None:
        assert await store.start_attempt(cid, c.index, owner, T0)
        attempt = Attempt(T0, T0 + 1, outcome)
        assert await store.finish_attempt(cid, c.index, owner, attempt, None)
        n += 1
    return n


async def test_create_get_and_a_full_run(make_store: StoreFactory) -> None:
    store = make_store()
    rec = await store.create("c1", SPEC, _contacts(3), T0)
    assert rec.state == CampaignState.RUNNING and rec.spec == SPEC
    assert rec.totals.contacts == 3 and rec.totals.pending == 3 and rec.totals.in_flight == 0
    with pytest.raises(StoreError):
        await store.create("c1", SPEC, _contacts(1), T0)
    assert await store.get("nope") is None
    assert await store.campaign_ids() == ["c1"]

    claim = await store.claim("c1", "gw-a", T0, 60)
    assert claim is not None and claim.contact == _contacts(3)[claim.index]
    assert claim.attempts == ()
    mid = await store.get("c1")
    assert mid is not None and mid.totals.in_flight == 1 and mid.totals.pending == 2
    assert await store.start_attempt("c1", claim.index, "gw-a", T0 + 1)
    assert not await store.start_attempt("c1", claim.index, "gw-a", T0 + 1)  # once
    done = Attempt(T0 + 1, T0 + 9, Outcome.MACHINE, 200, voicemail_left=True)
    assert await store.finish_attempt("c1", claim.index, "gw-a", done, None)
    assert await _dial_to_the_end(store, "c1", "gw-a", Outcome.HUMAN) == 2

    end = await store.get("c1")
    assert end is not None and end.state == CampaignState.DONE
    assert end.totals.outcomes == {"human": 2, "machine": 1}
    assert end.totals.attempts == 3 and end.totals.pending == 0 and end.totals.in_flight == 0
    records = await store.contacts("c1")
    assert [r.to for r in records] == [c.to for c in _contacts(3)]
    assert records[claim.index].attempts == (done,)
    assert records[claim.index].final == Outcome.MACHINE
    assert records[claim.index].to_json()["attempts"][0]["voicemail_left"] is True


async def test_concurrent_claims_from_two_instances_never_share_a_contact(
    make_store: StoreFactory,
) -> None:
    a, b = make_store(), make_store()
    await a.create("c", SPEC, _contacts(40), T0)
    claims = await asyncio.gather(
        *(s.claim("c", f"gw-{n % 2}", T0, 60) for n, s in enumerate([a, b] * 30))
    )
    got = [c.index for c in claims if c is not None]
    assert sorted(got) == list(range(40))  # every contact once, 20 calls came back empty
    assert sum(c is None for c in claims) == 20
    rec = await b.get("c")
    assert rec is not None and rec.totals.in_flight == 40 and rec.totals.pending == 0


async def test_two_gateways_run_a_campaign_and_call_everybody_once(
    make_store: StoreFactory,
) -> None:
    a, b = make_store(), make_store()
    await a.create("c", SPEC, _contacts(30), T0)
    na, nb = await asyncio.gather(
        _dial_to_the_end(a, "c", "gw-a", Outcome.HUMAN),
        _dial_to_the_end(b, "c", "gw-b", Outcome.HUMAN),
    )
    assert na + nb == 30
    records = await a.contacts("c")
    assert all(len(r.attempts) == 1 and r.final == Outcome.HUMAN for r in records)


async def test_a_retry_is_due_at_its_time_and_keeps_its_history(make_store: StoreFactory) -> None:
    store = make_store()
    await store.create("c", SPEC, _contacts(1), T0)
    claim = await store.claim("c", "gw", T0, 60)
    assert claim is not None
    assert await store.start_attempt("c", 0, "gw", T0)
    busy = Attempt(T0, T0 + 2, Outcome.BUSY, 486)
    assert await store.finish_attempt("c", 0, "gw", busy, T0 + 300)
    assert await store.next_due("c") == T0 + 300
    assert await store.claim("c", "gw", T0 + 299, 60) is None
    again = await store.claim("c", "gw", T0 + 300, 60)
    assert again is not None and again.attempts == (busy,)
    assert await store.start_attempt("c", 0, "gw", T0 + 300)
    assert await store.finish_attempt(
        "c", 0, "gw", Attempt(T0 + 300, T0 + 310, Outcome.HUMAN, 200), None
    )
    rec = await store.get("c")
    assert rec is not None and rec.state == CampaignState.DONE and rec.totals.attempts == 2
    [record] = await store.contacts("c")
    assert [a.outcome for a in record.attempts] == [Outcome.BUSY, Outcome.HUMAN]
    assert record.attempts[0].sip_status == 486


async def test_restart_requeues_unstarted_claims_and_closes_started_ones(
    make_store: StoreFactory,
) -> None:
    """Gateway A claims two contacts, starts dialling one, and dies. Its claims are settled when
    the lease runs out: the unstarted one is dialled by B; the started one is never re-dialled
    (it may have rung) and ends as failed/interrupted."""
    a = make_store()
    await a.create("c", SPEC, _contacts(3), T0)
    c1 = await a.claim("c", "gw-a", T0, 30)
    c2 = await a.claim("c", "gw-a", T0, 30)
    assert c1 is not None and c2 is not None
    assert await a.start_attempt("c", c1.index, "gw-a", T0 + 1)
    await a.close()  # the crash

    b = make_store()  # the restarted gateway (a new owner id)
    # Before the lease expires nothing moves: A might still be alive.
    third = await b.claim("c", "gw-b", T0 + 10, 30)
    assert third is not None and third.index not in (c1.index, c2.index)
    assert await b.claim("c", "gw-b", T0 + 10, 30) is None
    rec = await b.get("c")
    assert rec is not None and rec.totals.in_flight == 3

    requeued = await b.claim("c", "gw-b", T0 + 31, 30)  # A's leases ran out at T0 + 30
    assert requeued is not None and requeued.index == c2.index
    assert await b.claim("c", "gw-b", T0 + 31, 30) is None
    records = await b.contacts("c")
    interrupted = records[c1.index]
    assert interrupted.final == Outcome.FAILED
    assert len(interrupted.attempts) == 1
    assert interrupted.attempts[0].reason == INTERRUPTED
    assert interrupted.attempts[0].started_at == T0 + 1
    # A, if it was only slow, cannot record over the settled claim.
    late = Attempt(T0 + 1, T0 + 40, Outcome.HUMAN, 200)
    assert not await b.finish_attempt("c", c1.index, "gw-a", late, None)
    assert not await b.start_attempt("c", c2.index, "gw-a", T0 + 40)


async def test_a_restarted_gateway_recovers_its_own_claims_at_once(
    make_store: StoreFactory,
) -> None:
    a = make_store()
    await a.create("c", SPEC, _contacts(2), T0)
    c1 = await a.claim("c", "gw-1", T0, 3600)
    c2 = await a.claim("c", "gw-1", T0, 3600)
    assert c1 is not None and c2 is not None
    assert await a.start_attempt("c", c2.index, "gw-1", T0)
    b = make_store()
    got = await b.recover("c", T0 + 5, owner="gw-1")
    assert got.requeued == (c1.index,) and got.interrupted == (c2.index,)
    again = await b.claim("c", "gw-1", T0 + 5, 60)
    assert again is not None and again.index == c1.index
    assert (await b.recover("c", T0 + 6, owner="gw-other")).requeued == ()


async def test_renew_keeps_a_long_call_claimed(make_store: StoreFactory) -> None:
    store = make_store()
    await store.create("c", SPEC, _contacts(1), T0)
    claim = await store.claim("c", "gw", T0, 30)
    assert claim is not None and await store.start_attempt("c", 0, "gw", T0)
    assert await store.renew("c", 0, "gw", T0 + 90)
    assert not await store.renew("c", 0, "gw-other", T0 + 900)
    assert (await store.recover("c", T0 + 60)).interrupted == ()
    assert await store.finish_attempt("c", 0, "gw", Attempt(T0, T0 + 80, Outcome.HUMAN, 200), None)


async def test_release_gives_back_an_unstarted_claim(make_store: StoreFactory) -> None:
    store = make_store()
    await store.create("c", SPEC, _contacts(1), T0)
    claim = await store.claim("c", "gw", T0, 30)
    assert claim is not None
    assert not await store.release("c", 0, "gw-other", T0 + 100)
    assert await store.release("c", 0, "gw", T0 + 100)  # e.g. the window closed
    assert await store.next_due("c") == T0 + 100
    claim = await store.claim("c", "gw", T0 + 100, 30)
    assert claim is not None and await store.start_attempt("c", 0, "gw", T0 + 100)
    assert not await store.release("c", 0, "gw", T0 + 200)  # started: must be finished


async def test_pause_resume_cancel(make_store: StoreFactory) -> None:
    a, b = make_store(), make_store()
    await a.create("c", SPEC, _contacts(4), T0)
    live = await a.claim("c", "gw", T0, 60)
    assert live is not None and await a.start_attempt("c", live.index, "gw", T0)

    assert await b.set_state("c", CampaignState.PAUSED) == CampaignState.RUNNING
    assert await a.claim("c", "gw", T0, 60) is None  # paused: no new dials, on any gateway
    assert await a.set_state("c", CampaignState.PAUSED) == CampaignState.PAUSED  # no-op
    assert await a.set_state("c", CampaignState.RUNNING) == CampaignState.PAUSED
    second = await a.claim("c", "gw", T0, 60)
    assert second is not None

    assert await b.set_state("c", CampaignState.CANCELLED) == CampaignState.RUNNING
    assert await a.claim("c", "gw", T0, 60) is None
    # Live calls finish and keep their outcome, with no retry even if one was asked for.
    busy = Attempt(T0, T0 + 3, Outcome.BUSY, 486)
    assert await a.finish_attempt("c", live.index, "gw", busy, T0 + 300)
    assert await a.release("c", second.index, "gw", T0)
    rec = await a.get("c")
    assert rec is not None and rec.state == CampaignState.CANCELLED
    assert rec.totals.outcomes == {"busy": 1, "cancelled": 3}
    assert rec.totals.pending == 0 and rec.totals.in_flight == 0
    with pytest.raises(BadTransition):
        await a.set_state("c", CampaignState.RUNNING)
    with pytest.raises(BadTransition):
        await a.set_state("c", CampaignState.DONE)
    with pytest.raises(UnknownCampaign):
        await a.set_state("nope", CampaignState.PAUSED)
    with pytest.raises(UnknownCampaign):
        await a.claim("nope", "gw", T0, 60)


async def test_a_done_campaign_cannot_be_resumed(make_store: StoreFactory) -> None:
    store = make_store()
    await store.create("c", SPEC, _contacts(1), T0)
    await _dial_to_the_end(store, "c", "gw", Outcome.REJECTED)
    rec = await store.get("c")
    assert rec is not None and rec.state == CampaignState.DONE
    with pytest.raises(BadTransition):
        await store.set_state("c", CampaignState.PAUSED)


async def test_campaign_wide_gates_on_claims(make_store: StoreFactory) -> None:
    """cps, max_concurrent and a trunk hold are checked in the claim itself, so they hold for
    all gateways together."""
    a, b = make_store(), make_store()
    await a.create("c", SPEC, _contacts(5), T0)

    async def claim(store: CampaignStore, owner: str, now: float) -> bool:
        got = await store.claim("c", owner, now, 600, min_interval_s=1.0, max_in_flight=2)
        return got is not None

    assert await claim(a, "gw-a", T0)
    assert not await claim(b, "gw-b", T0 + 0.999)  # 1/cps not yet passed since a's claim
    assert await claim(b, "gw-b", T0 + 1.0)
    assert not await claim(a, "gw-a", T0 + 5)  # two in flight, one on each gateway
    rec = await a.get("c")
    assert rec is not None and rec.last_dial_at == T0 + 1.0 and rec.totals.in_flight == 2

    assert await b.hold("c", T0 + 100) == T0 + 100
    assert await a.hold("c", T0 + 50) == T0 + 100  # a shorter hold does not cut it short
    assert await a.claim("c", "gw-a", T0 + 99, 600) is None  # no cap given, but the hold
    assert not await claim(a, "gw-a", T0 + 100)  # still two in flight
    assert await a.claim("c", "gw-a", T0 + 100, 600) is not None
    rec = await b.get("c")
    assert rec is not None and rec.hold_until == T0 + 100
    with pytest.raises(UnknownCampaign):
        await a.hold("nope", T0)


async def test_the_in_flight_cap_is_shared_between_the_owners_dialling(
    make_store: StoreFactory,
) -> None:
    """With ``share_s``, the owners that asked within ``share_s`` split ``max_in_flight``:
    the one that filled the cap first cannot take the slots it frees back while another is
    asking; an owner that stops asking drops out and the cap is whole again."""
    a, b = make_store(), make_store()
    await a.create("c", SPEC, _contacts(12), T0)

    async def claim(store: CampaignStore, owner: str, now: float) -> int | None:
        got = await store.claim("c", owner, now, 600, max_in_flight=4, share_s=3.0)
        return None if got is None else got.index

    held = [await claim(a, "gw-a", T0) for _ in range(4)]  # alone: the whole cap
    assert None not in held and await claim(a, "gw-a", T0) is None
    assert await claim(b, "gw-b", T0 + 1) is None  # the cap is full; but b is now dialling
    rec = await b.get("c")
    assert rec is not None and rec.dialers == {"gw-a": T0, "gw-b": T0 + 1}

    for i in held[:2]:  # two of a's calls end
        assert i is not None
        assert await a.finish_attempt("c", i, "gw-a", Attempt(T0, T0 + 2, Outcome.HUMAN), None)
    # a still holds 2 = ceil(4 / 2): the freed slots are b's, although a asks first.
    assert await claim(a, "gw-a", T0 + 2) is None
    on_b = [await claim(b, "gw-b", T0 + 2) for _ in range(2)]
    assert None not in on_b
    assert await claim(b, "gw-b", T0 + 2) is None  # and the cap holds in all

    # b stops asking, and every call ends.
    for store, owner, i in [(a, "gw-a", held[2]), (a, "gw-a", held[3]),
                            (b, "gw-b", on_b[0]), (b, "gw-b", on_b[1])]:  # fmt: skip
        assert i is not None
        assert await store.finish_attempt("c", i, owner, Attempt(T0, T0 + 4, Outcome.HUMAN), None)
    # b asked 2.5 s ago: it still counts, and a's share is 2 of the 4 free slots.
    assert [await claim(a, "gw-a", T0 + 4.5) is not None for _ in range(3)] == [True, True, False]
    # b's last ask is 3.5 s old: a alone is dialling and may fill the cap.
    assert [await claim(a, "gw-a", T0 + 5.5) is not None for _ in range(3)] == [True, True, False]

    # Without share_s nothing is recorded or shared (one gateway, or a caller that opts out).
    await a.create("d", SPEC, _contacts(3), T0)
    assert await a.claim("d", "gw-a", T0, 600, max_in_flight=2) is not None
    assert await b.claim("d", "gw-b", T0, 600, max_in_flight=2) is not None
    rec = await a.get("d")
    assert rec is not None and rec.dialers == {}


def test_fair_share_rounds_up_and_counts_the_asker() -> None:
    assert [fair_share(5, n) for n in (0, 1, 2, 3, 5, 9)] == [5, 5, 3, 2, 1, 1]
    seen = {"a": 100.0, "b": 97.0, "c": 96.9}
    assert active_dialers(seen, 100.0, 3.0) == 2  # c's ask is older than share_s
    assert active_dialers({}, 100.0, 3.0) == 1
