"""The contract both processes share: bus (schema, memory and Redis buses), config, logs, the
text chunker (how streamed text becomes utterances) and the Prometheus exposition helpers.

Imports nothing of ``gateway`` or ``synth``.
"""
