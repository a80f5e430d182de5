"""What the flow engine asks of a call beyond speaking: transfer it and record it.

The SIP mechanics (REFER with its NOTIFY sipfrag, RFC 3515; a bridged second leg) and the
recording writer live with the call (``gateway.call.calls``), not here. The engine asks
through this module's functions, which look the call's methods up by name: a call without
them (a test's stand-in, another kind of leg) gets the verb's ``not_supported`` path (an
``AgentError`` on the call, then the verb's ``fallback``) instead of an exception.

- ``transfer(target, fallback="bridge" | None)`` → ``TransferOutcome``: ``result``
  completed | refused | failed | not_supported, the SIP ``status``, a ``reason``. A completed
  REFER ends the call (the call hangs up, reason "transferred"); a completed bridge leaves it
  up, joined to the second leg, with the agent stopped.
- ``start_recording(channels)`` → the recording's id; ``stop_recording()``. Disk trouble
  after the start is the recorder's to report (``RecordingEvent`` failed); the call goes on.

Attended transfer (REFER with Replaces, RFC 3891) is not offered: the call answers it
``not_supported``, and so does the engine before asking.
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

from gateway.call.control import CallInfo, ControlError, TransferOutcome

NOT_SUPPORTED = "not supported on this call"


class Transferring(Protocol):
    async def transfer(self, target: str, *, fallback: str | None = None) -> TransferOutcome:
        """Blind transfer to ``target`` (a sip: URI); ``fallback="bridge"``: dial and bridge
        when REFER is refused or fails."""
        ...


class Recording(Protocol):
    def start_recording(self, channels: str = "both") -> str: ...

    def stop_recording(self) -> None: ...


class Unsupported(Exception):
    """The call has no such method."""


async def transfer(call: object, target: str, *, bridge: bool) -> TransferOutcome:
    fn = getattr(call, "transfer", None)
    if not callable(fn):
        return TransferOutcome("not_supported", None, f"transfer is {NOT_SUPPORTED}")
    try:
        outcome = await fn(target, fallback="bridge" if bridge else None)
    except ControlError as exc:
        return TransferOutcome("failed", None, exc.message)
    if not isinstance(outcome, TransferOutcome):
        return TransferOutcome("failed", None, f"unexpected transfer outcome {outcome!r}")
    return outcome


async def start_recording(call: object, channels: str) -> str | None:
    """The recording's id; ``Unsupported``, or the call's ``ControlError``."""
    result = await _maybe_await(_method(call, "start_recording")(channels))
    return None if result is None else str(result)


async def stop_recording(call: object) -> None:
    await _maybe_await(_method(call, "stop_recording")())


def _method(call: object, name: str) -> Any:
    fn = getattr(call, name, None)
    if not callable(fn):
        raise Unsupported(f"recording is {NOT_SUPPORTED}")
    return fn


async def _maybe_await(value: object) -> object:
    return await value if inspect.isawaitable(value) else value


def sip_target(target: str, info: CallInfo) -> str:
    """A transfer target as a SIP URI: ``sip:``/``sips:`` as given; a number (or a ``tel:``
    URI) as ``sip:<number>@<host>``, the host being the far end of this call (the trunk or PBX
    the call came from or went to, which knows where its numbers go)."""
    if target.lower().startswith(("sip:", "sips:")):
        return target
    number = target[4:] if target.lower().startswith("tel:") else target
    remote = info.remote.strip("<>")
    host = remote.split("@", 1)[1] if "@" in remote else remote.partition(":")[2]
    host = host.split(";", 1)[0].split(">", 1)[0].split("?", 1)[0] or "localhost"
    return f"sip:{number}@{host}"
