"""Campaign state in a local SQLite file (stdlib ``sqlite3``), for ``voxgate serve`` without
Redis. Each call runs in a worker thread (``asyncio.to_thread``) on this store's own connection.

Atomicity: every write is one ``BEGIN IMMEDIATE`` transaction, which takes the database's write
lock up front, so two stores on the same file (two gateways, or one restarted) serialise; a claim
is a single ``UPDATE ... WHERE owner IS NULL ... RETURNING`` inside it, so a contact is handed out
once. WAL mode lets readers (``GET /api/campaigns/{id}``) run beside a writer.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gateway.campaign.contacts import Contact
from gateway.campaign.outcomes import Outcome
from gateway.campaign.store import (
    INTERRUPTED,
    Attempt,
    CampaignRecord,
    CampaignState,
    CampaignStore,
    Claim,
    ContactRecord,
    Recovered,
    StoreError,
    Totals,
    UnknownCampaign,
    active_dialers,
    check_transition,
    fair_share,
)

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS campaigns (
    id TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    last_dial REAL,
    hold_until REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS contacts (
    campaign TEXT NOT NULL,
    idx INTEGER NOT NULL,
    dest TEXT NOT NULL,
    vars TEXT NOT NULL,
    next_at REAL NOT NULL DEFAULT 0,
    final TEXT,
    owner TEXT,
    lease_until REAL,
    started INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (campaign, idx)
);
CREATE INDEX IF NOT EXISTS contacts_due ON contacts (campaign, next_at)
    WHERE final IS NULL AND owner IS NULL;
-- Partial indexes keep each claim's lease sweep, the in-flight count and the "done?" check
-- proportional to the contacts claimed or pending, not to the campaign's size.
CREATE INDEX IF NOT EXISTS contacts_claimed ON contacts (campaign, lease_until)
    WHERE owner IS NOT NULL;
CREATE INDEX IF NOT EXISTS contacts_open ON contacts (campaign) WHERE final IS NULL;
CREATE TABLE IF NOT EXISTS dialers (
    campaign TEXT NOT NULL,
    owner TEXT NOT NULL,
    seen_at REAL NOT NULL,
    PRIMARY KEY (campaign, owner)
);
CREATE TABLE IF NOT EXISTS attempts (
    campaign TEXT NOT NULL,
    idx INTEGER NOT NULL,
    n INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (campaign, idx, n)
);
"""

_DONE_CHECK = """
UPDATE campaigns SET state = 'done'
WHERE id = ? AND state IN ('running', 'paused')
  AND NOT EXISTS (SELECT 1 FROM contacts WHERE campaign = ? AND final IS NULL)
"""


class SqliteCampaignStore(CampaignStore):
    def __init__(self, path: str | Path, *, busy_timeout_s: float = 10.0) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        # isolation_level=None: no implicit transactions; each write says BEGIN IMMEDIATE.
        self._db = sqlite3.connect(
            self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)  # idempotent; executescript commits by itself

    # -- plumbing ----------------------------------------------------------------------------

    def _write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            result = body(db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return result

    async def _run(self, fn: Callable[[], T]) -> T:
        def locked() -> T:
            with self._lock:
                return fn()

        return await asyncio.to_thread(locked)

    async def _tx(self, body: Callable[[sqlite3.Connection], T]) -> T:
        return await self._run(lambda: self._write(body))

    # -- the interface -----------------------------------------------------------------------

    async def create(
        self, campaign_id: str, spec: Mapping[str, Any], contacts: Sequence[Contact], now: float
    ) -> CampaignRecord:
        def body(db: sqlite3.Connection) -> None:
            try:
                db.execute(
                    "INSERT INTO campaigns (id, spec, state, created_at)"
                    " VALUES (?, ?, 'running', ?)",
                    (campaign_id, json.dumps(dict(spec)), now),
                )
            except sqlite3.IntegrityError:
                raise StoreError(f"campaign {campaign_id!r} exists") from None
            db.executemany(
                "INSERT INTO contacts (campaign, idx, dest, vars, next_at) VALUES (?, ?, ?, ?, ?)",
                (
                    (campaign_id, i, c.to, json.dumps(dict(c.vars)), now)
                    for i, c in enumerate(contacts)
                ),
            )

        await self._tx(body)
        record = await self.get(campaign_id)
        assert record is not None
        return record

    async def get(self, campaign_id: str) -> CampaignRecord | None:
        def body() -> CampaignRecord | None:
            db = self._db
            row = db.execute(
                "SELECT spec, state, created_at, last_dial, hold_until FROM campaigns WHERE id = ?",
                (campaign_id,),
            ).fetchone()
            if row is None:
                return None
            counts = db.execute(
                """SELECT count(*),
                          sum(final IS NULL AND owner IS NULL),
                          sum(final IS NULL AND owner IS NOT NULL)
                   FROM contacts WHERE campaign = ?""",
                (campaign_id,),
            ).fetchone()
            finals = db.execute(
                "SELECT final, count(*) FROM contacts"
                " WHERE campaign = ? AND final IS NOT NULL GROUP BY final",
                (campaign_id,),
            ).fetchall()
            (attempts,) = db.execute(
                "SELECT count(*) FROM attempts WHERE campaign = ?", (campaign_id,)
            ).fetchone()
            totals = Totals(
                contacts=counts[0],
                pending=counts[1] or 0,
                in_flight=counts[2] or 0,
                attempts=attempts,
                outcomes={f: n for f, n in sorted(finals)},
            )
            return CampaignRecord(
                campaign_id,
                json.loads(row[0]),
                CampaignState(row[1]),
                row[2],
                totals,
                last_dial_at=row[3],
                hold_until=row[4],
                dialers=_dialers(db, campaign_id),
            )

        return await self._run(body)

    async def campaign_ids(self) -> list[str]:
        return await self._run(
            lambda: [
                r[0] for r in self._db.execute("SELECT id FROM campaigns ORDER BY created_at, id")
            ]
        )

    async def contacts(self, campaign_id: str) -> list[ContactRecord]:
        def body() -> list[ContactRecord]:
            attempts: dict[int, list[Attempt]] = {}
            for idx, text in self._db.execute(
                "SELECT idx, body FROM attempts WHERE campaign = ? ORDER BY idx, n", (campaign_id,)
            ):
                attempts.setdefault(idx, []).append(Attempt.from_json(json.loads(text)))
            return [
                ContactRecord(
                    index=idx,
                    to=dest,
                    vars=json.loads(vars_),
                    attempts=tuple(attempts.get(idx, ())),
                    next_attempt_at=next_at,
                    final=None if final is None else Outcome(final),
                    owner=owner,
                    lease_until=lease,
                )
                for idx, dest, vars_, next_at, final, owner, lease in self._db.execute(
                    """SELECT idx, dest, vars, next_at, final, owner, lease_until
                       FROM contacts WHERE campaign = ? ORDER BY idx""",
                    (campaign_id,),
                )
            ]

        return await self._run(body)

    async def set_state(self, campaign_id: str, state: CampaignState) -> CampaignState:
        def body(db: sqlite3.Connection) -> CampaignState:
            current = _state(db, campaign_id)
            check_transition(current, state)
            if state == current:
                return current
            db.execute("UPDATE campaigns SET state = ? WHERE id = ?", (state.value, campaign_id))
            if state == CampaignState.CANCELLED:
                db.execute(
                    """UPDATE contacts SET final = 'cancelled'
                       WHERE campaign = ? AND final IS NULL AND owner IS NULL""",
                    (campaign_id,),
                )
            else:
                db.execute(_DONE_CHECK, (campaign_id, campaign_id))
            return current

        return await self._tx(body)

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
        def body(db: sqlite3.Connection) -> Claim | None:
            _recover(db, campaign_id, now, None)
            gates = db.execute(
                "SELECT state, last_dial, hold_until FROM campaigns WHERE id = ?", (campaign_id,)
            ).fetchone()
            if gates is None:
                raise UnknownCampaign(campaign_id)
            state, last_dial, hold_until = gates
            if state != CampaignState.RUNNING.value:
                return None
            if share_s is not None:  # before any gate, as in the Redis store's script
                db.execute(
                    """INSERT INTO dialers (campaign, owner, seen_at) VALUES (?, ?, ?)
                       ON CONFLICT (campaign, owner) DO UPDATE SET seen_at = excluded.seen_at""",
                    (campaign_id, owner, now),
                )
            if now < hold_until:
                return None
            if last_dial is not None and now < last_dial + min_interval_s:
                return None
            if max_in_flight is not None:
                (claimed,) = db.execute(
                    "SELECT count(*) FROM contacts WHERE campaign = ? AND owner IS NOT NULL",
                    (campaign_id,),
                ).fetchone()
                if claimed >= max_in_flight:
                    return None
                if share_s is not None:
                    active = active_dialers(_dialers(db, campaign_id), now, share_s)
                    (mine,) = db.execute(
                        "SELECT count(*) FROM contacts WHERE campaign = ? AND owner = ?",
                        (campaign_id, owner),
                    ).fetchone()
                    if mine >= fair_share(max_in_flight, active):
                        return None
            lease_until = now + lease_s
            # One statement: the row is chosen and taken under the write lock BEGIN IMMEDIATE
            # holds; "owner IS NULL" is re-checked on the row itself.
            row = db.execute(
                """UPDATE contacts SET owner = ?, lease_until = ?, started = 0
                   WHERE campaign = ? AND idx = (
                       SELECT idx FROM contacts
                       WHERE campaign = ? AND final IS NULL AND owner IS NULL AND next_at <= ?
                       ORDER BY next_at, idx LIMIT 1)
                     AND owner IS NULL AND final IS NULL
                   RETURNING idx, dest, vars""",
                (owner, lease_until, campaign_id, campaign_id, now),
            ).fetchone()
            if row is None:
                return None
            db.execute("UPDATE campaigns SET last_dial = ? WHERE id = ?", (now, campaign_id))
            idx, dest, vars_ = row
            return Claim(
                campaign_id,
                idx,
                Contact(dest, json.loads(vars_)),
                owner,
                lease_until,
                tuple(_attempts(db, campaign_id, idx)),
            )

        return await self._tx(body)

    async def hold(self, campaign_id: str, until: float) -> float:
        def body(db: sqlite3.Connection) -> float:
            _state(db, campaign_id)  # raises if unknown
            db.execute(
                "UPDATE campaigns SET hold_until = max(hold_until, ?) WHERE id = ?",
                (until, campaign_id),
            )
            (held,) = db.execute(
                "SELECT hold_until FROM campaigns WHERE id = ?", (campaign_id,)
            ).fetchone()
            return float(held)

        return await self._tx(body)

    async def start_attempt(self, campaign_id: str, index: int, owner: str, now: float) -> bool:
        def body(db: sqlite3.Connection) -> bool:
            cur = db.execute(
                """UPDATE contacts SET started = 1
                   WHERE campaign = ? AND idx = ? AND owner = ? AND started = 0
                     AND final IS NULL""",
                (campaign_id, index, owner),
            )
            if cur.rowcount != 1:
                return False
            _add_attempt(db, campaign_id, index, Attempt(started_at=now))
            return True

        return await self._tx(body)

    async def renew(self, campaign_id: str, index: int, owner: str, lease_until: float) -> bool:
        def body(db: sqlite3.Connection) -> bool:
            cur = db.execute(
                "UPDATE contacts SET lease_until = ? WHERE campaign = ? AND idx = ? AND owner = ?",
                (lease_until, campaign_id, index, owner),
            )
            return cur.rowcount == 1

        return await self._tx(body)

    async def finish_attempt(
        self,
        campaign_id: str,
        index: int,
        owner: str,
        attempt: Attempt,
        next_attempt_at: float | None,
    ) -> bool:
        if attempt.outcome is None:
            raise ValueError("finish_attempt needs the attempt's outcome")
        outcome = attempt.outcome

        def body(db: sqlite3.Connection) -> bool:
            row = db.execute(
                "SELECT started FROM contacts WHERE campaign = ? AND idx = ? AND owner = ?",
                (campaign_id, index, owner),
            ).fetchone()
            if row is None:
                return False
            if row[0]:
                _replace_last_attempt(db, campaign_id, index, attempt)
            else:
                _add_attempt(db, campaign_id, index, attempt)
            state = _state(db, campaign_id)
            final = next_attempt_at is None or state in (
                CampaignState.CANCELLED,
                CampaignState.DONE,
            )
            db.execute(
                """UPDATE contacts SET owner = NULL, lease_until = NULL, started = 0,
                       final = ?, next_at = ?
                   WHERE campaign = ? AND idx = ?""",
                (
                    outcome.value if final else None,
                    next_attempt_at if next_attempt_at is not None else attempt.ended_at or 0.0,
                    campaign_id,
                    index,
                ),
            )
            db.execute(_DONE_CHECK, (campaign_id, campaign_id))
            return True

        return await self._tx(body)

    async def release(
        self, campaign_id: str, index: int, owner: str, next_attempt_at: float
    ) -> bool:
        def body(db: sqlite3.Connection) -> bool:
            cur = db.execute(
                """UPDATE contacts SET owner = NULL, lease_until = NULL, next_at = ?
                   WHERE campaign = ? AND idx = ? AND owner = ? AND started = 0""",
                (next_attempt_at, campaign_id, index, owner),
            )
            if cur.rowcount == 1 and _state(db, campaign_id) == CampaignState.CANCELLED:
                db.execute(
                    "UPDATE contacts SET final = 'cancelled' WHERE campaign = ? AND idx = ?",
                    (campaign_id, index),
                )
            return cur.rowcount == 1

        return await self._tx(body)

    async def recover(self, campaign_id: str, now: float, owner: str | None = None) -> Recovered:
        return await self._tx(lambda db: _recover(db, campaign_id, now, owner))

    async def next_due(self, campaign_id: str) -> float | None:
        def body() -> float | None:
            (at,) = self._db.execute(
                "SELECT min(next_at) FROM contacts"
                " WHERE campaign = ? AND final IS NULL AND owner IS NULL",
                (campaign_id,),
            ).fetchone()
            return None if at is None else float(at)

        return await self._run(body)

    async def close(self) -> None:
        await self._run(self._db.close)


def _state(db: sqlite3.Connection, campaign_id: str) -> CampaignState:
    row = db.execute("SELECT state FROM campaigns WHERE id = ?", (campaign_id,)).fetchone()
    if row is None:
        raise UnknownCampaign(campaign_id)
    return CampaignState(row[0])


def _dialers(db: sqlite3.Connection, campaign_id: str) -> dict[str, float]:
    rows = db.execute(
        "SELECT owner, seen_at FROM dialers WHERE campaign = ? ORDER BY owner", (campaign_id,)
    )
    return {owner: float(seen) for owner, seen in rows}


def _attempts(db: sqlite3.Connection, campaign_id: str, index: int) -> list[Attempt]:
    return [
        Attempt.from_json(json.loads(body))
        for (body,) in db.execute(
            "SELECT body FROM attempts WHERE campaign = ? AND idx = ? ORDER BY n",
            (campaign_id, index),
        )
    ]


def _add_attempt(db: sqlite3.Connection, campaign_id: str, index: int, attempt: Attempt) -> None:
    db.execute(
        """INSERT INTO attempts (campaign, idx, n, body)
           VALUES (?, ?, (SELECT count(*) + 1 FROM attempts WHERE campaign = ? AND idx = ?), ?)""",
        (campaign_id, index, campaign_id, index, attempt.dumps()),
    )


def _replace_last_attempt(
    db: sqlite3.Connection, campaign_id: str, index: int, attempt: Attempt
) -> None:
    db.execute(
        """UPDATE attempts SET body = ?
           WHERE campaign = ? AND idx = ?
             AND n = (SELECT max(n) FROM attempts WHERE campaign = ? AND idx = ?)""",
        (attempt.dumps(), campaign_id, index, campaign_id, index),
    )


def _recover(db: sqlite3.Connection, campaign_id: str, now: float, owner: str | None) -> Recovered:
    if owner is None:
        rows = db.execute(
            """SELECT idx, started FROM contacts
               WHERE campaign = ? AND owner IS NOT NULL AND lease_until < ?""",
            (campaign_id, now),
        ).fetchall()
    else:
        rows = db.execute(
            "SELECT idx, started FROM contacts WHERE campaign = ? AND owner = ?",
            (campaign_id, owner),
        ).fetchall()
    if not rows:
        return Recovered()
    cancelled = _state(db, campaign_id) == CampaignState.CANCELLED
    requeued: list[int] = []
    interrupted: list[int] = []
    for idx, started in rows:
        if started:
            last = _attempts(db, campaign_id, idx)[-1]
            closed = Attempt(last.started_at, now, Outcome.FAILED, None, INTERRUPTED)
            _replace_last_attempt(db, campaign_id, idx, closed)
            final: str | None = Outcome.FAILED.value
            interrupted.append(idx)
        else:
            final = Outcome.CANCELLED.value if cancelled else None
            requeued.append(idx)
        db.execute(
            """UPDATE contacts SET owner = NULL, lease_until = NULL, started = 0, final = ?
               WHERE campaign = ? AND idx = ?""",
            (final, campaign_id, idx),
        )
    db.execute(_DONE_CHECK, (campaign_id, campaign_id))
    return Recovered(tuple(requeued), tuple(interrupted))
