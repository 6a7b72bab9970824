"""The whole suite: Locust (gevent's monkey-patching) is imported before anything else, as
`kvgate run` does, so modules that import aiohttp or ssl in-process (the network-fault proxy,
the release probe's tests) never run unpatched beside Locust's tests.

Property tests never judge time: Hypothesis's per-example deadline and its "too slow" health
check read the wall clock, which a busy neighbour moves, so the suite's profile turns both
off (a test may still set its own number of examples).
"""

import locust  # noqa: F401
from hypothesis import HealthCheck, settings

settings.register_profile(
    "kvgate", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("kvgate")
