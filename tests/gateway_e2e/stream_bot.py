"""The bridge tests' pipecat bot lives in :mod:`voxgate.bench.pipecat_bot` (the benchmark runs
it too); ``python -m tests.gateway_e2e.stream_bot`` still starts it."""

from voxgate.bench.pipecat_bot import ACCOUNT_SID, GOODBYE, GREETING, STORY, main

__all__ = ["ACCOUNT_SID", "GOODBYE", "GREETING", "STORY", "main"]

if __name__ == "__main__":
    main()
