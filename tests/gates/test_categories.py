"""Counting a categorical as text counts (gates/categories.py): the notes and reports list
outcomes and reasons in the order text gives, with no category that was never seen."""

from __future__ import annotations

import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from gates.categories import counts

VALUES = st.sampled_from(["ok", "rejected", "error", "timeout", None])


@given(st.lists(VALUES, max_size=40))
def test_counts_of_a_categorical_are_those_of_its_text(values: list[str | None]) -> None:
    text = pd.Series(values, dtype="str", name="outcome")
    # categories in another order than the values', and one never seen
    coded = text.astype(pd.CategoricalDtype(["zzz", "timeout", "rejected", "ok", "error"]))
    pd.testing.assert_series_equal(counts(coded), text.value_counts())
    pd.testing.assert_series_equal(counts(text), text.value_counts())
