"""voxgate's voice in a pipecat pipeline: :class:`VoxgateTTSService`, a pipecat ``TTSService``
that speaks through voxgate's synthesis workers.

Text goes to the workers over voxgate's bus (Redis Streams, or the in-memory bus when the worker
runs in the same process) as ``SpeakRequest`` entries, exactly as the gateway sends them; the
audio chunks the worker streams back become ``TTSAudioRawFrame``\\ s. The service behaves like
pipecat's streaming websocket services (Cartesia, ElevenLabs):

- ``run_tts(text, context_id)`` submits one utterance and returns at once (it yields ``None``);
  one reader task per service drains the service's audio stream and appends each chunk to its
  pipecat audio context with ``append_to_audio_context``.
- All sentences of an LLM turn share one audio context (pipecat's default
  ``reuse_context_id_within_turn``): each sentence is its own utterance on the bus, submitted as
  soon as pipecat hands it over, so the worker renders them concurrently; their audio is
  appended in sentence order (a later sentence's chunks wait until the one before has ended).
  The context ends with ``TTSStoppedFrame`` + ``remove_audio_context`` once pipecat has flushed
  the turn and every utterance of it has ended.
- ``on_audio_context_interrupted`` cancels the context's utterances on the bus (the worker stops
  within one chunk); late chunks of a cancelled utterance are dropped.
- The worker's word alignments (``AudioChunk.words``: sample spans at the chunk's rate) become
  pipecat word timestamps (``add_word_timestamps``, seconds from the start of the context's
  audio), so ``TTSTextFrame``\\ s follow what has actually been played. The words are the spoken
  form the worker's text frontend produced ("twelve dollars" for "$12"); pipecat's word matcher
  pairs them with the LLM's text and completes the rest when the context ends.

Profiles: ``"narrowband"`` is voxgate's telephone chain (3.8 kHz anti-alias, 8 kHz, mid-band EQ,
limiter) — the voice callers hear on a voxgate phone call; ``"wideband"`` asks the worker for the
pipeline's own output rate when it is one the worker renders (16, 24, 32, 44.1 or 48 kHz), else
for the next higher one. Audio whose rate is not the pipeline's (narrowband in a 16 or 24 kHz
pipeline, wideband at 22.05 kHz) is resampled here with voxgate's streaming polyphase resampler
(``dsp.resample``), band-limited to the lower of the two rates.

Failures become ``ErrorFrame``\\ s (pushed upstream) and never a hang: a bus that cannot be
reached or closes, a request the worker refuses (``text_too_long``, ``unknown_voice``, ...) and
an utterance without audio for ``audio_timeout_s`` (no worker, a dead Redis) each end the
utterance, and its audio context still ends with ``TTSStoppedFrame``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService
from pipecat.transcriptions.language import Language
from pipecat.utils.errors import ErrorCategory

from dsp.pcm import float_to_s16le_bytes, s16le_bytes_to_float
from dsp.resample import Resampler
from voxgate.contract.bus import make_bus
from voxgate.contract.bus.base import Bus, BusError, Subscription
from voxgate.contract.bus.schema import (
    ERR_BAD_REQUEST,
    ERR_EMPTY_TEXT,
    ERR_TEXT_TOO_LONG,
    ERR_UNKNOWN_VOICE,
    PROFILES,
    WIDEBAND_RATES,
    AudioChunk,
    AudioMessage,
    Profile,
    SchemaError,
    SpeakRequest,
    UtteranceEnd,
    UtteranceError,
)
from voxgate.contract.config import BusConfig

__all__ = ["NARROWBAND_RATE", "VoxgateTTSService"]

log = logging.getLogger("voxgate.pipecat")

NARROWBAND_RATE = 8000
# Worker error codes that say the request itself was wrong (not the service's health).
_REQUEST_ERRORS = {ERR_TEXT_TOO_LONG, ERR_EMPTY_TEXT, ERR_UNKNOWN_VOICE, ERR_BAD_REQUEST}

# What an utterance's audio becomes before it is appended: a frame, or (word, seconds from the
# utterance's first sample).
_Item = TTSAudioRawFrame | tuple[str, float]


@dataclass(eq=False, slots=True)
class _Utterance:
    """One ``SpeakRequest`` on the bus: a sentence of an audio context."""

    id: str
    context_id: str
    submitted_at: float  # time.monotonic()
    last_message_at: float  # time.monotonic() of the submit or of the latest message
    next_seq: int = 0
    samples: int = 0  # output samples (at the pipeline's rate) produced so far
    base_s: float = 0.0  # where it starts in its context's audio (set once it is the head)
    resampler: Resampler | None = None
    resampler_rate: int = 0
    backlog: list[_Item] = field(default_factory=list)  # held while an earlier one plays
    done: bool = False


@dataclass(eq=False, slots=True)
class _Context:
    """A pipecat audio context: its utterances in order; the head one streams."""

    id: str
    utterances: deque[_Utterance] = field(default_factory=deque)
    closed: bool = False  # no more text will come for it (pipecat flushed it)
    played_s: float = 0.0  # audio of the utterances that have ended, in seconds


class VoxgateTTSService(TTSService):
    """A pipecat TTS service on voxgate's synthesis workers (see the module docstring).

    Args:
        bus: a started voxgate bus to use (e.g. the ``MemoryBus`` of an in-process worker); the
            caller owns it (starts and closes it).
        redis_url: else the service opens (and closes) its own ``RedisBus`` to this server
            (default: voxgate's default ``redis://127.0.0.1:6379/0``).
        bus_prefix: key prefix of the voxgate deployment on that Redis (``bus.prefix``).
        profile: ``"narrowband"`` (8 kHz telephone chain) or ``"wideband"``.
        sample_rate: output rate of the frames; None: the pipeline's ``audio_out_sample_rate``.
        voice: the worker voice to ask for; ``""``: the worker's default. Also updatable with
            ``TTSUpdateSettingsFrame(delta=TTSSettings(voice=...))``.
        raw_text: send text as already spoken (skip the worker's text normalizer).
        audio_timeout_s: an utterance that gets no audio message for this long (from its
            submission, or from its previous chunk) is given up with an ``ErrorFrame``; it is
            also the request's deadline on the worker.
        bus_timeout_s: limit of one bus operation (submit, subscribe, cancel).
        call_id: the call id the service's utterances carry on the bus (its audio stream is
            ``synth:audio:{call_id}``); default ``pipecat-<random>``.
        settings: pipecat settings merged over the defaults (``voice``, ``language``).
        **kwargs: passed to pipecat's ``TTSService`` (``text_aggregation_mode``,
            ``text_transforms``, ...).

    ``first_audio_s`` holds, per utterance, the seconds from its submission to its first audio
    frame (the latest 1000).
    """

    def __init__(
        self,
        *,
        bus: Bus | None = None,
        redis_url: str | None = None,
        bus_prefix: str = "voxgate",
        profile: Profile = "narrowband",
        sample_rate: int | None = None,
        voice: str = "",
        raw_text: bool = False,
        audio_timeout_s: float = 10.0,
        bus_timeout_s: float = 3.0,
        call_id: str | None = None,
        settings: TTSSettings | None = None,
        **kwargs: Any,
    ) -> None:
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r} (expected narrowband or wideband)")
        if bus is not None and redis_url is not None:
            raise ValueError("pass bus= or redis_url=, not both")
        if audio_timeout_s <= 0 or bus_timeout_s <= 0:
            raise ValueError("audio_timeout_s and bus_timeout_s must be positive")
        defaults = TTSSettings(model=None, voice=voice or None, language=Language.EN)
        if settings is not None:
            defaults.apply_update(settings)
        # pipecat ends an audio context that gets no item for this long; ours end sooner (every
        # utterance ends by audio_timeout_s), so pipecat's timer is only a last resort.
        kwargs.setdefault("stop_frame_timeout_s", audio_timeout_s + 2.0)
        super().__init__(
            push_text_frames=False,  # TTSTextFrames come from the worker's word timings
            push_start_frame=True,  # the base opens the audio context with TTSStartedFrame
            pause_frame_processing=False,  # every chunk names its utterance, hence its context
            sample_rate=sample_rate,
            settings=defaults,
            **kwargs,
        )
        self._vg_given_bus = bus
        self._vg_redis_url = redis_url or BusConfig().redis_url
        self._vg_prefix = bus_prefix
        self._vg_owned_bus: Bus | None = None
        self._vg_profile: Profile = profile
        self._vg_raw = raw_text
        self._vg_audio_timeout_s = audio_timeout_s
        self._vg_bus_timeout_s = bus_timeout_s
        self._vg_call_id = call_id or f"pipecat-{uuid.uuid4().hex}"
        self._vg_sub: Subscription | None = None
        self._vg_reader: asyncio.Task[None] | None = None
        # Cancels in flight: sent in the background so an interruption never waits on the bus.
        self._vg_cancels: set[asyncio.Task[None]] = set()
        self._vg_contexts: dict[str, _Context] = {}
        self._vg_utterances: dict[str, _Utterance] = {}
        # Every change of the two maps above and every append to a context happens under this
        # lock: the reader task, run_tts (process task) and interruptions (input task) all touch
        # them, and a context's items must be appended in order.
        self._vg_lock = asyncio.Lock()
        self._vg_worker_rate = NARROWBAND_RATE
        self._vg_poll_s = 0.1
        # Set from EndFrame/CancelFrame on: pipecat flushes leftover text after stop(), when
        # nothing plays any more; it is not sent to a worker.
        self._vg_closing = False
        # Submit → first audio frame appended, per utterance (seconds), newest last.
        self.first_audio_s: deque[float] = deque(maxlen=1000)

    # --- what the service is ------------------------------------------------------------------
    @property
    def call_id(self) -> str:
        """The call id the service's utterances carry on the bus."""
        return self._vg_call_id

    @property
    def profile(self) -> Profile:
        return self._vg_profile

    @property
    def worker_rate(self) -> int:
        """The rate asked of the worker (known once the pipeline has started)."""
        return self._vg_worker_rate

    def can_generate_metrics(self) -> bool:
        return True

    @property
    def supports_processing_metrics(self) -> bool:
        # run_tts only submits; TTFB/TTFA carry the latency.
        return False

    def _pick_worker_rate(self) -> int:
        if self._vg_profile == "narrowband":
            return NARROWBAND_RATE
        rate = self.sample_rate
        if rate in WIDEBAND_RATES:
            return rate
        higher = [r for r in WIDEBAND_RATES if r >= rate]
        return min(higher) if higher else max(WIDEBAND_RATES)

    # --- lifecycle ----------------------------------------------------------------------------
    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        self._vg_closing = False
        self._vg_worker_rate = self._pick_worker_rate()
        error = await self._vg_connect()
        if error is not None:
            # Not fatal: run_tts tries again and reports each utterance it cannot speak.
            await self.push_error(error_msg=error, category=ErrorCategory.CONNECTIVITY)

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)  # returns once every audio context has played
        self._vg_closing = True
        await self._vg_teardown()

    async def cancel(self, frame: CancelFrame) -> None:
        self._vg_closing = True
        await super().cancel(frame)
        await self._vg_teardown()

    async def cleanup(self) -> None:
        self._vg_closing = True
        await super().cleanup()  # type: ignore[no-untyped-call]  # pipecat leaves it unannotated
        await self._vg_teardown()

    def _vg_bus(self) -> Bus:
        if self._vg_given_bus is not None:
            return self._vg_given_bus
        if self._vg_owned_bus is None:
            self._vg_owned_bus = make_bus("redis", self._vg_redis_url, self._vg_prefix)
        return self._vg_owned_bus

    async def _vg_connect(self) -> str | None:
        """Subscribe to the service's audio stream and start its reader; an error, or None."""
        if self._vg_sub is not None:
            return None
        bus = self._vg_bus()
        try:
            async with asyncio.timeout(self._vg_bus_timeout_s):
                if bus is self._vg_owned_bus:
                    await bus.start()  # idempotent; retried after a failure
                sub = await bus.subscribe(self._vg_call_id)
        except (BusError, OSError, TimeoutError) as exc:
            reason = str(exc) or f"no answer within {self._vg_bus_timeout_s:g} s"
            return f"voxgate bus unreachable: {reason}"
        self._vg_sub = sub
        self._vg_reader = self.create_task(self._vg_read(sub), name="voxgate-audio")
        await self._call_event_handler("on_connected")
        return None

    async def _vg_teardown(self) -> None:
        """Stop reading, cancel what is still in flight, release the bus (idempotent)."""
        reader, self._vg_reader = self._vg_reader, None
        if reader is not None:
            await self.cancel_task(reader)
        async with self._vg_lock:
            pending = [u.id for u in self._vg_utterances.values()]
            self._vg_utterances.clear()
            self._vg_contexts.clear()
        self._vg_cancel_later(pending)
        if self._vg_cancels:
            await asyncio.wait(set(self._vg_cancels), timeout=self._vg_bus_timeout_s + 1.0)
        sub, self._vg_sub = self._vg_sub, None
        bus = self._vg_given_bus or self._vg_owned_bus
        if sub is not None:
            with contextlib.suppress(BusError, OSError):
                await sub.close()
            if bus is not None:
                with contextlib.suppress(BusError, OSError, TimeoutError):
                    async with asyncio.timeout(self._vg_bus_timeout_s):
                        await bus.drop_call(self._vg_call_id)
            await self._call_event_handler("on_disconnected")
        owned, self._vg_owned_bus = self._vg_owned_bus, None
        if owned is not None:
            with contextlib.suppress(BusError, OSError):
                await owned.close()

    # --- text in ------------------------------------------------------------------------------
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Submit ``text`` as one utterance of ``context_id``; its audio arrives on the reader."""
        if self._vg_closing:
            log.info("pipeline ending: not speaking %r", text[:80])
            async with self._vg_lock:
                if context_id not in self._vg_contexts:
                    await self._vg_end_context(context_id)
            return
        now = time.monotonic()
        utt = _Utterance(uuid.uuid4().hex, context_id, now, now)
        async with self._vg_lock:
            ctx = self._vg_contexts.get(context_id)
            if ctx is None:
                ctx = self._vg_contexts[context_id] = _Context(context_id)
            if not ctx.utterances:
                utt.base_s = ctx.played_s
            ctx.utterances.append(utt)
            self._vg_utterances[utt.id] = utt
            # Text outside a turn (a bare TextFrame) gets a context of its own that nothing
            # flushes: it is complete with this one utterance.
            if context_id != self._turn_context_id:
                ctx.closed = True
        error = await self._vg_connect()
        category = ErrorCategory.CONNECTIVITY
        if error is None:
            settings_voice = self._settings.voice
            voice = settings_voice if isinstance(settings_voice, str) else ""
            try:
                request = SpeakRequest(
                    call_id=self._vg_call_id,
                    utterance_id=utt.id,
                    text=text,
                    voice=voice,
                    profile=self._vg_profile,
                    deadline=time.time() + self._vg_audio_timeout_s,
                    trace_id=context_id,
                    raw=self._vg_raw,
                    rate=self._vg_worker_rate if self._vg_profile == "wideband" else 0,
                )
                async with asyncio.timeout(self._vg_bus_timeout_s):
                    await self._vg_bus().submit(request)
            except SchemaError as exc:
                error = f"voxgate refused the request: {exc}"
                category = ErrorCategory.INVALID_REQUEST
            except (BusError, OSError, TimeoutError) as exc:
                reason = str(exc) or f"no answer within {self._vg_bus_timeout_s:g} s"
                error = f"voxgate bus unreachable, utterance not spoken: {reason}"
        if error is not None:
            yield ErrorFrame(error=error, category=category)
            async with self._vg_lock:
                await self._vg_finish(utt)
            return
        await self.start_tts_usage_metrics(text)
        yield None

    async def flush_audio(self, context_id: str | None = None) -> None:
        """pipecat's turn is complete: end the context once its utterances have ended."""
        flush_id = context_id or self.get_active_audio_context_id()
        if not flush_id:
            return
        async with self._vg_lock:
            ctx = self._vg_contexts.get(flush_id)
            if ctx is not None:
                ctx.closed = True
                await self._vg_advance(ctx)
            elif self.audio_context_available(flush_id):
                # Opened by pipecat without any text reaching us (an unusable service).
                await self._vg_end_context(flush_id)

    # --- interruptions ------------------------------------------------------------------------
    async def on_audio_context_interrupted(self, context_id: str) -> None:
        async with self._vg_lock:
            ctx = self._vg_contexts.pop(context_id, None)
            self._vg_cancel_later(self._vg_forget(ctx) if ctx is not None else [])
        await super().on_audio_context_interrupted(context_id)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, InterruptionFrame):
            # Whatever pipecat dropped without telling us (a context it had already timed out)
            # is cancelled too; uninterruptible contexts are still there and go on.
            async with self._vg_lock:
                for ctx in list(self._vg_contexts.values()):
                    if not self.audio_context_available(ctx.id):
                        del self._vg_contexts[ctx.id]
                        self._vg_cancel_later(self._vg_forget(ctx))

    def _vg_forget(self, ctx: _Context) -> list[str]:
        """Drop a context's utterances (late chunks are then ignored); the ids still running."""
        running = []
        for utt in ctx.utterances:
            if not utt.done:
                running.append(utt.id)
            utt.done = True
            self._vg_utterances.pop(utt.id, None)
        ctx.utterances.clear()
        return running

    def _vg_cancel_later(self, utterance_ids: list[str]) -> None:
        """Tell the workers to stop these utterances, without waiting for the bus."""
        bus = self._vg_given_bus or self._vg_owned_bus
        if bus is None or not utterance_ids:
            return
        task = asyncio.get_running_loop().create_task(self._vg_cancel_on_bus(bus, utterance_ids))
        self._vg_cancels.add(task)
        task.add_done_callback(self._vg_cancels.discard)

    async def _vg_cancel_on_bus(self, bus: Bus, utterance_ids: list[str]) -> None:
        for utterance_id in utterance_ids:
            try:
                async with asyncio.timeout(self._vg_bus_timeout_s):
                    await bus.cancel(utterance_id)
            except (BusError, OSError, TimeoutError) as exc:
                log.warning("could not cancel utterance %s: %s", utterance_id, exc or "timeout")

    # --- audio out ----------------------------------------------------------------------------
    async def _vg_read(self, sub: Subscription) -> None:
        """The reader task: the service's audio stream → audio contexts; timeouts."""
        while True:
            t0 = time.monotonic()
            message = await sub.get(timeout=self._vg_poll_s)
            if message is None and getattr(sub, "closed", False):
                await self._vg_bus_lost(sub)
                return
            try:
                if message is not None:
                    async with self._vg_lock:
                        await self._vg_on_message(message)
                elif time.monotonic() - t0 < self._vg_poll_s / 10:
                    await asyncio.sleep(self._vg_poll_s)  # a subscription answering None at once
                await self._vg_check_timeouts()
            except Exception:  # a bug here must not silence every later utterance
                log.exception("voxgate audio reader: unexpected failure; going on")

    async def _vg_on_message(self, msg: AudioMessage) -> None:
        utt = self._vg_utterances.get(msg.utterance_id)
        if utt is None or msg.seq < utt.next_seq:
            return  # cancelled, given up, or a re-render by a worker that claimed it
        utt.last_message_at = time.monotonic()
        if isinstance(msg, AudioChunk):
            utt.next_seq = msg.seq + 1
            await self._vg_chunk(utt, msg)
        elif isinstance(msg, UtteranceEnd):
            await self._vg_flush_resampler(utt)
            if msg.reason == "deadline":
                await self.push_error(
                    error_msg=f"voxgate worker gave up utterance {utt.id}: its deadline passed",
                    category=ErrorCategory.SERVER,
                )
            await self._vg_finish(utt)
        elif isinstance(msg, UtteranceError):
            request_error = msg.code in _REQUEST_ERRORS
            await self.push_error(
                error_msg=f"voxgate could not speak utterance {utt.id}: {msg.code}: {msg.message}",
                category=ErrorCategory.INVALID_REQUEST if request_error else ErrorCategory.SERVER,
            )
            await self._vg_flush_resampler(utt)
            await self._vg_finish(utt)

    async def _vg_chunk(self, utt: _Utterance, chunk: AudioChunk) -> None:
        audio = chunk.data
        if chunk.rate != self.sample_rate:
            if utt.resampler is None or utt.resampler_rate != chunk.rate:
                low = min(chunk.rate, self.sample_rate)
                utt.resampler = Resampler.for_rates(
                    chunk.rate, self.sample_rate, pass_hz=0.45 * low, stop_hz=0.5 * low
                )
                utt.resampler_rate = chunk.rate
            audio = float_to_s16le_bytes(utt.resampler.process(s16le_bytes_to_float(audio)))
        await self._vg_audio(utt, audio)
        for word in chunk.words:
            await self._vg_emit(utt, (word.word, word.start / chunk.rate))

    async def _vg_flush_resampler(self, utt: _Utterance) -> None:
        if utt.resampler is not None:
            tail = utt.resampler.process(np.zeros(0, np.float32), last=True)
            utt.resampler = None
            await self._vg_audio(utt, float_to_s16le_bytes(tail))

    async def _vg_audio(self, utt: _Utterance, audio: bytes) -> None:
        if not audio:
            return
        if utt.samples == 0:
            self.first_audio_s.append(time.monotonic() - utt.submitted_at)
        utt.samples += len(audio) // 2
        frame = TTSAudioRawFrame(audio, self.sample_rate, 1, context_id=utt.context_id)
        await self._vg_emit(utt, frame)

    async def _vg_emit(self, utt: _Utterance, item: _Item) -> None:
        ctx = self._vg_contexts.get(utt.context_id)
        if ctx is None:
            return
        if ctx.utterances and ctx.utterances[0] is utt:
            await self._vg_append(ctx, utt, item)
        else:
            utt.backlog.append(item)  # an earlier sentence of the context is still playing

    async def _vg_append(self, ctx: _Context, utt: _Utterance, item: _Item) -> None:
        if isinstance(item, TTSAudioRawFrame):
            await self.append_to_audio_context(ctx.id, item)
        else:
            word, at_s = item
            await self.add_word_timestamps([(word, utt.base_s + at_s)], ctx.id)

    async def _vg_finish(self, utt: _Utterance) -> None:
        """The utterance has ended (done, cancelled, failed): move its context on."""
        if utt.done:
            return
        utt.done = True
        self._vg_utterances.pop(utt.id, None)
        ctx = self._vg_contexts.get(utt.context_id)
        if ctx is not None:
            await self._vg_advance(ctx)

    async def _vg_advance(self, ctx: _Context) -> None:
        """Pop ended head utterances (the next one's held audio goes out), end a finished one."""
        while ctx.utterances and ctx.utterances[0].done:
            head = ctx.utterances.popleft()
            ctx.played_s = head.base_s + head.samples / self.sample_rate
            if ctx.utterances:
                nxt = ctx.utterances[0]
                nxt.base_s = ctx.played_s
                backlog, nxt.backlog = nxt.backlog, []
                for item in backlog:
                    await self._vg_append(ctx, nxt, item)
        if ctx.closed and not ctx.utterances:
            self._vg_contexts.pop(ctx.id, None)
            await self._vg_end_context(ctx.id)

    async def _vg_end_context(self, context_id: str) -> None:
        if self.audio_context_available(context_id):
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)

    # --- failures -----------------------------------------------------------------------------
    async def _vg_check_timeouts(self) -> None:
        now = time.monotonic()
        late = [
            u
            for u in self._vg_utterances.values()
            if now - u.last_message_at > self._vg_audio_timeout_s
        ]
        if not late:
            return
        bus = self._vg_bus()
        try:
            async with asyncio.timeout(self._vg_bus_timeout_s):
                reachable = await bus.ping()
        except (BusError, OSError, TimeoutError):
            reachable = False
        why = (
            "the bus is unreachable"
            if not reachable
            else "is a `voxgate worker` serving this bus (same Redis and prefix)?"
        )
        for utt in late:
            if utt.done:
                continue  # ended (interrupted) while the bus was asked
            waited = now - utt.last_message_at
            what = (
                "no audio from any synthesis worker"
                if utt.next_seq == 0
                else "the audio stopped: nothing more from the synthesis worker"
            )
            await self.push_error(
                error_msg=f"voxgate: {what} for {waited:.1f} s (utterance {utt.id}); {why}",
                category=ErrorCategory.CONNECTIVITY if not reachable else ErrorCategory.SERVER,
            )
            self._vg_cancel_later([utt.id])
            async with self._vg_lock:
                await self._vg_flush_resampler(utt)
                await self._vg_finish(utt)

    async def _vg_bus_lost(self, sub: Subscription) -> None:
        """The subscription closed under us (the bus was closed): end everything in flight."""
        async with self._vg_lock:
            if self._vg_sub is sub:
                self._vg_sub = None
                self._vg_reader = None
            pending = list(self._vg_utterances.values())
            if pending:
                await self.push_error(
                    error_msg=(
                        f"voxgate bus lost (its subscription closed): {len(pending)} "
                        "utterance(s) not spoken to the end"
                    ),
                    category=ErrorCategory.CONNECTIVITY,
                )
            for utt in pending:
                await self._vg_flush_resampler(utt)
                await self._vg_finish(utt)
        await self._call_event_handler("on_disconnected")
