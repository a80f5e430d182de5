"""Agents: what talks to the caller.  ``base`` holds the interface (events in, say out),
``ivr`` the embedded DTMF menu."""
