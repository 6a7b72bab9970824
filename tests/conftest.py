"""The whole suite: Locust (gevent's monkey-patching) is imported before anything else, as
`kvgate run` does, so modules that import aiohttp or ssl in-process (the network-fault proxy,
the release probe's tests) never run unpatched beside Locust's tests."""

import locust  # noqa: F401
