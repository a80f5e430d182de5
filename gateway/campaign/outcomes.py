"""The outcome of one dial attempt, and the mapping from a SIP final response to it.

The classes are the issue's: an answered call is ``human`` or ``machine`` (AMD decides); an
unanswered one is classified by its final status (RFC 3261 §21):

- 486 Busy Here, 600 Busy Everywhere: ``busy``;
- 408 Request Timeout, 480 Temporarily Unavailable, and 487 Request Terminated when *we*
  CANCELled because the ring timeout ran out (RFC 3261 §9.1): ``no_answer``; a 487 for any other
  CANCEL (the campaign was cancelled) is ``cancelled``;
- 403 Forbidden, 603 Decline, 607 Unwanted (RFC 8197), 608 Rejected (RFC 8688): ``rejected``;
- 404 Not Found, 410 Gone, 484 Address Incomplete, 604 Does Not Exist Anywhere:
  ``invalid_number``;
- anything else (5xx, 4xx not above, transport errors): ``failed``, with the status kept.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    HUMAN = "human"
    MACHINE = "machine"
    BUSY = "busy"
    NO_ANSWER = "no_answer"
    REJECTED = "rejected"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INVALID_NUMBER = "invalid_number"


# Outcomes a campaign may retry (``retries`` keys). A person who answered, a bad number and a
# cancelled call are never retried.
RETRYABLE: frozenset[Outcome] = frozenset(
    {Outcome.BUSY, Outcome.NO_ANSWER, Outcome.FAILED, Outcome.REJECTED, Outcome.MACHINE}
)

_BUSY = frozenset({486, 600})
_NO_ANSWER = frozenset({408, 480})
_REJECTED = frozenset({403, 603, 607, 608})
_INVALID = frozenset({404, 410, 484, 604})


def outcome_for_status(status: int, *, ring_timeout: bool = False) -> Outcome:
    """Classify a non-2xx final response to an outbound INVITE.

    ``ring_timeout``: the dialler sent the CANCEL because nobody answered in time, which makes
    the resulting 487 a ``no_answer`` rather than a ``cancelled``.
    """
    if 200 <= status < 300:
        raise ValueError("a 2xx is answered: the outcome is human or machine (AMD)")
    if status in _BUSY:
        return Outcome.BUSY
    if status in _NO_ANSWER:
        return Outcome.NO_ANSWER
    if status == 487:
        return Outcome.NO_ANSWER if ring_timeout else Outcome.CANCELLED
    if status in _REJECTED:
        return Outcome.REJECTED
    if status in _INVALID:
        return Outcome.INVALID_NUMBER
    return Outcome.FAILED
