"""What the dialler's sipp callees say, made here with the real tools: speech from espeak-ng
(``-w``), tones and silence from sox, joined and converted by sox to 8 kHz mono G.711 μ-law WAV
files (what sipp's ``<exec rtp_stream="file.wav,loops,0"/>`` streams as PCMU).

Each builder returns the file and where its parts lie (ms from the file's start), so a test
knows when the beep ends on the wire without guessing.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

Int16Array = npt.NDArray[np.int16]

RATE = 8000
PERSON_TEXT = "Hello?"
MACHINE_TEXT = (
    "Hi, you have reached Dana Morgan. I can't take your call right now. "
    "Please leave a message after the tone."
)
BEEP_HZ = 1000.0
BEEP_S = 0.5


@dataclass(frozen=True, slots=True)
class Clip:
    """A callee's audio file and its parts (ms from the start of the file)."""

    path: Path
    duration_ms: int
    speech_ms: tuple[int, int]
    beep_ms: tuple[int, int] | None = None


def need_tools() -> None:
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (deploy/ensure-test-tools.sh installs it)")


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=60)


def _duration_ms(path: Path) -> int:
    out = subprocess.run(
        ["soxi", "-D", str(path)], check=True, capture_output=True, text=True, timeout=30
    ).stdout
    return round(float(out) * 1000)


def _speech(text: str, path: Path, voice: str) -> int:
    """``text`` spoken by espeak-ng at 8 kHz 16-bit, its leading/trailing silence trimmed
    (so the clip's parts are where the builder says); returns its length in ms."""
    raw = path.with_suffix(".raw.wav")
    _run("espeak-ng", "-v", voice, "-s", "165", "-w", str(raw), text)
    _run(
        "sox", str(raw), "-r", str(RATE), "-c", "1", "-b", "16", str(path),
        "silence", "1", "0.02", "1%", "reverse", "silence", "1", "0.02", "1%", "reverse",
    )  # fmt: skip
    raw.unlink()
    return _duration_ms(path)


def _silence(seconds: float, path: Path) -> None:
    _run("sox", "-n", "-r", str(RATE), "-c", "1", "-b", "16", str(path),
         "trim", "0", f"{seconds:g}")  # fmt: skip


def _tone(hz: float, seconds: float, path: Path) -> None:
    _run("sox", "-n", "-r", str(RATE), "-c", "1", "-b", "16", str(path),
         "synth", f"{seconds:g}", "sine", f"{hz:g}", "vol", "0.5")  # fmt: skip


def _ulaw(parts: list[Path], out: Path) -> None:
    """The parts joined, as 8 kHz mono μ-law WAV (sipp streams the data chunk as PCMU)."""
    _run("sox", *map(str, parts), "-r", str(RATE), "-c", "1", "-e", "u-law", "-b", "8", str(out))


def person(workdir: Path, *, lead_s: float = 0.4, after_s: float = 6.0) -> Clip:
    """A person: a moment of line noise-free silence, "Hello?", then silence."""
    need_tools()
    d = workdir / "person-parts"
    d.mkdir(exist_ok=True)
    speech_ms = _speech(PERSON_TEXT, d / "hello.wav", "en-us")
    _silence(lead_s, d / "lead.wav")
    _silence(after_s, d / "after.wav")
    out = workdir / "person.wav"
    _ulaw([d / "lead.wav", d / "hello.wav", d / "after.wav"], out)
    start = round(lead_s * 1000)
    return Clip(out, _duration_ms(out), (start, start + speech_ms))


def machine(
    workdir: Path, *, lead_s: float = 0.3, gap_s: float = 0.4, after_s: float = 4.0
) -> Clip:
    """An answering machine: a long greeting, a short pause, a 1 kHz beep, then silence."""
    need_tools()
    d = workdir / "machine-parts"
    d.mkdir(exist_ok=True)
    speech_ms = _speech(MACHINE_TEXT, d / "greeting.wav", "en-us")
    _silence(lead_s, d / "lead.wav")
    _silence(gap_s, d / "gap.wav")
    _tone(BEEP_HZ, BEEP_S, d / "beep.wav")
    _silence(after_s, d / "after.wav")
    out = workdir / "machine.wav"
    _ulaw([d / "lead.wav", d / "greeting.wav", d / "gap.wav", d / "beep.wav", d / "after.wav"], out)
    start = round(lead_s * 1000)
    beep_start = start + speech_ms + round(gap_s * 1000)
    return Clip(
        out, _duration_ms(out), (start, start + speech_ms),
        (beep_start, beep_start + round(BEEP_S * 1000)),
    )  # fmt: skip


def pcm(clip: Clip) -> Int16Array:
    """The clip decoded to int16 (through sox, so the test reads what sipp streams)."""
    raw = clip.path.with_suffix(".s16")
    _run("sox", str(clip.path), "-t", "raw", "-e", "signed", "-b", "16", "-c", "1", str(raw))
    data = np.frombuffer(raw.read_bytes(), dtype="<i2").astype(np.int16)
    raw.unlink()
    return data
