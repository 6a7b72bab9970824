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
    dtype = _distinct_dtype(pd.Index(texts, dtype=texts.dtype))
    return [
        pd.Series(
            pd.Categorical.from_codes(c, dtype=dtype, validate=False),
            index=column.index,
            name=column.name,
        )
        for c, column in zip(codes, columns, strict=True)
    ]


def _distinct_dtype(texts: pd.Index) -> pd.CategoricalDtype:
    """A categorical dtype over texts known to be distinct and never missing (factorize's
    uniques). pandas' public constructor checks both again by hashing every text, seconds
    for a soak's ten million ids, so its unchecked one is used where this pandas has it."""
    unchecked = getattr(pd.CategoricalDtype, "_from_fastpath", None)
    if unchecked is None:
        return pd.CategoricalDtype(texts)
    dtype: pd.CategoricalDtype = unchecked(texts, False)
    return dtype


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
    inverse, first = _combinations(rows, columns)
    values = fn(rows.iloc[first])
    return pd.Series(values.array.take(inverse), index=rows.index, name=values.name)


def distinct_categories(
    rows: pd.DataFrame, columns: Sequence[str], fn: Callable[[pd.DataFrame], pd.Series]
) -> pd.Series:
    """`per_distinct(rows, columns, fn)` for text, as a categorical whose categories are its
    values sorted: grouped by, it orders and groups as that text would, without a string per
    row."""
    inverse, first = _combinations(rows, columns)
    values = fn(rows.iloc[first])
    codes, texts = pd.factorize(values, use_na_sentinel=True)
    order = np.argsort(np.asarray(texts, dtype=object), kind="stable")
    rank = np.empty(len(texts) + 1, dtype=np.int64)
    rank[order] = np.arange(len(texts))
    rank[-1] = -1  # missing
    dtype = pd.CategoricalDtype(pd.Index(texts, dtype=values.dtype).take(order))
    spread = rank[np.asarray(codes, dtype=np.int64)[inverse]]
    return pd.Series(
        pd.Categorical.from_codes(spread, dtype=dtype), index=rows.index, name=values.name
    )


def distinct_counts(
    rows: pd.DataFrame, columns: Sequence[str], fn: Callable[[pd.DataFrame], pd.Series]
) -> pd.Series:
    """`per_distinct(rows, columns, fn).value_counts()`, without spreading the values over
    the rows: each distinct value of `fn` with how many rows have it, commonest first, ties
    in order of first appearance, missing values left out."""
    inverse, first = _combinations(rows, columns)
    values = fn(rows.iloc[first])
    each = pd.Series(np.bincount(inverse, minlength=len(first)), index=values.to_numpy())
    each = each[pd.notna(values).to_numpy()]
    found = each.groupby(level=0, sort=False).sum()  # combinations that read alike
    found.index = pd.Index(found.index, dtype=values.dtype, name=values.name)
    return found.rename("count").sort_values(ascending=False, kind="stable")


def _combinations(rows: pd.DataFrame, columns: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's number, counting the distinct combinations of `columns` in order of first
    appearance (a missing value is one of its own), and where each first appears."""
    key, width = np.zeros(len(rows), dtype=np.int64), 1
    for column in columns:
        codes, distinct = _value_codes(rows[column])
        if width * distinct > DENSE_SPAN * len(rows) + 1024:
            # the combinations so far numbered again: the keys stay narrow (and never
            # overflow), so that they are counted in an array rather than hashed
            key = numbered(key)[0]
            width = int(key.max(initial=0)) + 1
        key, width = key * distinct + codes, width * distinct
    return numbered(key)


# Keys spanning at most this many values per key (codes of a dictionary, pairs of codes
# with a few replicas) are counted in an array as long as their span rather than hashed.
DENSE_SPAN = 4


def _value_codes(values: pd.Series) -> tuple[np.ndarray, int]:
    """One code per value, from 0, missing one of them; and how many codes there can be.
    A categorical's own codes (missing: 0), else the values numbered by hashing."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        codes = np.asarray(values.cat.codes, dtype=np.int64) + 1
        return codes, len(values.cat.categories) + 1
    numbers, texts = pd.factorize(values, use_na_sentinel=False)
    return np.asarray(numbers, dtype=np.int64), len(texts) + 1


def numbered(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each key's number, counting distinct keys in order of first appearance, and the
    position of each number's first appearance (ascending). Never by sorting: on tens of
    millions of keys a sort is the slow part. Keys of a narrow span (codes) are placed in an
    array indexed by key; others are hashed."""
    keys = np.asarray(keys)
    if len(keys) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    low = int(keys.min())
    span = int(keys.max()) - low + 1
    if span > DENSE_SPAN * len(keys) + 1024:
        number = np.asarray(pd.factorize(keys)[0], dtype=np.int64)
        highest = np.maximum.accumulate(number)
        first = np.flatnonzero(np.concatenate([[True], highest[1:] > highest[:-1]]))
        return number, first
    # each key's first position, then the first positions in order: a key's number is how
    # many first positions come before its own
    offset = keys - low
    position = np.full(span, len(keys), dtype=np.int64)
    np.minimum.at(position, offset, np.arange(len(keys)))
    is_first = np.zeros(len(keys), dtype=bool)
    is_first[position[position < len(keys)]] = True
    number = (np.cumsum(is_first) - 1)[position[offset]]
    return number, np.flatnonzero(is_first)


def in_time(ids: np.ndarray, t: np.ndarray, n: int, *, last: bool) -> np.ndarray:
    """Per code below `n`: the position of its first row in time order (its `last` one),
    -1 for none. A row without a time counts as the latest, as a sort puts NaN last; of rows
    at the same time, the one first (last) in the table. Without sorting: the earliest
    (latest) time per code, then the first (last) position among the rows at it."""
    undated = np.isnan(t)
    has_undated = np.zeros(n, dtype=bool)
    has_undated[ids[undated]] = True
    bound = np.full(n, np.nan)
    (np.fmax if last else np.fmin).at(bound, ids, t)  # fmin, fmax: NaN is no time
    if last:
        at_bound = np.where(has_undated[ids], undated, t == bound[ids])
    else:  # the undated rows come first only where a code has nothing else
        at_bound = np.where(np.isnan(bound[ids]), undated, t == bound[ids])
    found = np.full(n, -1 if last else len(t), dtype=np.int64)
    (np.maximum if last else np.minimum).at(found, ids[at_bound], np.flatnonzero(at_bound))
    if not last:
        found[found == len(t)] = -1
    return found


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
    """`np.isin` over integer codes, by hashing (np.isin sorts both), or where the codes
    span a narrow range, in an array indexed by code."""
    values, allowed = np.asarray(values), np.asarray(allowed)
    if len(values) == 0 or len(allowed) == 0:
        return np.zeros(len(values), dtype=bool)
    low = min(int(values.min()), int(allowed.min()))
    span = max(int(values.max()), int(allowed.max())) - low + 1
    if span > DENSE_SPAN * (len(values) + len(allowed)) + 1024:
        found: np.ndarray = pd.Series(values).isin(allowed).to_numpy()
        return found
    inside = np.zeros(span, dtype=bool)
    inside[allowed - low] = True
    dense: np.ndarray = inside[values - low]
    return dense


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
