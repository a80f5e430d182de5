"""Logging set-up shared by every voxgate process: plain text or one JSON object per line."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
import types
from collections.abc import Iterator, Mapping

# Correlation fields of the code running now (a call's tasks, a worker's request task): every
# JSON log line carries them unless the record names its own via ``extra=``. Each asyncio task
# works on a copy of the context it was created in, so binding inside a task stays in it.
_NO_CONTEXT: Mapping[str, str] = types.MappingProxyType({})
_LOG_CONTEXT: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "voxgate_log_context", default=_NO_CONTEXT
)


def bind_log_context(**fields: str) -> None:
    """Add correlation fields (call_id, utterance_id, trace_id, worker) to the current context
    (for the rest of this task, and the tasks it creates from now on)."""
    _LOG_CONTEXT.set({**_LOG_CONTEXT.get(), **{k: v for k, v in fields.items() if v}})


@contextlib.contextmanager
def log_context(**fields: str) -> Iterator[None]:
    """``bind_log_context`` for a block only."""
    token = _LOG_CONTEXT.set({**_LOG_CONTEXT.get(), **{k: v for k, v in fields.items() if v}})
    try:
        yield
    finally:
        _LOG_CONTEXT.reset(token)


class JsonFormatter(logging.Formatter):
    # Fields a record may carry via ``extra=`` (or the bound log context) that operators
    # correlate on.
    CONTEXT = ("call_id", "utterance_id", "trace_id", "worker")

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        bound = _LOG_CONTEXT.get()
        for key in self.CONTEXT:
            value = getattr(record, key, None) or bound.get(key)
            if value:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
