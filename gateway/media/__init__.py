"""Sans-I/O media of a call: playout of the agent's utterances (fades, order, underruns) and
the echo-aware barge-in detector, batched across calls."""
