"""Synchronous audio DSP blocks with explicit state, each with a one-shot twin."""
