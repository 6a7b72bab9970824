"""A gate's standing while the load runs (decided, n, n needed, settled), and what the verdict
of a load that ran until its key gates were decided says about how it ended."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from gates.evaluator import evaluate_run
from gates.registry import Observations
from gates.spec import GateSpec
from gates.standing import standing
from gates.verdict import Status
from tests.gates.builder import RunBuilder


def gate(threshold: str, metric: str = "availability", min_samples: int = 1) -> GateSpec:
    return GateSpec.model_validate(
        {"id": "g", "title": "g", "metric": metric, "pass": threshold, "key": True,
         "blocks": False, "min_samples": min_samples}
    )  # fmt: skip


def observed(values: list[float] | np.ndarray, examined: int | None = None) -> Observations:
    frame = pd.DataFrame({"value": np.asarray(values, dtype=float)})
    return Observations(frame=frame, n_samples=len(frame) if examined is None else examined)


def test_a_rate_is_settled_only_by_its_anytime_bound() -> None:
    line = gate("rate >= 0.99")
    early = standing(line, observed(np.ones(300)))
    assert early["decision"] == "UNDECIDED" and not early["settled"]
    assert early["n"] == 300 and early["needs_n"] == 607
    assert early["bound_text"].startswith("[0.9")
    done = standing(line, observed(np.ones(700)))
    assert done["decision"] == "PASS" and done["settled"] and done["settled_by"] == "anytime bound"
    failed = standing(line, observed(np.r_[np.zeros(60), np.ones(240)]))
    assert failed["decision"] == "FAIL" and failed["settled"]


def test_a_count_or_a_maximum_is_settled_by_what_was_observed_once_it_has_its_samples() -> None:
    """Its bound never decides a PASS before the end of the run: the value at the end is what
    the run observed, so more load would not make its pass surer."""
    cap = gate("max <= 0.15", metric="tenant_share", min_samples=30)
    thin = standing(cap, observed(np.full(20, 0.1)))
    assert thin["decision"] == "UNDECIDED" and not thin["settled"] and thin["needs_n"] == 30
    enough = standing(cap, observed(np.full(30, 0.1)))
    assert enough["decision"] == "UNDECIDED" and enough["settled"]
    assert enough["settled_by"] == "observed"
    over = standing(cap, observed(np.r_[np.full(30, 0.1), 0.2]))
    assert over["decision"] == "FAIL" and over["settled_by"] == "anytime bound"
    # a maximum of nothing is no data (the verdict's INVALID for a key gate): not settled
    assert not standing(cap, observed([], examined=40))["settled"]
    # no violation among 500 records examined: a count of 0, settled
    no_oom = standing(gate("count == 0", metric="oom_events"), observed([], examined=500))
    assert no_oom["settled"] and no_oom["n"] == 500
    unsure = observed(np.full(30, 0.1))
    unsure.unsure = ["a share that could be over the cap"]
    assert not standing(cap, unsure)["settled"]


def test_a_gate_that_does_not_apply_holds_nothing() -> None:
    result = standing(gate("rate >= 0.99"), None)
    assert result["decision"] == "N/A" and result["settled"]


def until_run(path: Path, until: dict[str, object] | None) -> Path:
    b = RunBuilder()
    for i in range(300):
        b.request(f"r{i}", t=20 + i * 0.2, ttft_s=0.1)
    if until is not None:
        b.meta["until"] = until
    return b.write(path)


UNTIL = {
    "rule": "decided",
    "min_duration_s": 10.0,
    "max_duration_s": 90.0,
    "looks": 8,
    "looked_at_s": 85.0,
    "stopped_at_s": 90.1,
}


def test_the_verdict_says_which_key_gates_were_undecided_at_the_maximum(tmp_path: Path) -> None:
    record = {
        **UNTIL,
        "decided": False,
        "stopped_because": "it reached max_duration_s with gates undecided",
        "gates": [
            {"id": "availability", "decision": "UNDECIDED", "settled": False, "n": 280,
             "needs_n": 607},
            {"id": "no_oom", "decision": "UNDECIDED", "settled": True, "n": 900, "needs_n": 1},
        ],
    }  # fmt: skip
    verdict = evaluate_run(until_run(tmp_path / "run", record))
    availability = next(g for g in verdict.gates if g.id == "availability")
    assert availability.status == Status.INVALID and availability.needs_n == 381
    [note] = [n for n in verdict.notes if n.startswith("load.until")]
    assert note == (
        "load.until: decided: the load stopped at +90 s (min 10 s, max 90 s): it reached "
        "max_duration_s with gates undecided; gates undecided at its last look "
        "(+85 s): availability (UNDECIDED, n 280 of about 607 by the anytime bound; 381 at "
        "fixed n)"
    )


def test_the_verdict_of_a_decided_load_says_when_and_judges_as_always(tmp_path: Path) -> None:
    record = {**UNTIL, "decided": True, "decided_at_s": 40.0, "stopped_at_s": 41.5,
              "stopped_because": "every key gate decided at +40 s", "gates": []}  # fmt: skip
    verdict = evaluate_run(until_run(tmp_path / "run", record))
    plain = evaluate_run(until_run(tmp_path / "plain", None))
    assert verdict.status == plain.status and verdict.score == plain.score
    assert [g.status for g in verdict.gates] == [g.status for g in plain.gates]
    assert not [n for n in plain.notes if n.startswith("load.until")]
    assert (
        "load.until: decided: the load stopped at +42 s (min 10 s, max 90 s): every key gate "
        "decided at +40 s; the verdict judges all that was collected, at fixed n"
    ) in verdict.notes
