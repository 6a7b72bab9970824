"""kvgate's TCP fault proxy, the engine of the `network` fault kind: the proxy process
(proxy.py, run as `python -m harness.netproxy`), its toxics (toxics.py) and the blocking
client that starts it and adds and removes toxics (client.py)."""
