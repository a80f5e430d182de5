"""The voicemail beep: a steady single tone of 200 ms or more between 400 and 2000 Hz.

Each 20 ms hop looks at the last 40 ms (320 samples, Hann window) through a bank of Goertzel
filters on the 25 Hz grid of that window (the bank's outputs are the window's DFT bins, so the
bank is evaluated as one matrix product instead of 65 recurrences). A hop is *tonal* when

- the window is loud enough (``min_dbfs``), and
- the strongest bank filter between ``min_hz`` and ``max_hz`` holds, with its two neighbours on
  each side (a Hann main lobe is 4 bins wide), at least ``concentration`` of the window's whole
  energy (Parseval: the sum of all bins' power is ``N`` times the windowed energy).

A beep is a run of tonal hops whose peak bin moves by at most one bin from hop to hop, lasting at
least ``min_ms``; it is reported when the run ends (the tone stops or changes), with its mean
frequency (parabolic interpolation between bins) and its end time, since voicemail starts after
the beep. Voiced speech is harmonic: its energy is spread over several harmonics and its pitch
glides, so one bin rarely holds most of it for 200 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

RATE = 8000
HOP = 160  # 20 ms
WINDOW = 320  # 40 ms: 25 Hz bins
BIN_HZ = RATE / WINDOW

Int16Array = npt.NDArray[np.int16]
Float64Array = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class BeepConfig:
    min_hz: float = 400.0
    max_hz: float = 2000.0
    min_ms: int = 200
    concentration: float = 0.8
    min_dbfs: float = -45.0

    def __post_init__(self) -> None:
        # The telephone band (G.711 over a PSTN trunk passes about 300–3400 Hz).
        if not 300.0 <= self.min_hz < self.max_hz <= 3400.0:
            raise ValueError(
                "amd: beep band must satisfy 300 <= min_hz < max_hz <= 3400 Hz, "
                f"not {self.min_hz:g}..{self.max_hz:g}"
            )
        if self.min_ms < 40 or self.min_ms % 20:
            raise ValueError(
                f"amd: beep min_ms must be a multiple of 20 and >= 40, not {self.min_ms}"
            )
        if not 0.0 < self.concentration <= 1.0:
            raise ValueError(f"amd: beep concentration must be in (0, 1], not {self.concentration}")
        if self.min_dbfs >= 0:
            raise ValueError(f"amd: beep min_dbfs must be negative, not {self.min_dbfs}")


@dataclass(frozen=True, slots=True)
class Beep:
    """A tone that lasted ``duration_ms`` and ended at media time ``end_ms``."""

    frequency_hz: float
    start_ms: int
    end_ms: int

    @property
    def duration_ms(self) -> int:
        return self.end_ms - self.start_ms


@dataclass(frozen=True, slots=True)
class Hop:
    """One hop's analysis (exposed for tests and tuning)."""

    tonal: bool
    bin: int
    frequency_hz: float
    concentration: float


class BeepDetector:
    """Streaming beep detector with explicit state; :meth:`process` takes one 20 ms frame."""

    def __init__(self, config: BeepConfig | None = None) -> None:
        self.config = config or BeepConfig()
        c = self.config
        lo = int(np.floor(c.min_hz / BIN_HZ))
        hi = int(np.ceil(c.max_hz / BIN_HZ))
        # Two guard bins on each side so a peak at the band's edge has its whole main lobe.
        self._bins = np.arange(lo - 2, hi + 3)
        self._band = (self._bins >= lo) & (self._bins <= hi)
        n = np.arange(WINDOW)
        self._window = np.hanning(WINDOW + 2)[1:-1]  # periodic-ish, no zero end points
        self._bank = np.exp(-2j * np.pi * np.outer(self._bins, n) / WINDOW)
        self._min_energy = WINDOW * (32768.0 * 10 ** (c.min_dbfs / 20)) ** 2
        self._prev = np.zeros(HOP, np.float64)
        self.elapsed_ms = 0
        self._run_start = -1
        self._run_bin = -1
        self._run_freqs: list[float] = []

    def analyse(self, frame: Int16Array) -> Hop:
        """The hop's analysis over the last 40 ms; advances the state (call once per frame)."""
        if len(frame) != HOP:
            raise ValueError(f"amd: frames are {HOP} samples, not {len(frame)}")
        cur = frame.astype(np.float64)
        block = np.concatenate((self._prev, cur))
        self._prev = cur
        self.elapsed_ms += 20
        energy = float(np.dot(block, block))
        if energy < self._min_energy:
            return Hop(False, -1, 0.0, 0.0)
        xw = block * self._window
        power = np.abs(self._bank @ xw) ** 2
        # The strongest filter of the whole bank, guards included: a tone just out of band
        # leaks into the band's edge filter, and must not pass for an in-band tone.
        k = int(np.argmax(power))
        if not self._band[k]:
            return Hop(False, int(self._bins[k]), float(self._bins[k] * BIN_HZ), 0.0)
        # All bins' power (full spectrum) = N * windowed energy; the bank holds one side only,
        # a real tone puts half its power in each side, hence the factor 2.
        total = WINDOW * float(np.dot(xw, xw))
        conc = 2.0 * float(power[k - 2 : k + 3].sum()) / max(total, 1e-12)
        a, b, g = power[k - 1], power[k], power[k + 1]
        denom = a - 2 * b + g
        delta = 0.5 * (a - g) / denom if denom != 0 else 0.0
        freq = float((self._bins[k] + delta) * BIN_HZ)
        return Hop(conc >= self.config.concentration, int(self._bins[k]), freq, conc)

    def process(self, frame: Int16Array) -> Beep | None:
        """Feed one frame; returns a beep on the frame where a long enough tone ended."""
        hop = self.analyse(frame)
        now = self.elapsed_ms
        ended: Beep | None = None
        continues = hop.tonal and self._run_start >= 0 and abs(hop.bin - self._run_bin) <= 1
        if self._run_start >= 0 and not continues:
            # The run's last tonal window ended one hop ago; a window is tonal as soon as the
            # tone fills either half of it, so the tone's end is placed mid-window (± 20 ms).
            end = now - 40
            if end - self._run_start >= self.config.min_ms:
                ended = Beep(float(np.mean(self._run_freqs)), self._run_start, end)
            self._run_start = -1
            self._run_freqs = []
        if hop.tonal:
            if self._run_start < 0:
                # Mid-window, as for the end: the tone began within the last 40 ms.
                self._run_start = max(now - 20, 0)
            self._run_bin = hop.bin
            self._run_freqs.append(hop.frequency_hz)
        return ended

    def flush(self) -> Beep | None:
        """At the end of a recording: a tone still sounding counts if it is long enough."""
        end = self.elapsed_ms  # the last window was tonal: the tone lasted to the end
        if self._run_start >= 0 and end - self._run_start >= self.config.min_ms:
            beep = Beep(float(np.mean(self._run_freqs)), self._run_start, end)
            self._run_start = -1
            self._run_freqs = []
            return beep
        return None
