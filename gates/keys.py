"""Text keys as integers: a column's values coded once, so that sorts, group-bys and joins
on a request id run as numpy over integers instead of pandas over text (which hashes the
strings again at each step, and copies them at each row selection: the bulk of the
analysis's time on a run of millions of requests).

The reader codes the request ids of both tables once, over one dictionary (`one_dictionary`):
each is a categorical whose codes are the same integer for the same id in either table. The
functions here take those codes as they are; given text (a table built another way), they
hash it as before. A categorical with as many categories as a run has requests must not be
grouped, mapped or matched against text by pandas itself, which would hash every category
again: the metrics join and group on these codes instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc


def text_codes(values: pd.Series) -> np.ndarray:
    """One integer per value, equal values equal codes, -1 where missing: a categorical's
    own codes, else text numbered in order of first appearance (sorting the texts themselves
    would cost more than the rest)."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        return np.asarray(values.cat.codes, dtype=np.int64)
    codes, _ = pd.factorize(values, use_na_sentinel=True)
    return np.asarray(codes, dtype=np.int64)


def one_dictionary(*columns: pd.Series) -> list[pd.Series]:
    """The columns as categoricals over one dictionary of all their texts, in order of first
    appearance: an id has the same code in each of them, so they join and match as integers
    (`shared_codes`, `first_index`, `isin`). Missing stays missing."""
    codes, texts = shared_codes(*columns)
    dtype = pd.CategoricalDtype(pd.Index(texts, dtype=texts.dtype))
    return [
        pd.Series(
            pd.Categorical.from_codes(c, dtype=dtype, validate=False),
            index=column.index,
            name=column.name,
        )
        for c, column in zip(codes, columns, strict=True)
    ]


def dictionary(*columns: pd.Series | pd.Index | pd.Categorical) -> pd.Index | None:
    """The categories the columns share, when each is a categorical over the very same
    dictionary (one_dictionary's, or a selection of it); None otherwise."""
    found = [getattr(c, "dtype", None) for c in columns]
    kinds = [d for d in found if isinstance(d, pd.CategoricalDtype)]
    if len(kinds) != len(columns) or any(d.categories is not kinds[0].categories for d in kinds):
        return None
    categories: pd.Index = kinds[0].categories
    return categories


def _codes(values: pd.Series | pd.Index | pd.Categorical) -> np.ndarray:
    """A categorical's codes (-1 where missing), as int64."""
    raw = values.codes if isinstance(values, pd.Categorical | pd.CategoricalIndex) else None
    if raw is None:
        raw = pd.Series(values).cat.codes
    return np.asarray(raw, dtype=np.int64)


def pair_codes(first: np.ndarray, second: np.ndarray, n_second: int) -> np.ndarray:
    """One code per pair of codes (`second`'s run below `n_second`): equal pairs, equal
    codes; a missing value (-1) is a value of its own, as in a pandas MultiIndex or a merge,
    which match missing keys with missing keys."""
    codes: np.ndarray = (first + 1) * (n_second + 1) + (second + 1)
    return codes


def shared_codes(*columns: pd.Series) -> tuple[list[np.ndarray], pd.Index]:
    """Codes of several text columns over one dictionary (equal texts, equal codes, whichever
    column they are in; -1 where missing), and the texts by code."""
    shared = dictionary(*columns)
    if shared is not None:
        return [_codes(c) for c in columns], shared
    codes, texts = pd.factorize(pd.concat(columns, ignore_index=True), use_na_sentinel=True)
    bounds = np.cumsum([0, *(len(c) for c in columns)])
    return [np.asarray(codes[a:b], dtype=np.int64) for a, b in pairwise(bounds)], texts


def per_distinct(
    rows: pd.DataFrame, columns: Sequence[str], fn: Callable[[pd.DataFrame], pd.Series]
) -> pd.Series:
    """`fn(rows)`, for an `fn` whose value in a row depends only on that row's `columns`:
    computed once per distinct combination of them (a missing value is one of its own) and
    spread over the rows, since millions of requests end in a few dozen ways."""
    key, width = np.zeros(len(rows), dtype=np.int64), 1
    for column in columns:
        codes, texts = pd.factorize(rows[column], use_na_sentinel=False)
        if width * (len(texts) + 1) > 2**62:  # numbered again before the codes overflow
            key = pd.factorize(key)[0]
            width = int(key.max(initial=0)) + 1
        key, width = key * (len(texts) + 1) + codes, width * (len(texts) + 1)
    inverse, first = numbered(key)
    values = fn(rows.iloc[first])
    return pd.Series(values.array.take(inverse), index=rows.index, name=values.name)


def numbered(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each key's number, counting distinct keys in order of first appearance, and the
    position of each number's first appearance (ascending). By hashing, not sorting: on tens
    of millions of keys a sort is the slow part."""
    number = np.asarray(pd.factorize(keys)[0], dtype=np.int64)
    if len(number) == 0:
        return number, number
    highest = np.maximum.accumulate(number)
    first = np.flatnonzero(np.concatenate([[True], highest[1:] > highest[:-1]]))
    return number, first


def isin(
    values: pd.Series, allowed: pd.Series | pd.Index | pd.Categorical | np.ndarray
) -> np.ndarray:
    """Membership of text ids in a large set; a missing id is in no set. Over codes where
    both share a dictionary, else via Arrow (pandas loops in Python for this)."""
    shared = dictionary(values, allowed) if not isinstance(allowed, np.ndarray) else None
    if shared is not None:
        inside = np.zeros(len(shared) + 1, dtype=bool)  # the last: missing, never inside
        codes = _codes(allowed)
        inside[codes[codes >= 0]] = True
        found: np.ndarray = inside[np.where((c := _codes(values)) < 0, len(shared), c)]
        return found
    try:
        left = pa.array(values, from_pandas=True).cast(pa.large_string())
        right = pa.array(np.asarray(allowed, dtype=object), from_pandas=True).cast(
            pa.large_string()
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return np.asarray(values.isin(list(np.asarray(allowed, dtype=object))), dtype=bool)
    return np.asarray(
        pc.is_in(left, value_set=right, skip_nulls=True).to_numpy(zero_copy_only=False),
        dtype=bool,
    )


def members(values: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """`np.isin` over integer codes, by hashing (np.isin sorts both)."""
    found: np.ndarray = pd.Series(values).isin(allowed).to_numpy()
    return found


def first_index(keys: pd.Series, table: pd.Series) -> np.ndarray:
    """For each of `keys`, the position of its first occurrence in `table`, -1 where it has
    none; a missing key matches a missing entry, as pandas' `map` and `reindex` match NaN."""
    shared = dictionary(keys, table)
    if shared is not None:
        # by code: the first position of each code in the table (missing as code n)
        n = len(shared)
        wanted, entries = (np.where(c < 0, n, c) for c in (_codes(keys), _codes(table)))
        at = numbered(entries)[1]
        first = np.full(n + 1, -1, dtype=np.int64)
        first[entries[at]] = at
        found: np.ndarray = first[wanted]
        return found
    left, right = (pa.array(c, from_pandas=True).cast(pa.large_string()) for c in (keys, table))
    indexed = pc.index_in(left, value_set=right, skip_nulls=False)
    positions: np.ndarray = indexed.to_numpy(zero_copy_only=False)
    return np.where(np.isnan(positions), -1, positions).astype(np.int64)
