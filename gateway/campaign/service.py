"""Campaigns as a gateway service: the store, this gateway's owner id, one
:class:`~gateway.campaign.runner.CampaignRunner` task per running or paused campaign, and the
operations the REST API (:mod:`gateway.api.campaigns`) calls.

- **Store**: the bus's Redis when ``[bus] kind = "redis"`` (``bus.redis_url`` under
  ``bus.prefix``), shared by every gateway on it; otherwise the SQLite file ``[campaign] db``.
- **Owner**: ``[campaign] owner``, or ``<hostname>:<SIP port>`` — the same after a restart, so
  :meth:`CampaignService.start` settles this gateway's own claims at once with
  ``recover(owner=...)`` instead of waiting for their leases (see :mod:`gateway.campaign.store`
  for what settling means: never-started claims are re-queued, started ones are closed
  ``failed``/``interrupted`` and not dialled again).
- **Several gateways**: every ``scan_s`` the service lists the store's campaigns and starts a
  runner for each running or paused one it lacks, so a campaign created on one gateway is
  dialled by all; the store's atomic claims keep each contact to one call.
- **Events**: what the runner and the dialler emit goes to ``/api/events`` as
  :class:`~gateway.call.control.CampaignEvent`; the service adds ``campaign.created`` and
  ``campaign.state``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gateway.amd.detector import AmdConfig
from gateway.call.control import CampaignEvent, ControlError, Event
from gateway.campaign.contacts import (
    ContactLimits,
    ContactsError,
    RowError,
    parse_contacts_json,
)
from gateway.campaign.runner import CampaignRunner, Dial, Emit
from gateway.campaign.spec import CampaignSpec, SpecError, parse_spec
from gateway.campaign.store import (
    BadTransition,
    CampaignRecord,
    CampaignState,
    CampaignStore,
    StoreError,
    UnknownCampaign,
)
from voxgate.contract.config import Config, ConfigError, parse_hostport

if TYPE_CHECKING:
    from gateway.call.manager import CallManager

log = logging.getLogger("voxgate.campaign")

__all__ = [
    "BadTransition",
    "CampaignExists",
    "CampaignService",
    "ContactsError",
    "DialFactory",
    "SpecError",
    "UnknownCampaign",
    "amd_config",
    "default_owner",
]

# Campaign ids go into store keys and URLs: keep them to a plain, bounded alphabet.
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_EVENT_FIELDS = frozenset(f.name for f in dataclasses.fields(CampaignEvent)) - {"ts", "type"}


class CampaignExists(StoreError):
    """``POST /api/campaigns`` with the ``id`` of an existing campaign."""


class Publisher(Protocol):
    """Where events go (``CallManager``)."""

    def publish(self, event: Event) -> None: ...


# Builds the dial of one campaign: (campaign id, spec, emit) -> Dial. The gateway's is the
# real dialler (gateway.campaign.dialer.CallDialer); unit tests inject their own.
DialFactory = Callable[[str, CampaignSpec, Emit], Dial]


def default_owner(sip_port: int) -> str:
    """``<hostname>:<port>``: one gateway per SIP port per host, the same after a restart."""
    return f"{socket.gethostname()}:{sip_port}"


def amd_config(settings: Mapping[str, str]) -> AmdConfig:
    """``[campaign.amd]`` (strings, as TOML/env give them) as an :class:`AmdConfig`;
    :class:`ConfigError` naming the setting otherwise."""
    defaults = AmdConfig()
    values: dict[str, object] = {}
    for name, raw in settings.items():
        if name == "phrases" or name not in {f.name for f in dataclasses.fields(AmdConfig)}:
            raise ConfigError(f"campaign.amd: unknown setting {name!r}")
        try:
            values[name] = type(getattr(defaults, name))(raw)
        except ValueError:
            raise ConfigError(f"campaign.amd.{name}: bad value {raw!r}") from None
    try:
        return AmdConfig.from_dict(values)
    except ValueError as exc:
        raise ConfigError(f"campaign.{exc}") from None


def _whole_input(reason: str) -> ContactsError:
    """A refusal of the contacts as a whole (row 0, as ``parse_contacts_json`` reports it)."""
    return ContactsError([RowError(None, reason)])


def open_store(cfg: Config) -> CampaignStore:
    """The bus's Redis when there is one, else the local SQLite file."""
    if cfg.bus.kind == "redis":
        from gateway.campaign.redis_store import RedisCampaignStore

        return RedisCampaignStore.from_url(cfg.bus.redis_url, prefix=cfg.bus.prefix)
    from gateway.campaign.sqlite_store import SqliteCampaignStore

    path = Path(cfg.campaign.db)
    if path.parent != Path():
        path.parent.mkdir(parents=True, exist_ok=True)
    return SqliteCampaignStore(path)


class CampaignService:
    """The campaigns of one gateway; see the module docstring."""

    def __init__(
        self,
        cfg: Config,
        manager: CallManager | Publisher,
        *,
        store: CampaignStore | None = None,
        dial_factory: DialFactory | None = None,
        clock: Callable[[], float] = time.time,
        runner_poll_s: float = 1.0,
    ) -> None:
        self.cfg = cfg.campaign
        self._full_cfg = cfg
        self.manager = manager
        self.amd = amd_config(cfg.campaign.amd)  # a bad setting stops the start
        self.limits = ContactLimits(
            max_contacts=cfg.campaign.max_contacts, max_bytes=cfg.campaign.max_request_bytes
        )
        self._store = store
        self._owns_store = store is None
        self._dial_factory = dial_factory
        self.clock = clock
        self.runner_poll_s = runner_poll_s
        self.owner = cfg.campaign.owner
        self.runners: dict[str, CampaignRunner] = {}
        self._tasks: dict[str, asyncio.Task[CampaignState]] = {}
        # Campaigns seen done or cancelled: never looked at again by the scan.
        self._over: set[str] = set()
        self._scan: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def store(self) -> CampaignStore:
        """The store, opened when first needed: a gateway that never runs a campaign leaves
        no SQLite file behind."""
        if self._store is None:
            self._store = open_store(self._full_cfg)
        return self._store

    def _store_exists(self) -> bool:
        """Whether there can be campaigns to resume (an opened store, Redis, or the file)."""
        return (
            self._store is not None
            or self._full_cfg.bus.kind == "redis"
            or Path(self.cfg.db).exists()
        )

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self, sip_port: int | None = None) -> None:
        """Open the store, settle this owner's claims left by a previous run, and resume every
        running or paused campaign; then keep scanning for campaigns made elsewhere.

        ``sip_port``: the port the SIP UA is bound to, for the default owner id."""
        if not self.owner:
            if sip_port is None:
                _, sip_port = parse_hostport(
                    "gateway.sip_listen", self._full_cfg.gateway.sip_listen
                )
            self.owner = default_owner(sip_port)
        log.info("campaigns: owner %s", self.owner)
        self._scan = asyncio.create_task(self._scan_loop(), name="campaign-scan")
        if not self._store_exists():
            return
        try:
            await self._resume_all()
        except Exception:
            # The store is unreachable now: the gateway still serves calls; the scan retries
            # the campaigns, and our claims are then settled when their lease runs out.
            log.exception("campaigns: resuming at start failed; the scan will retry")

    async def _resume_all(self) -> None:
        for campaign_id in await self.store.campaign_ids():
            record = await self.store.get(campaign_id)
            if record is None or self._is_over(record):
                continue
            # Our own claims from before the restart, at once (not after their lease): the
            # never-started ones go back to the queue, the started ones are closed
            # failed/interrupted (store.py: a call that may have rung is never re-dialled).
            done = await self.store.recover(campaign_id, self.clock(), owner=self.owner)
            if done.requeued or done.interrupted:
                log.warning(
                    "campaign %s: recovered %d unstarted and %d interrupted claim(s) of %s",
                    campaign_id, len(done.requeued), len(done.interrupted), self.owner,
                )  # fmt: skip
            self._run(campaign_id, record)

    async def close(self) -> None:
        """Stop the runners (their live calls are ended by the gateway's close; a call cut off
        here is settled as interrupted by the next start) and close the store."""
        self._closed = True
        tasks: list[asyncio.Task[Any]] = list(self._tasks.values())
        if self._scan is not None:
            tasks.append(self._scan)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self.runners.clear()
        if self._store is not None and self._owns_store:
            await self._store.close()

    # --- operations (the REST API) --------------------------------------------------------

    async def create(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """A new running campaign from ``{spec fields..., "contacts": [...], "id"?}``.

        Raises :class:`SpecError` (a bad field, ``agent`` included), :class:`ContactsError`
        (every bad row; nothing is created) or :class:`CampaignExists`."""
        fields = dict(body)
        campaign_id = fields.pop("id", None)
        if campaign_id is None:
            campaign_id = uuid.uuid4().hex[:16]
        elif not isinstance(campaign_id, str) or not _ID.fullmatch(campaign_id):
            raise SpecError("id", "must be 1 to 64 of A-Z a-z 0-9 . _ - (not starting with . _ -)")
        if "contacts" not in fields:
            raise SpecError("contacts", 'missing: a list of {"to", "vars"}')
        raw_contacts = fields.pop("contacts")
        spec = parse_spec(fields)
        agents = getattr(self.manager, "agents", None)
        if agents is not None:
            try:
                agents.validate(dict(spec.agent))
            except ControlError as exc:
                raise SpecError("agent", exc.message) from None
        if not isinstance(raw_contacts, list):
            raise _whole_input('contacts must be a JSON list of {"to", "vars"}')
        contacts = parse_contacts_json(raw_contacts, self.limits)
        if not contacts:
            raise _whole_input("a campaign needs at least one contact")
        async with self._lock:
            try:
                record = await self.store.create(
                    campaign_id, spec.to_json(), contacts, self.clock()
                )
            except StoreError as exc:
                raise CampaignExists(str(exc)) from None
            self._publish(campaign_id, "campaign.created", state=record.state.value)
            self._run(campaign_id, record)
        return record.to_json()

    async def get(
        self, campaign_id: str, *, offset: int = 0, limit: int | None = None
    ) -> dict[str, Any]:
        """The campaign with its contacts' attempts and outcomes (``offset``/``limit`` of them;
        ``limit=0``: totals only, without reading the contacts); :class:`UnknownCampaign`."""
        record = await self._record(campaign_id)
        body = record.to_json()
        if limit != 0:
            contacts = await self.store.contacts(campaign_id)
            end = None if limit is None else offset + limit
            body["contacts"] = [c.to_json() for c in contacts[offset:end]]
        return body

    async def list(self) -> list[dict[str, Any]]:
        if not self._store_exists():
            return []
        out = []
        for campaign_id in sorted(await self.store.campaign_ids()):
            record = await self.store.get(campaign_id)
            if record is not None:
                out.append(record.to_json())
        out.sort(key=lambda c: c["created_at"])
        return out

    async def pause(self, campaign_id: str) -> dict[str, Any]:
        return await self._set_state(campaign_id, CampaignState.PAUSED)

    async def resume(self, campaign_id: str) -> dict[str, Any]:
        return await self._set_state(campaign_id, CampaignState.RUNNING)

    async def cancel(self, campaign_id: str) -> dict[str, Any]:
        """No new calls; live ones finish and keep their outcome."""
        return await self._set_state(campaign_id, CampaignState.CANCELLED)

    def in_flight(self) -> int:
        """Calls this gateway's runners have up now (the metrics' gauge)."""
        return sum(r.pacer.in_flight for r in self.runners.values())

    # --- internals ------------------------------------------------------------------------

    async def _record(self, campaign_id: str) -> CampaignRecord:
        record = await self.store.get(campaign_id) if self._store_exists() else None
        if record is None:
            raise UnknownCampaign(f"no campaign {campaign_id!r}")
        return record

    async def _set_state(self, campaign_id: str, state: CampaignState) -> dict[str, Any]:
        await self._record(campaign_id)  # UnknownCampaign before BadTransition
        previous = await self.store.set_state(campaign_id, state)
        record = await self._record(campaign_id)
        if previous != state:
            self._publish(campaign_id, "campaign.state", state=record.state.value)
            runner = self.runners.get(campaign_id)
            if runner is not None:
                runner._wake.set()  # notice now, not at the next poll
        if not self._is_over(record) and campaign_id not in self._tasks:
            self._run(campaign_id, record)
        return record.to_json()

    def _is_over(self, record: CampaignRecord) -> bool:
        if record.state in (CampaignState.DONE, CampaignState.CANCELLED):
            self._over.add(record.id)
            return True
        return False

    def _run(self, campaign_id: str, record: CampaignRecord) -> None:
        """Start this gateway's runner of a running or paused campaign (once)."""
        if self._closed or campaign_id in self._tasks:
            return
        try:
            spec = parse_spec(record.spec)
        except SpecError as exc:  # written by a newer or broken gateway: not ours to dial
            log.error("campaign %s: stored spec refused (%s): not run here", campaign_id, exc)
            self._over.add(campaign_id)
            return
        emit = self._emitter(campaign_id)
        runner = CampaignRunner(
            self.store, campaign_id, spec, self._dial(campaign_id, spec, emit),
            owner=self.owner, emit=emit, clock=self.clock, lease_s=self.cfg.lease_s,
            poll_s=self.runner_poll_s,
        )  # fmt: skip
        task = asyncio.create_task(runner.run(), name=f"campaign-{campaign_id}")
        self.runners[campaign_id] = runner
        self._tasks[campaign_id] = task
        task.add_done_callback(lambda t: self._runner_ended(campaign_id, t))

    def _runner_ended(self, campaign_id: str, task: asyncio.Task[CampaignState]) -> None:
        if self._tasks.get(campaign_id) is task:
            del self._tasks[campaign_id]
            self.runners.pop(campaign_id, None)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            # E.g. Redis went away: the next scan starts a new runner (claims are durable).
            log.error("campaign %s: runner failed: %r; retried by the next scan", campaign_id, exc)
            return
        self._over.add(campaign_id)
        log.info("campaign %s: %s on this gateway", campaign_id, task.result())

    def _dial(self, campaign_id: str, spec: CampaignSpec, emit: Emit) -> Dial:
        if self._dial_factory is not None:
            return self._dial_factory(campaign_id, spec, emit)
        from gateway.call.manager import CallManager
        from gateway.campaign.dialer import CallDialer

        assert isinstance(self.manager, CallManager)
        return CallDialer(self.manager, campaign_id, spec, amd=self.amd, emit=emit)

    async def _scan_loop(self) -> None:
        """Pick up campaigns created or resumed on another gateway sharing the store."""
        while True:
            await asyncio.sleep(self.cfg.scan_s)
            try:
                await self.scan()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("campaigns: scan failed; trying again in %.0f s", self.cfg.scan_s)

    async def scan(self) -> None:
        if not self._store_exists():
            return
        for campaign_id in await self.store.campaign_ids():
            if campaign_id in self._tasks or campaign_id in self._over:
                continue
            record = await self.store.get(campaign_id)
            if record is not None and not self._is_over(record):
                self._run(campaign_id, record)

    def _emitter(self, campaign_id: str) -> Emit:
        def emit(name: str, fields: dict[str, Any]) -> None:
            self._publish(campaign_id, name, **fields)

        return emit

    def _publish(self, campaign_id: str, name: str, **fields: Any) -> None:
        known = {k: v for k, v in fields.items() if k in _EVENT_FIELDS}
        known["campaign"] = campaign_id
        call_id = known.pop("call_id", None) or ""
        try:
            self.manager.publish(CampaignEvent(str(call_id), type=name, **known))
        except Exception:  # an event must never stop a campaign
            log.exception("campaign %s: event %s not published", campaign_id, name)
