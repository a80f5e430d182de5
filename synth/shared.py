"""One rendering of a prompt, followed by every utterance that asks for it while it runs.

The render cache only helps once a rendering has finished. An IVR's calls ask for the same
greeting together: 100 calls answered in one burst were 100 engine runs of one text, each
queued behind the others' chunks, which is where a greeting under load started seconds late.
And a greeting that callers keep cutting short (a key pressed, a hang-up, barge-in) never
finished, so it was never cached and every caller paid a cold render.

A ``SharedRender`` is the rendering of one cache key (text, voice, profile, engine: what fixes
the audio), as a task of its own. An utterance asking for a key that is being rendered follows
it: it publishes the chunks already made at once, then each new one as it comes. The rendering
goes on while anyone follows it. When the last follower leaves (cancelled), it stops, unless
the key has been asked for before (a repeated prompt) and is short enough to keep: then it
finishes at background priority, one step at a time, for the cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from synth.cache import CachedChunk, CacheKey, Rendering
from synth.render import Rendered, Renderer


@dataclass(slots=True)
class SharedChunk:
    chunk: CachedChunk
    compute_s: float  # engine + DSP wall time of this chunk


# Runs one renderer step on the worker's pool at a priority; background=True: below every
# utterance's, and one such step at a time in the worker.
StepRunner = Callable[[Renderer, int, bool], Awaitable[Rendered | None]]


@dataclass(eq=False)
class SharedRender:
    key: CacheKey
    renderer: Renderer
    keep_when_abandoned: bool  # finish for the cache once nobody follows
    chunks: list[SharedChunk] = field(default_factory=list)
    done: bool = False  # the final chunk is in ``chunks``
    abandoned: bool = False  # stopped early: nobody followed and not worth finishing
    error: BaseException | None = None
    followers: int = 0
    # Asked when nobody follows any more and it is worth keeping: whether the worker has room
    # for one more rendering nobody hears (it bounds how many wait for the background turn).
    may_finish: Callable[[], bool] = lambda: True
    unheard: bool = False  # some of it was rendered with nobody following (for the cache)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def finished(self) -> bool:
        return self.done or self.abandoned or self.error is not None

    def follow(self) -> None:
        self.followers += 1

    def leave(self) -> None:
        self.followers -= 1
        self._notify()  # a rendering waiting on nobody re-checks its priority

    async def wait_beyond(self, n: int) -> None:
        """Return once more than ``n`` chunks exist, or the rendering has finished."""
        while len(self.chunks) <= n and not self.finished:
            changed = self._changed
            await changed.wait()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def run(self, step: StepRunner, on_done: Callable[[SharedRender], None]) -> None:
        """Render to the end (or until abandoned); ``on_done`` once complete, error or not."""
        try:
            seq = 0
            while True:
                background = self.followers <= 0
                if background and not (self.keep_when_abandoned and self.may_finish()):
                    self.renderer.stop_requested = True
                    self.abandoned = True
                    return
                self.unheard |= background
                # First chunks jump the queue; later ones take turns in arrival order.
                out = await step(self.renderer, 0 if seq == 0 else 1, background)
                if out is None:
                    self.done = True
                    return
                if out.data or out.words:
                    self.chunks.append(
                        SharedChunk(CachedChunk(out.data, out.offset, out.words), out.compute_s)
                    )
                    seq += 1
                    self._notify()
                if out.final:
                    self.done = True
                    return
        except asyncio.CancelledError:
            self.renderer.stop_requested = True
            self.abandoned = True
            raise
        except Exception as exc:
            self.error = exc
        finally:
            self._notify()
            on_done(self)

    def rendering(self) -> Rendering:
        """The finished rendering, as the cache keeps it."""
        return Rendering(
            self.renderer.rate, tuple(c.chunk for c in self.chunks), self.renderer.samples
        )
