"""The host's CPU while a run goes on: the samples the harness writes of it
(harness/samplers/host.py), and how much of it other processes may take before the run's
timings stop being the system's (gates/evidence/checks_host.py judges by these)."""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class HostCpu(StrEnum):
    """The samples' metric names (source `host`, target `host`), each in cores (CPU-seconds
    per second) over the second before its row's `t`, but CPUS, a count."""

    CPUS = "kvgate_host_cpus"  # the logical CPUs the host's counters cover
    BUSY = "kvgate_host_cpu_busy_cores"  # everything but idle, iowait and steal
    STEAL = "kvgate_host_cpu_steal_cores"  # what the hypervisor gave to other machines
    KVGATE = "kvgate_host_cpu_kvgate_cores"  # the run's process and all its descendants
    TARGET = "kvgate_host_cpu_target_cores"  # the target's process trees on this host
    # busy - (kvgate's and the target's, counted once), clipped at 0, plus steal
    FOREIGN = "kvgate_host_cpu_foreign_cores"
    # value 1, label `reason`: a second whose foreign CPU could not be told (a target on this
    # host whose process nobody could find), said instead of a guess
    UNMEASURED = "kvgate_host_cpu_unmeasured"


# Other processes may use at most this share of the host's CPUs on average over the load
# (half a core on a 2-core host), and at most FOREIGN_WINDOW_BOUND_SHARE in any
# FOREIGN_WINDOW_S seconds of it; beyond either the run is INVALID. Why these numbers:
# gates/evidence/checks_host.py. A plan sets its own (samplers.foreign_cpu_bound_share,
# samplers.foreign_cpu_window_bound_share), and meta.json keeps the run's.
FOREIGN_MEAN_BOUND_SHARE: Final = 0.25
FOREIGN_WINDOW_BOUND_SHARE: Final = 0.5
FOREIGN_WINDOW_S: Final = 10.0

# The load generator's event loop may wake this late at p99 over the load before the run is
# INVALID (harness/looplag.py measures it; gates/evidence/checks_client.py says why this
# number). A plan sets its own (samplers.loop_lag_bound_ms), and meta.json keeps the run's.
LOOP_LAG_BOUND_MS: Final = 50.0


# How kvgate starts every process tree of a run (the target's servers, their replicas, the
# samplers, Locust's workers, a fault's command): `process_group=OWN_GROUP` in
# subprocess.Popen and asyncio.create_subprocess_exec, a process group of its own (the
# child's pid), so os.killpg reaches all of it and a terminal's Ctrl-C reaches kvgate alone,
# which stops the trees in order.
#
# Never a session of its own (start_new_session): Linux's scheduler autogroups
# (kernel.sched_autogroup_enabled, on by default) share the CPUs between sessions before
# threads. With vLLM in a session of its own on a 2-core host, the load generator's thread
# waited 0.5-4.2 s of every second in the run queue (/proc/<tid>/schedstat), its event loop
# lagged up to 4.2 s, and cancellation bursts reached vLLM one request at a time: critical
# TTFT p95 read 0.27-1.8 s where the same load with one session's processes sharing the CPUs
# read 0.15 s. In one session the kernel shares the CPUs between threads, and the niceness
# kvgate gives its background work (the running checks, a replica's tokenizer pool) means
# what it says.
OWN_GROUP: Final = 0
