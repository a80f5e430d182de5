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
