"""The SIP leg: user agent (UAS/UAC) over the sans-I/O transaction layer, UDP/TCP
transport, registration with a trunk."""
