"""The load generator kept up: its own event loop woke on time while the load ran.

Every send, every cancellation and every read of a stream passes through the load
generator's event loop (harness/looplag.py). When that loop waits in the operating system's
run queue, requests go out late, cancellations close their streams late, and the run's
latencies are the load generator's. The host-contention check cannot see every cause: on a
2-core host a vLLM started in a session of its own took the CPUs from kvgate's loop through
the scheduler's autogroups (contract.host.OWN_GROUP) while other processes used 0.27 of a
core; the loop lagged up to 4.2 s, cancellation bursts reached vLLM one request at a time,
and a correct configuration read FAIL. So the loop's lateness is evidence of its own: its
p99 over the load above the run's bound makes the run INVALID, with findings that doubt
timing, as the host check's do (gates/evaluator.py, rule 1).

The bound, 50 ms by default (contract/host.py; samplers.loop_lag_bound_ms, kept in
meta.json's `load_generator`): an eighteenth of the critical first-token line (900 ms), and
far from both sides of what was measured on a 2-core host, where a loop that kept up woke
at most a few milliseconds late at p99 and a starved one seconds late. Half the bound is a
note. A run recorded before kvgate measured its loop has no finding.
"""

from __future__ import annotations

from typing import Any

from contract.host import LOOP_LAG_BOUND_MS
from gates import schema
from gates.evidence.base import Effect, Finding, evidence_check
from gates.rundir import RunData

CHECK = "loop_kept_up"
NOTICED = 0.5  # of the bound: noted, though the run is judged


@evidence_check(CHECK, order=235)
def loop_kept_up(run: RunData) -> list[Finding]:
    """The load generator's event loop woke within its bound at p99 while the load ran."""
    generator = run.meta.get("load_generator")
    generator = generator if isinstance(generator, dict) else {}
    lag = generator.get("loop_lag_ms")
    if not isinstance(lag, dict) or not isinstance(lag.get("p99"), int | float):
        return []
    bound = _bound(generator)
    p99, worst, ticks = float(lag["p99"]), lag.get("max"), lag.get("ticks")
    said = f"{p99:g} ms late at p99 (max {worst} ms over {ticks} wakes of 10 ms)"
    if p99 > bound:
        return [
            Finding(
                CHECK,
                Effect.INVALID,
                f"the load generator's event loop woke {said}, past its bound of {bound:g} ms "
                "(samplers.loop_lag_bound_ms): its sends, cancellations and reads went late, "
                "and the run's latencies are partly its own. Run on a quieter host, spread "
                "the load over more processes (--processes), and start a target on this "
                "host from kvgate's session: one started from another terminal is shared the "
                "CPUs as a separate scheduler group (contract/host.py, OWN_GROUP)",
                table=schema.SAMPLES,
                doubts_timing=True,
            )
        ]
    if p99 > NOTICED * bound:
        return [
            Finding(
                CHECK,
                Effect.NOTE,
                f"the load generator's event loop woke {said}, over half its bound of "
                f"{bound:g} ms: the run is judged, on a host that kept it waiting",
                table=schema.SAMPLES,
            )
        ]
    return []


def _bound(generator: dict[str, Any]) -> float:
    value = generator.get("loop_lag_bound_ms")
    return float(value) if isinstance(value, int | float) and value > 0 else LOOP_LAG_BOUND_MS
