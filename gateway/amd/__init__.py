"""Answering-machine detection (AMD) on an answered call's first seconds, sans-I/O.

Three signals on 20 ms int16 frames at 8 kHz: the energy and word-timing state machine of
Asterisk's ``app_amd`` (``heuristic``), a tone detector for the voicemail beep (``beep``), and,
where a transcript exists, jambonz's word-count and phrase rule (``words``). ``detector`` joins
them into :class:`~gateway.amd.detector.AmdDetector`, whose events carry the media time of each
decision; ``commands`` is the offline ``voxgate amd FILE.wav``."""
