"""Text columns held as categoricals (gates/rundir.py, schema.CATEGORY_COLUMNS): the few
things pandas does differently for a categorical than for text, done as text would do them.

A categorical compares, selects and groups as its text does. Where it does not: counting
its values (a categorical's own `value_counts` lists every category, seen or not, in
category order), filling or concatenating text (a value outside its categories is refused),
and mapping it (the mapping runs over the categories). Metrics count with `counts` and turn
the few rows they spell out into text (`astype(str)`) before filling or concatenating; a
regular expression or a prefix over a whole column runs once per category (`per_category`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd


def counts(values: pd.Series) -> pd.Series:
    """`values.value_counts()` as over text: each value seen, commonest first, ties in the
    order they first appear, missing values left out."""
    if not isinstance(values.dtype, pd.CategoricalDtype):
        return values.value_counts()
    codes = values.cat.codes.to_numpy()
    codes = codes[codes >= 0]
    seen = pd.unique(codes)
    found = np.bincount(codes, minlength=len(values.cat.categories))[seen]
    index = pd.Index(values.cat.categories.take(seen), name=values.name)
    counted = pd.Series(found.astype(np.int64), index=index, name="count")
    return counted.sort_values(ascending=False, kind="stable")


def per_category(values: pd.Series, fn: Callable[[pd.Series], pd.Series]) -> pd.Series:
    """`fn(values)` for an `fn` that reads each value on its own (a pattern, a prefix):
    over a categorical, computed once per category (and once for a missing value) and
    spread over the rows by code, instead of once per row."""
    if not isinstance(values.dtype, pd.CategoricalDtype):
        return fn(values)
    # every category once, after a missing value: position = code + 1
    each = np.arange(-1, len(values.cat.categories))
    found = fn(pd.Series(pd.Categorical.from_codes(each, dtype=values.dtype)))
    rows = np.asarray(values.cat.codes, dtype=np.int64) + 1
    return pd.Series(found.array.take(rows), index=values.index, name=found.name)
