"""Outbound campaigns (issue 14, part 1): validated contacts and spec, sans-I/O pacing, and the
durable per-contact state (Redis or SQLite) with atomic claims so that no contact is dialled
twice, across restarts and across gateways sharing one campaign.

- :mod:`~gateway.campaign.contacts`: contacts from JSON/CSV, every bad row with its number;
- :mod:`~gateway.campaign.spec`: the campaign spec (pacing, window, retries, AMD, voicemail);
- :mod:`~gateway.campaign.outcomes`: attempt outcomes and the SIP status mapping;
- :mod:`~gateway.campaign.pacing`: when the next dial may start (cps, concurrency, window,
  trunk back-off) and when to retry;
- :mod:`~gateway.campaign.store`: the state interface and its claim/restart semantics, with
  :mod:`~gateway.campaign.redis_store` and :mod:`~gateway.campaign.sqlite_store`;
- :mod:`~gateway.campaign.runner`: the asyncio loop joining them to a ``dial`` callable.
"""
