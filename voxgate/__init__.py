"""voxgate's composition root and shared contract.

- :mod:`voxgate.contract`: what the gateway and the synthesis worker share (the bus schema and
  buses, the configuration, logging, the text chunker): neither ``gateway`` nor ``synth``
  imports the other; both import this.
- :mod:`voxgate.cli` and :mod:`voxgate.serve`: the ``voxgate`` command and ``voxgate serve``,
  which puts a gateway and a worker in one process.
- :mod:`voxgate.bench`: benchmarks, the report, and the SIP/WebRTC test clients (never imported
  by the product).
"""
