"""Campaign state in Redis (redis-py asyncio; the bus's Redis when there is one).

Layout under ``{prefix}:campaign:{id}`` (``B`` below):

- ``B`` — hash: ``spec`` (JSON), ``state``, ``created_at``, ``contacts``, ``attempts`` and
  ``f:<outcome>`` (contacts whose final outcome it is);
- ``B:due`` — sorted set of pending contact indexes scored by ``next_attempt_at``;
- ``B:claimed`` — sorted set of claimed indexes scored by lease expiry;
- ``B:dialers`` — hash: owner → when it last asked for a claim (for the fair share);
- ``B:k:<i>`` — hash per contact: ``to``, ``vars``, ``next_at``, ``final``, ``owner``,
  ``started``; ``B:k:<i>:a`` — list of its attempts (JSON).
- ``{prefix}:campaigns`` — set of campaign ids.

Every transition is one Lua script, which Redis runs atomically (EVALSHA): a claim moves an
index from ``due`` to ``claimed`` in one step, so two gateways never get the same contact. The
scripts build contact keys from ``B``, so a campaign must live on one Redis node (no Cluster).
Times are written by Python (``repr``, exact) except an interrupted attempt's ``ended_at``,
which Lua's cjson writes with 14 significant digits (0.1 ms at today's epoch).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from gateway.campaign.contacts import Contact
from gateway.campaign.outcomes import Outcome
from gateway.campaign.store import (
    INTERRUPTED,
    Attempt,
    BadTransition,
    CampaignRecord,
    CampaignState,
    CampaignStore,
    Claim,
    ContactRecord,
    Recovered,
    StoreError,
    Totals,
    UnknownCampaign,
    check_transition,
)

# Shared by the scripts below: settle the campaign as done when nothing is pending or live.
_DONE = """
local function done_check(b)
  local st = redis.call('HGET', b, 'state')
  if (st == 'running' or st == 'paused') and redis.call('ZCARD', b .. ':due') == 0
     and redis.call('ZCARD', b .. ':claimed') == 0 then
    redis.call('HSET', b, 'state', 'done')
  end
end
local function finalise(b, i, outcome)
  redis.call('HSET', b .. ':k:' .. i, 'final', outcome)
  redis.call('HINCRBY', b, 'f:' .. outcome, 1)
end
"""

# Recovery of expired (or one owner's) claims; used alone and at the start of a claim.
_RECOVER = """
local function recover(b, now, owner, interrupted_reason)
  local ids
  if owner == '' then
    ids = redis.call('ZRANGEBYSCORE', b .. ':claimed', '-inf', '(' .. now)
  else
    ids = redis.call('ZRANGE', b .. ':claimed', 0, -1)
  end
  local requeued, interrupted = {}, {}
  local cancelled = redis.call('HGET', b, 'state') == 'cancelled'
  for _, i in ipairs(ids) do
    local k = b .. ':k:' .. i
    if owner == '' or redis.call('HGET', k, 'owner') == owner then
      if redis.call('HGET', k, 'started') == '1' then
        local a = cjson.decode(redis.call('LINDEX', k .. ':a', -1))
        a['ended_at'] = tonumber(now)
        a['outcome'] = 'failed'
        a['reason'] = interrupted_reason
        redis.call('LSET', k .. ':a', -1, cjson.encode(a))
        finalise(b, i, 'failed')
        table.insert(interrupted, i)
      elseif cancelled then
        finalise(b, i, 'cancelled')
        table.insert(requeued, i)
      else
        redis.call('ZADD', b .. ':due', redis.call('HGET', k, 'next_at'), i)
        table.insert(requeued, i)
      end
      redis.call('HDEL', k, 'owner', 'lease')
      redis.call('HSET', k, 'started', '0')
      redis.call('ZREM', b .. ':claimed', i)
    end
  end
  done_check(b)
  return {requeued, interrupted}
end
"""

# KEYS[1]=B; ARGV: now, owner (or ''), reason
_RECOVER_SCRIPT = _DONE + _RECOVER + "return recover(KEYS[1], ARGV[1], ARGV[2], ARGV[3])"

# KEYS[1]=B; ARGV: owner, now, lease_until, reason, min_interval_s, max_in_flight ('' = none),
# share_s ('' = no sharing). Returns the index, or -1 not running, -2 none due, -3 unknown
# campaign, -4 too early (cps or a trunk hold), -5 at max_in_flight, -6 at the owner's fair share
# of it (gateway.campaign.store.fair_share, which this mirrors).
_CLAIM_SCRIPT = (
    _DONE
    + _RECOVER
    + """
local b = KEYS[1]
if redis.call('EXISTS', b) == 0 then return -3 end
recover(b, ARGV[2], '', ARGV[4])
if redis.call('HGET', b, 'state') ~= 'running' then return -1 end
local now = tonumber(ARGV[2])
-- Recorded before any gate: an owner waiting at a shut gate is still dialling the campaign.
if ARGV[7] ~= '' then redis.call('HSET', b .. ':dialers', ARGV[1], ARGV[2]) end
if now < tonumber(redis.call('HGET', b, 'hold_until') or '0') then return -4 end
local last = redis.call('HGET', b, 'last_dial')
if last and now < tonumber(last) + tonumber(ARGV[5]) then return -4 end
if ARGV[6] ~= '' then
  local cap = tonumber(ARGV[6])
  if redis.call('ZCARD', b .. ':claimed') >= cap then return -5 end
  if ARGV[7] ~= '' then
    local since, active = now - tonumber(ARGV[7]), 0
    local seen = redis.call('HGETALL', b .. ':dialers')
    for j = 1, #seen, 2 do
      if tonumber(seen[j + 1]) >= since then active = active + 1 end
    end
    if active > 1 then
      local mine = 0
      for _, i in ipairs(redis.call('ZRANGE', b .. ':claimed', 0, -1)) do
        if redis.call('HGET', b .. ':k:' .. i, 'owner') == ARGV[1] then mine = mine + 1 end
      end
      if mine >= math.ceil(cap / active) then return -6 end
    end
  end
end
local due = redis.call('ZRANGEBYSCORE', b .. ':due', '-inf', ARGV[2], 'LIMIT', 0, 1)
if #due == 0 then return -2 end
local i = due[1]
redis.call('HSET', b, 'last_dial', ARGV[2])
redis.call('ZREM', b .. ':due', i)
redis.call('ZADD', b .. ':claimed', ARGV[3], i)
redis.call('HSET', b .. ':k:' .. i, 'owner', ARGV[1], 'lease', ARGV[3], 'started', '0')
return tonumber(i)
"""
)

# KEYS[1]=B; ARGV: index, owner, attempt JSON. 1 if started.
_START_SCRIPT = """
local b, i = KEYS[1], ARGV[1]
local k = b .. ':k:' .. i
if redis.call('HGET', k, 'owner') ~= ARGV[2] or redis.call('HGET', k, 'started') == '1' then
  return 0
end
redis.call('RPUSH', k .. ':a', ARGV[3])
redis.call('HSET', k, 'started', '1')
redis.call('HINCRBY', b, 'attempts', 1)
return 1
"""

# KEYS[1]=B; ARGV: index, owner, lease_until.
_RENEW_SCRIPT = """
local b, i = KEYS[1], ARGV[1]
if redis.call('HGET', b .. ':k:' .. i, 'owner') ~= ARGV[2] then return 0 end
redis.call('HSET', b .. ':k:' .. i, 'lease', ARGV[3])
redis.call('ZADD', b .. ':claimed', ARGV[3], i)
return 1
"""

# KEYS[1]=B; ARGV: index, owner, attempt JSON, next_at ('' = final), outcome.
_FINISH_SCRIPT = (
    _DONE
    + """
local b, i = KEYS[1], ARGV[1]
local k = b .. ':k:' .. i
if redis.call('HGET', k, 'owner') ~= ARGV[2] then return 0 end
if redis.call('HGET', k, 'started') == '1' then
  redis.call('LSET', k .. ':a', -1, ARGV[3])
else
  redis.call('RPUSH', k .. ':a', ARGV[3])
  redis.call('HINCRBY', b, 'attempts', 1)
end
redis.call('HDEL', k, 'owner', 'lease')
redis.call('HSET', k, 'started', '0')
redis.call('ZREM', b .. ':claimed', i)
local st = redis.call('HGET', b, 'state')
if ARGV[4] == '' or st == 'cancelled' or st == 'done' then
  finalise(b, i, ARGV[5])
else
  redis.call('HSET', k, 'next_at', ARGV[4])
  redis.call('ZADD', b .. ':due', ARGV[4], i)
end
done_check(b)
return 1
"""
)

# KEYS[1]=B; ARGV: index, owner, next_at.
_RELEASE_SCRIPT = (
    _DONE
    + """
local b, i = KEYS[1], ARGV[1]
local k = b .. ':k:' .. i
if redis.call('HGET', k, 'owner') ~= ARGV[2] or redis.call('HGET', k, 'started') == '1' then
  return 0
end
redis.call('HDEL', k, 'owner', 'lease')
redis.call('ZREM', b .. ':claimed', i)
if redis.call('HGET', b, 'state') == 'cancelled' then
  finalise(b, i, 'cancelled')
else
  redis.call('HSET', k, 'next_at', ARGV[3])
  redis.call('ZADD', b .. ':due', ARGV[3], i)
end
return 1
"""
)

# KEYS[1]=B; ARGV: wanted state. Returns the previous state (the caller checked the move, the
# script re-checks it against the state it sees, since another gateway may have moved it).
_STATE_SCRIPT = (
    _DONE
    + """
local b = KEYS[1]
local cur = redis.call('HGET', b, 'state')
if not cur then return {'unknown', ''} end
local want = ARGV[1]
if cur == want then return {'ok', cur} end
local allowed = (cur == 'running' and (want == 'paused' or want == 'cancelled'))
  or (cur == 'paused' and (want == 'running' or want == 'cancelled'))
if not allowed then return {'bad', cur} end
redis.call('HSET', b, 'state', want)
if want == 'cancelled' then
  for _, i in ipairs(redis.call('ZRANGE', b .. ':due', 0, -1)) do finalise(b, i, 'cancelled') end
  redis.call('DEL', b .. ':due')
else
  done_check(b)
end
return {'ok', cur}
"""
)

# KEYS[1]=B; ARGV: until. Returns the hold's end (as a string: Lua numbers lose precision).
_HOLD_SCRIPT = """
local b = KEYS[1]
if redis.call('EXISTS', b) == 0 then return redis.error_reply('unknown campaign') end
local cur = redis.call('HGET', b, 'hold_until')
if not cur or tonumber(cur) < tonumber(ARGV[1]) then
  redis.call('HSET', b, 'hold_until', ARGV[1])
  return ARGV[1]
end
return cur
"""


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisCampaignStore(CampaignStore):
    def __init__(self, redis: Redis, *, prefix: str = "voxgate", owns_client: bool = False) -> None:
        self._r = redis
        self.prefix = prefix
        self._owns = owns_client
        self._claim = redis.register_script(_CLAIM_SCRIPT)
        self._start = redis.register_script(_START_SCRIPT)
        self._renew = redis.register_script(_RENEW_SCRIPT)
        self._finish = redis.register_script(_FINISH_SCRIPT)
        self._release = redis.register_script(_RELEASE_SCRIPT)
        self._recover = redis.register_script(_RECOVER_SCRIPT)
        self._state = redis.register_script(_STATE_SCRIPT)
        self._hold = redis.register_script(_HOLD_SCRIPT)

    @classmethod
    def from_url(cls, url: str, *, prefix: str = "voxgate") -> RedisCampaignStore:
        return cls(Redis.from_url(url), prefix=prefix, owns_client=True)

    def _key(self, campaign_id: str) -> str:
        return f"{self.prefix}:campaign:{campaign_id}"

    async def create(
        self, campaign_id: str, spec: Mapping[str, Any], contacts: Sequence[Contact], now: float
    ) -> CampaignRecord:
        b = self._key(campaign_id)
        if not await self._r.sadd(f"{self.prefix}:campaigns", campaign_id):
            raise StoreError(f"campaign {campaign_id!r} exists")
        # Contacts first, the campaign hash (with its state) last: until it exists, a claim
        # answers "unknown campaign" instead of seeing half the contacts.
        chunk = 1000
        for start in range(0, len(contacts), chunk):
            pipe = self._r.pipeline(transaction=False)
            due: dict[str, float] = {}
            for i, c in enumerate(contacts[start : start + chunk], start):
                pipe.hset(
                    f"{b}:k:{i}",
                    mapping={
                        "to": c.to,
                        "vars": json.dumps(dict(c.vars)),
                        "next_at": repr(now),
                        "started": "0",
                    },
                )
                due[str(i)] = now
            pipe.zadd(f"{b}:due", due)
            await pipe.execute()
        await self._r.hset(
            b,
            mapping={
                "spec": json.dumps(dict(spec)),
                "state": CampaignState.RUNNING.value,
                "created_at": repr(now),
                "contacts": str(len(contacts)),
                "attempts": "0",
            },
        )
        record = await self.get(campaign_id)
        assert record is not None
        return record

    async def get(self, campaign_id: str) -> CampaignRecord | None:
        b = self._key(campaign_id)
        pipe = self._r.pipeline(transaction=True)
        pipe.hgetall(b)
        pipe.zcard(f"{b}:due")
        pipe.zcard(f"{b}:claimed")
        pipe.hgetall(f"{b}:dialers")
        raw, pending, in_flight, dialers = await pipe.execute()
        h = {_s(k): _s(v) for k, v in raw.items()}
        if "state" not in h:
            return None
        outcomes = {k[2:]: int(v) for k, v in sorted(h.items()) if k.startswith("f:") and int(v)}
        totals = Totals(int(h["contacts"]), pending, in_flight, int(h["attempts"]), outcomes)
        last = h.get("last_dial")
        return CampaignRecord(
            campaign_id,
            json.loads(h["spec"]),
            CampaignState(h["state"]),
            float(h["created_at"]),
            totals,
            last_dial_at=None if last is None else float(last),
            hold_until=float(h.get("hold_until", "0")),
            dialers={_s(k): float(v) for k, v in sorted(dialers.items())},
        )

    async def campaign_ids(self) -> list[str]:
        ids = await self._r.smembers(f"{self.prefix}:campaigns")
        return sorted(_s(i) for i in ids)

    async def contacts(self, campaign_id: str) -> list[ContactRecord]:
        b = self._key(campaign_id)
        n = await self._r.hget(b, "contacts")
        if n is None:
            raise UnknownCampaign(campaign_id)
        out: list[ContactRecord] = []
        count = int(n)
        for start in range(0, count, 500):
            pipe = self._r.pipeline(transaction=False)
            for i in range(start, min(count, start + 500)):
                pipe.hgetall(f"{b}:k:{i}")
                pipe.lrange(f"{b}:k:{i}:a", 0, -1)
            replies = await pipe.execute()
            for j in range(0, len(replies), 2):
                h = {_s(k): _s(v) for k, v in replies[j].items()}
                attempts = tuple(Attempt.from_json(json.loads(a)) for a in replies[j + 1])
                final = h.get("final")
                lease = h.get("lease")
                out.append(
                    ContactRecord(
                        index=start + j // 2,
                        to=h["to"],
                        vars=json.loads(h["vars"]),
                        attempts=attempts,
                        next_attempt_at=float(h.get("next_at", "0")),
                        final=None if final is None else Outcome(final),
                        owner=h.get("owner"),
                        lease_until=None if lease is None else float(lease),
                    )
                )
        return out

    async def set_state(self, campaign_id: str, state: CampaignState) -> CampaignState:
        verdict, previous = await self._state(keys=[self._key(campaign_id)], args=[state.value])
        verdict = _s(verdict)
        if verdict == "unknown":
            raise UnknownCampaign(campaign_id)
        current = CampaignState(_s(previous))
        if verdict == "bad":
            check_transition(current, state)  # raises with the right message
            raise BadTransition(current, state)  # pragma: no cover - the script and table agree
        return current

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
        b = self._key(campaign_id)
        lease_until = now + lease_s
        cap = "" if max_in_flight is None else str(max_in_flight)
        share = "" if share_s is None else repr(share_s)
        args = [owner, repr(now), repr(lease_until), INTERRUPTED, repr(min_interval_s), cap, share]
        index = int(await self._claim(keys=[b], args=args))
        if index == -3:
            raise UnknownCampaign(campaign_id)
        if index < 0:
            return None
        pipe = self._r.pipeline(transaction=False)
        pipe.hmget(f"{b}:k:{index}", ["to", "vars"])
        pipe.lrange(f"{b}:k:{index}:a", 0, -1)
        (to, vars_), attempts = await pipe.execute()
        return Claim(
            campaign_id,
            index,
            Contact(_s(to), json.loads(vars_)),
            owner,
            lease_until,
            tuple(Attempt.from_json(json.loads(a)) for a in attempts),
        )

    async def hold(self, campaign_id: str, until: float) -> float:
        try:
            held = await self._hold(keys=[self._key(campaign_id)], args=[repr(until)])
        except ResponseError as exc:
            if "unknown campaign" in str(exc):
                raise UnknownCampaign(campaign_id) from None
            raise
        return float(held)

    async def start_attempt(self, campaign_id: str, index: int, owner: str, now: float) -> bool:
        args = [str(index), owner, Attempt(started_at=now).dumps()]
        return bool(await self._start(keys=[self._key(campaign_id)], args=args))

    async def renew(self, campaign_id: str, index: int, owner: str, lease_until: float) -> bool:
        args = [str(index), owner, repr(lease_until)]
        return bool(await self._renew(keys=[self._key(campaign_id)], args=args))

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
        nxt = "" if next_attempt_at is None else repr(next_attempt_at)
        args = [str(index), owner, attempt.dumps(), nxt, attempt.outcome.value]
        return bool(await self._finish(keys=[self._key(campaign_id)], args=args))

    async def release(
        self, campaign_id: str, index: int, owner: str, next_attempt_at: float
    ) -> bool:
        args = [str(index), owner, repr(next_attempt_at)]
        return bool(await self._release(keys=[self._key(campaign_id)], args=args))

    async def recover(self, campaign_id: str, now: float, owner: str | None = None) -> Recovered:
        requeued, interrupted = await self._recover(
            keys=[self._key(campaign_id)], args=[repr(now), owner or "", INTERRUPTED]
        )
        return Recovered(tuple(int(i) for i in requeued), tuple(int(i) for i in interrupted))

    async def next_due(self, campaign_id: str) -> float | None:
        first = await self._r.zrange(f"{self._key(campaign_id)}:due", 0, 0, withscores=True)
        return float(first[0][1]) if first else None

    async def close(self) -> None:
        if self._owns:
            await self._r.aclose()
