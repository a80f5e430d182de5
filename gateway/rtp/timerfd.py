"""A Linux timerfd on CLOCK_MONOTONIC: the media ticker's wake-up at a sub-millisecond deadline.

Why not ``loop.call_at``: uvloop's clock is libuv's ``uv_now``, CLOCK_MONOTONIC truncated to
whole milliseconds and read once per loop iteration, and libuv sleeps in ``epoll_wait`` with
a whole-millisecond timeout. A timer due at ``t`` therefore fires at ``t`` plus the
fractional millisecond the loop's clock was behind when it went to sleep: 0-1 ms late,
uniformly (measured on the 2-core EPYC with nothing else to do: p50 0.63, p95 1.09 ms), which
is most of a 2 ms send-time budget before any work is done. asyncio's own loop rounds its
``epoll`` timeout up to the millisecond the same way. A timerfd armed at an absolute
CLOCK_MONOTONIC deadline (``timerfd_settime(2)`` with ``TFD_TIMER_ABSTIME``) becomes readable
on the kernel's high-resolution timer, and the loop wakes on the fd like on any socket:
p50 0.06, p95 0.11 ms on the same box. It is what C media servers do (FreeSWITCH's timerfd
timer, Asterisk's res_timing_timerfd).

Python gets ``os.timerfd_create`` only in 3.13; this is the same three calls through ctypes
(one ``timerfd_settime`` costs ~4 µs, once per wake-up, not per call). ``TimerFd.create``
returns None where there is none (not Linux, no libc symbol), and the caller keeps
``loop.call_at``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import time

_TFD_TIMER_ABSTIME = 1  # timerfd_settime(2): it_value is an absolute time on the fd's clock


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes = [ctypes.c_int, ctypes.c_int]
    create.restype = ctypes.c_int
    settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
    settime.restype = ctypes.c_int
    return libc


class TimerFd:
    """One one-shot timer: ``arm_at(t)`` (CLOCK_MONOTONIC seconds, ``time.monotonic``'s base)
    makes :meth:`fileno` readable at ``t``; :meth:`clear` consumes the expiry (call it in the
    reader callback); ``disarm`` cancels. Non-blocking and close-on-exec."""

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._settime = libc.timerfd_settime
        self._fd = fd
        self._spec = _Itimerspec()
        self._ref = ctypes.byref(self._spec)

    @classmethod
    def create(cls) -> TimerFd | None:
        libc = _libc()
        if libc is None:
            return None
        fd = libc.timerfd_create(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        return cls(libc, fd)

    @classmethod
    def available(cls) -> bool:
        fd = cls.create()
        if fd is None:
            return False
        fd.close()
        return True

    def fileno(self) -> int:
        return self._fd

    def arm_at(self, t: float) -> None:
        # A deadline already past fires at once (timerfd_settime(2)); 0 would disarm it.
        sec = int(t)
        value = self._spec.it_value
        value.tv_sec = sec
        value.tv_nsec = max(1, min(999_999_999, int((t - sec) * 1e9)))
        self._set(_TFD_TIMER_ABSTIME)

    def disarm(self) -> None:
        value = self._spec.it_value
        value.tv_sec = value.tv_nsec = 0
        self._set(0)

    def _set(self, flags: int) -> None:
        if self._settime(self._fd, flags, self._ref, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    def clear(self) -> bool:
        """Consume the expiry count; False if the timer had not fired (a spurious wake-up)."""
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return False
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        # Only reached once no loop watches the fd (the loop's reader holds the ticker).
        self.close()
