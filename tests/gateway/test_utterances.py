"""The call's utterance records: one per say(), gone when it finishes; pending cancels bounded."""

from __future__ import annotations

from gateway.call.utterances import MAX_PENDING_CANCELS, Utterance, Utterances


def test_a_record_lives_from_say_to_finish() -> None:
    us = Utterances()
    us.add(Utterance("u1", "Hello.", said_at=1.0, barge_in=False))
    assert us.get("u1") is not None and not us.get("u1").barge_in  # type: ignore[union-attr]
    first = us.first_audio("u1")
    assert first is not None and first.said_at == 1.0
    assert us.first_audio("u1") is None  # the first-audio hook fires once
    assert us.finish("u1") is not None
    assert us.get("u1") is None and len(us) == 0
    assert us.first_audio("nobody") is None and us.finish("nobody") is None
    assert us.get(None) is None


def test_cancels_wait_for_the_worker_and_stay_bounded() -> None:
    us = Utterances()
    us.cancelled("a", 5.0)
    assert us.worker_ended("a") == 5.0
    assert us.worker_ended("a") is None  # acknowledged once
    for i in range(MAX_PENDING_CANCELS + 10):
        us.cancelled(f"c{i}", float(i))  # a worker that never answers
    assert us.pending_cancels == MAX_PENDING_CANCELS
    assert us.worker_ended("c0") is None  # the oldest were forgotten
    assert us.worker_ended(f"c{MAX_PENDING_CANCELS + 9}") == MAX_PENDING_CANCELS + 9


def test_the_watchdog_gives_up_what_no_worker_answers_from_the_start() -> None:
    us = Utterances()
    us.add(Utterance("u1", "Hello.", said_at=10.0))
    assert us.watchdog("u1", 12.0, timeout_s=5.0) == 15.0  # look again when it is due
    verdict = us.watchdog("u1", 15.0, timeout_s=5.0)
    assert isinstance(verdict, str) and "within 5 s" in verdict
    assert us.watchdog("gone", 99.0, timeout_s=5.0) is None


def test_the_watchdog_gives_up_a_stall_after_the_last_chunk_not_a_long_utterance() -> None:
    us = Utterances()
    us.add(Utterance("u1", "A long story.", said_at=0.0))
    us.from_worker("u1", 1.0, last=False)  # first chunk
    us.from_worker("u1", 4.0, last=False)  # chunks keep coming: it is alive
    assert us.watchdog("u1", 5.0, timeout_s=5.0) == 9.0  # from the last chunk, not the say
    verdict = us.watchdog("u1", 9.0, timeout_s=5.0)
    assert isinstance(verdict, str) and "after its last chunk" in verdict  # its worker vanished
    # Once the worker has sent its end, the rest is playout: nothing to watch, however long.
    us.add(Utterance("u2", "Done quickly.", said_at=0.0))
    us.from_worker("u2", 0.5, last=True)
    assert us.watchdog("u2", 1000.0, timeout_s=5.0) is None
    us.from_worker("nobody", 1.0, last=True)  # a stray message changes nothing
    assert us.get("nobody") is None
