"""voxgate synthesis worker: text frontend, streaming engines, bus, worker loop."""
