"""Benchmarks (``voxgate bench ...``), the Markdown report and its plots, and the test clients
they drive calls with (SIP/RTP client, aiortc browser client, an in-process local gateway).

Registered by :mod:`voxgate.cli`; nothing in ``gateway``, ``synth`` or ``dsp`` imports it.
"""
