"""voxgate gateway: SIP/RTP and WebRTC legs, calls, agents, and the command line."""
