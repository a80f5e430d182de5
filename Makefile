# The two README commands: `make serve` and `make test`. Both create .venv/ and install voxgate.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test lint redis tools clean bench

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,torch,stt,pipecat]'
	touch $(STAMP)

# The embedded gateway + worker answering with the built-in call flow (the IVR menu as verbs).
serve: $(STAMP)
	$(BIN)/voxgate serve --agent-kind flow

# A Redis server normally runs on 127.0.0.1:6379 here; start (or install) one if not.
redis:
	@deploy/ensure-redis.sh

# Real SIP peers for the interop tests (sipp, baresip) and speech tools; installed if missing.
tools:
	@deploy/ensure-test-tools.sh

test: $(STAMP) redis tools
	$(BIN)/ruff check gateway synth dsp voxgate tests
	$(BIN)/mypy
	$(BIN)/pytest -q --durations=25

bench: $(STAMP)
	$(BIN)/voxgate bench synth

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
