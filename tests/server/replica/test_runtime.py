"""The replica's start-up check: a configured KV pool too big for its device is warned of,
as each policy declares whether its pool is the configured one."""

from __future__ import annotations

import pytest

from server.engine.gpus import get_gpu, get_model_compute
from server.engine.sim import VirtualGpu
from server.replica.runtime import pool_too_big
from server.scheduler import SchedulerConfig
from server.scheduler.policies import POLICIES, SeedPolicy


class _DevicePoolSeed(SeedPolicy):
    """The seed's policy, but sized as naive is: from whatever memory the device has left."""

    pool_from_config = False


def device(config: SchedulerConfig) -> VirtualGpu:
    profile = config.profile
    return VirtualGpu(
        get_gpu("h100-80gb"), profile, get_model_compute(profile.name), config.block_bytes
    )


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_pool_that_fits_beside_the_weights_is_no_warning(name: str) -> None:
    config = SchedulerConfig()  # the seed's 52 GiB beside an 8B model on 80 GB
    assert pool_too_big(POLICIES[name](), config, device(config), config.block_bytes) is None


def test_a_configured_pool_too_big_for_the_device_is_warned_of_by_what_the_policy_declares() -> (
    None
):
    config = SchedulerConfig(kv_pool_gib=78.0)
    gpu = device(config)
    warning = pool_too_big(SeedPolicy(), config, gpu, config.block_bytes)
    assert warning is not None and "lower kv_pool_gib" in warning and "h100-80gb" in warning
    # a policy whose pool is what the device has left has no configured size to check,
    # whatever it is called
    assert not POLICIES["naive"].pool_from_config
    assert pool_too_big(POLICIES["naive"](), config, gpu, config.block_bytes) is None
    assert pool_too_big(_DevicePoolSeed(), config, gpu, config.block_bytes) is None
