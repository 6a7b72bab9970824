"""`healthy_needs_n`: the samples a PASS needs on a healthy system, named before any data,
agree with what the verdict does with such data: the reading is proven at that count and
not one sample earlier, and `needs_n` names the same count for a healthy sample too small."""

from __future__ import annotations

import numpy as np
import pytest

from gates.estimate import Reading, estimate, healthy_needs_n, needs_n, read
from gates.sequential import Decided, decide
from gates.terms import Threshold

CONFIDENCE = 0.95
# (threshold, min_samples, one healthy observation): every observation on the pass side.
HEALTHY = [
    ("rate >= 0.99", 1, 1.0),
    ("rate > 0.99", 1, 1.0),
    ("rate <= 0.01", 1, 0.0),
    ("p(99) < 2", 1, 0.1),
    ("p(95) <= 0.9", 1, 0.1),
    ("p(5) >= 1", 1, 2.0),
    ("p(95) <= 0.9", 100, 0.1),
]


def _reading(text: str, min_samples: int, value: float, n: int) -> Reading:
    threshold = Threshold.model_validate(text)
    values = np.full(n, value)
    return read(estimate(values, threshold, CONFIDENCE), threshold, min_samples, n)[0]


@pytest.mark.parametrize(("text", "min_samples", "value"), HEALTHY)
def test_a_healthy_sample_is_proven_at_the_count_named_and_not_before(
    text: str, min_samples: int, value: float
) -> None:
    n = healthy_needs_n(Threshold.model_validate(text), min_samples, CONFIDENCE)
    assert n is not None
    assert _reading(text, min_samples, value, n) is Reading.PROVEN
    assert _reading(text, min_samples, value, n - 1) is Reading.UNPROVEN


@pytest.mark.parametrize(("text", "min_samples", "value"), HEALTHY)
def test_needs_n_names_the_same_count_for_a_healthy_sample_too_small(
    text: str, min_samples: int, value: float
) -> None:
    threshold = Threshold.model_validate(text)
    values = np.full(5, value)
    est = estimate(values, threshold, CONFIDENCE)
    after = needs_n(values, est, threshold, min_samples, len(values), CONFIDENCE)
    assert after == healthy_needs_n(threshold, min_samples, CONFIDENCE)


def test_the_seed_gates_needs() -> None:
    """The figures the plans are written against (gates/README.md)."""

    def n(text: str, min_samples: int = 1) -> int | None:
        return healthy_needs_n(Threshold.model_validate(text), min_samples, CONFIDENCE)

    assert n("rate >= 0.99") == 381
    assert n("p(99) < 2") == 368
    assert n("p(95) <= 0.9") == 72


@pytest.mark.parametrize(("text", "min_samples"), [("count == 0", 30), ("max <= 0.15", 30)])
def test_an_exact_statistic_needs_its_min_samples(text: str, min_samples: int) -> None:
    threshold = Threshold.model_validate(text)
    assert healthy_needs_n(threshold, min_samples, CONFIDENCE) == min_samples
    no_violation = np.zeros(0) if threshold.statistic == "count" else np.zeros(min_samples)
    est = estimate(no_violation, threshold, CONFIDENCE)
    assert read(est, threshold, min_samples, min_samples)[0] is Reading.PROVEN
    assert read(est, threshold, min_samples, min_samples - 1)[0] is Reading.UNPROVEN


@pytest.mark.parametrize("text", ["mean < 3", "slope <= 0"])
def test_a_mean_or_a_slope_needs_what_only_the_data_can_say(text: str) -> None:
    assert healthy_needs_n(Threshold.model_validate(text), 1, CONFIDENCE) is None


@pytest.mark.parametrize(("text", "min_samples", "value"), HEALTHY)
def test_the_anytime_count_is_where_the_anytime_bound_first_decides_a_healthy_stream(
    text: str, min_samples: int, value: float
) -> None:
    """What a load that runs until decided waits for: the confidence sequence decides PASS
    at the count named, not one observation earlier, and never before the fixed-n count."""
    threshold = Threshold.model_validate(text)
    n = healthy_needs_n(threshold, min_samples, CONFIDENCE, anytime=True)
    fixed = healthy_needs_n(threshold, min_samples, CONFIDENCE)
    assert n is not None and fixed is not None and n >= fixed

    def state(m: int) -> Decided:
        values = np.full(m, value)
        return decide(values, threshold, 1 - CONFIDENCE, min_samples=min_samples).state

    assert state(n) is Decided.PASS
    assert state(n - 1) is Decided.UNDECIDED


def test_the_anytime_needs_of_the_seed_gates() -> None:
    def n(text: str, min_samples: int = 1) -> int | None:
        threshold = Threshold.model_validate(text)
        return healthy_needs_n(threshold, min_samples, CONFIDENCE, anytime=True)

    assert n("rate >= 0.99") == n("rate > 0.99") == n("p(99) < 2") == 607
    assert n("p(95) <= 0.9") == 177
    assert n("count == 0", 30) == 30  # an exact statistic needs its min_samples either way
