"""`python -m harness.netproxy`: the proxy process (harness/netproxy/proxy.py)."""

from harness.netproxy.proxy import main

if __name__ == "__main__":
    raise SystemExit(main())
