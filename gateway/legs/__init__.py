"""The asyncio adapters that join calls to the wire: ``sip/`` (user agent, transport,
registration; RTP through ``gateway.rtp``) and ``webrtc/`` (one aiortc peer per browser)."""
