"""Text columns held as categoricals (gates/rundir.py, schema.CATEGORY_COLUMNS): the few
things pandas does differently for a categorical than for text, done as text would do them.

A categorical compares, selects and groups as its text does. Where it does not: counting
its values (a categorical's own `value_counts` lists every category, seen or not, in
category order), filling or concatenating text (a value outside its categories is refused),
and mapping it (the mapping runs over the categories). Metrics count with `counts` and turn
the few rows they spell out into text (`astype(str)`) before filling or concatenating.
"""

from __future__ import annotations

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
