"""A bounded cache of finished renderings, keyed by what determines the audio.

Call-centre agents repeat themselves: every caller of an IVR hears the same greeting and menu.
Rendering them once and replaying the chunks turns 100 simultaneous greetings from 100 engine
runs into one, which is what keeps first audio fast when calls arrive together. Only complete
renderings are stored (a cancelled one is not), least recently used first out, bounded in bytes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from voxgate.contract.bus.schema import Word


@dataclass(frozen=True, slots=True)
class CachedChunk:
    data: bytes
    offset: int
    words: tuple[Word, ...]


@dataclass(frozen=True, slots=True)
class Rendering:
    rate: int
    chunks: tuple[CachedChunk, ...]
    samples: int

    @property
    def nbytes(self) -> int:
        return sum(len(c.data) for c in self.chunks)


CacheKey = tuple[str, bool, str, str, str]  # text, raw, voice, profile, engine


class RenderCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[CacheKey, Rendering] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: CacheKey) -> Rendering | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item

    def put(self, key: CacheKey, rendering: Rendering) -> None:
        size = rendering.nbytes
        if size > self.max_bytes:
            return  # one huge rendering must not flush everything else
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._items[key] = rendering
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= evicted.nbytes

    def __contains__(self, key: CacheKey) -> bool:
        """Whether ``key`` is held (counts neither a hit nor a miss, moves nothing)."""
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes
