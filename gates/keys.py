"""Text keys as integers: a column's values coded once, so that sorts, group-bys and joins
on a request id run as numpy over integers instead of pandas over text (which hashes the
strings again at each step, and copies them at each row selection: the bulk of the
analysis's time on a run of millions of requests)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc


def text_codes(values: pd.Series) -> np.ndarray:
    """One integer per value, numbered in order of first appearance (sorting the texts
    themselves would cost more than the rest), equal values equal codes; -1 where missing."""
    codes, _ = pd.factorize(values, use_na_sentinel=True)
    return np.asarray(codes, dtype=np.int64)


def pair_codes(first: np.ndarray, second: np.ndarray, n_second: int) -> np.ndarray:
    """One code per pair of codes (`second`'s run below `n_second`): equal pairs, equal
    codes; a missing value (-1) is a value of its own, as in a pandas MultiIndex or a merge,
    which match missing keys with missing keys."""
    codes: np.ndarray = (first + 1) * (n_second + 1) + (second + 1)
    return codes


def shared_codes(*columns: pd.Series) -> tuple[list[np.ndarray], pd.Index]:
    """Codes of several text columns over one dictionary (equal texts, equal codes, whichever
    column they are in; -1 where missing), and the texts by code."""
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


def members(values: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """`np.isin` over integer codes, by hashing (np.isin sorts both)."""
    found: np.ndarray = pd.Series(values).isin(allowed).to_numpy()
    return found


def first_index(keys: pd.Series, table: pd.Series) -> np.ndarray:
    """For each of `keys`, the position of its first occurrence in `table`, -1 where it has
    none; a missing key matches a missing entry, as pandas' `map` and `reindex` match NaN."""
    left, right = (pa.array(c, from_pandas=True).cast(pa.large_string()) for c in (keys, table))
    found = pc.index_in(left, value_set=right, skip_nulls=False)
    positions: np.ndarray = found.to_numpy(zero_copy_only=False)
    return np.where(np.isnan(positions), -1, positions).astype(np.int64)
