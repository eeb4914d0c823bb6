"""Columns of numpy arrays, one value per request, and what every columnar record shares:
a missing timestamp (`MISSING`), strings of few values (`Labels`), per-request samples in one
flat array (`Ragged`), taking some requests of such columns and joining several (`take`,
`concat`), and turning Arrow columns into numpy ones."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MISSING = np.iinfo(np.int64).min
BLOCK = 1 << 22  # per-token values a pass over a flat column takes at a time


@dataclass(eq=False)
class Labels:
    """A string column of few distinct values: `codes` index `names`, −1 where missing."""

    codes: np.ndarray
    names: tuple[str, ...]

    def __getitem__(self, i: int) -> str | None:
        code = int(self.codes[i])
        return None if code < 0 else self.names[code]

    def mask(self, name: str) -> np.ndarray:
        """Where the column holds `name`."""
        code = self.names.index(name) if name in self.names else -2
        return self.codes == code

    def take(self, rows: np.ndarray) -> Labels:
        return Labels(self.codes[rows], self.names)

    @classmethod
    def concat(cls, columns: Sequence[Labels]) -> Labels:
        names = tuple(dict.fromkeys(n for c in columns for n in c.names))
        remap = [np.array([names.index(n) for n in c.names] + [-1]) for c in columns]
        return cls(np.concatenate([r[c.codes] for r, c in zip(remap, columns)]), names)

    @classmethod
    def of(cls, column: pa.ChunkedArray | pa.Array) -> Labels:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks() if column.num_chunks else pa.array([], pa.string())
        encoded = pc.dictionary_encode(column)
        codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)
        return cls(codes, tuple(encoded.dictionary.to_pylist()))


@dataclass(eq=False)
class Ragged:
    """A flat column of per-request samples: request i's are `values[offsets[i]:offsets[i+1]]`."""

    values: np.ndarray
    offsets: np.ndarray

    def __getitem__(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i]:self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def select(self, rows: np.ndarray) -> np.ndarray:
        """The samples of the requests where `rows` (a boolean mask) is true, in order."""
        return self.values[np.repeat(rows, self.lengths)]

    def take(self, rows: np.ndarray) -> Ragged:
        lengths = self.lengths[rows]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        at = np.repeat(self.offsets[rows] - offsets[:-1], lengths) + np.arange(offsets[-1])
        return Ragged(self.values[at], offsets)

    @classmethod
    def concat(cls, columns: Sequence[Ragged]) -> Ragged:
        shifts = np.cumsum([0] + [len(c.values) for c in columns[:-1]])
        offsets = [columns[0].offsets[:1]] + [c.offsets[1:] + k for c, k in zip(columns, shifts)]
        return cls(np.concatenate([c.values for c in columns]), np.concatenate(offsets))

    def sums(self) -> np.ndarray:
        """Each request's samples summed (0 for none)."""
        return per_request(self.values, self.offsets)

    def maxima(self) -> np.ndarray:
        """Each request's largest sample (NaN for none)."""
        out = np.full(len(self.offsets) - 1, np.nan)
        filled = self.lengths > 0
        if filled.any():
            out[filled] = np.maximum.reduceat(self.values, self.offsets[:-1][filled])
        return out


def take(value: Any, rows: np.ndarray) -> Any:
    """The requests `rows` (indices) of a column: an array, a dict of columns, anything with
    its own `take` (`Labels`, `Ragged`, an Arrow array, a table), or a dataclass of columns
    (field by field; one that is None stays None)."""
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        return value[rows]
    if isinstance(value, dict):
        return {k: take(v, rows) for k, v in value.items()}
    if isinstance(value, pa.ChunkedArray):
        return _take_chunked(value, np.asarray(rows))
    if hasattr(value, "take"):
        return value.take(rows)
    return replace(value, **{f.name: take(getattr(value, f.name), rows) for f in fields(value)
                             if f.init and not f.name.startswith("_")})


def _take_chunked(column: pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    """`column.take(rows)` a chunk at a time: Arrow's own joins every chunk into one array
    first (a big run's mapped ids: a copy of the whole column for a few rows)."""
    rows = np.flatnonzero(rows) if rows.dtype == bool else rows.astype(np.int64)
    rows = np.where(rows < 0, rows + len(column), rows)
    bounds = np.cumsum([0, *(len(c) for c in column.chunks)])
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    which = np.searchsorted(bounds, ordered, side="right") - 1
    pieces = [column.chunk(k).take(pa.array(ordered[which == k] - bounds[k]))
              for k in np.unique(which).tolist()]
    joined = pa.concat_arrays(pieces) if pieces else pa.array([], column.type)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    return joined.take(pa.array(back))


def concat(values: Sequence[Any], lengths: Sequence[int]) -> Any:
    """Columns of several runs (of `lengths` requests each) one after the other; a dict's
    column that one of them lacks is missing there."""
    first = values[0]
    if isinstance(first, np.ndarray):
        return np.concatenate(values)
    if isinstance(first, pa.Array) and all(isinstance(v, pa.Array) for v in values):
        return pa.concat_arrays(values)
    if isinstance(first, (pa.Array, pa.ChunkedArray)):  # a big run's, a chunk per batch read
        return pa.chunked_array([c for v in values for c in
                                 (v.chunks if isinstance(v, pa.ChunkedArray) else [v])],
                                first.type)
    if isinstance(first, dict):
        keys = list(dict.fromkeys(k for v in values for k in v))
        like = {k: next(v[k] for v in values if k in v) for k in keys}
        return {k: concat([v[k] if k in v else _missing(like[k], n)
                           for v, n in zip(values, lengths)], lengths) for k in keys}
    if hasattr(type(first), "concat"):
        return type(first).concat(values)
    return replace(first, **{f.name: concat([getattr(v, f.name) for v in values], lengths)
                             for f in fields(first) if f.init and not f.name.startswith("_")})


def put(into: Any, value: Any, rows: np.ndarray, n: int) -> Any:
    """`into`, a column of `n` requests (made with every request missing when None), with
    the requests of `value` written at `rows`: an array, a dict of columns (one that only
    some parts have is missing elsewhere) or `Labels` (names joined). An array missing for
    every request so far is a read-only view of one missing value: no memory."""
    if isinstance(value, np.ndarray):
        if into is None or not into.flags.writeable:
            fill = missing_value(value.dtype)
            if (np.isnan(value) if fill is np.nan else value == fill).all():
                return np.broadcast_to(np.array(fill, value.dtype), n)
            into = np.full(n, fill, value.dtype)
        into[rows] = value
        return into
    if isinstance(value, dict):
        into = {} if into is None else into
        for k, v in value.items():
            into[k] = put(into.get(k), v, rows, n)
        return into
    if isinstance(value, Labels):
        names = tuple(dict.fromkeys((*into.names, *value.names))) if into else value.names
        remap = np.array([names.index(name) for name in value.names] + [-1], np.int32)
        codes = put(into.codes if into else None, remap[value.codes], rows, n)
        return Labels(codes, names)  # `into`'s codes name the same as before
    raise TypeError(f"cannot write {type(value).__name__} columns in place")


def _missing(like: np.ndarray, n: int) -> np.ndarray:
    """`n` missing values of `like`'s kind."""
    return np.full(n, missing_value(like.dtype), like.dtype)


def missing_value(dtype: np.dtype) -> Any:
    """A missing value of `dtype`'s kind: NaN, MISSING (int64: times), −1 (codes), False."""
    return {"f": np.nan, "b": False}.get(dtype.kind, MISSING if dtype == np.int64 else -1)


def one_value(column: np.ndarray) -> np.ndarray:
    """`column`, or a read-only view of its one value when it holds only that (NaN equal to
    NaN): no memory a request for a field no request has."""
    if len(column) and column.strides != (0,) and np.array_equal(
            column, np.broadcast_to(column[:1], column.shape),
            equal_nan=column.dtype.kind == "f"):
        return np.broadcast_to(column[:1].copy(), column.shape)
    return column


def one_valued(value: Any) -> Any:
    """`value` (an array, a dict of them, `Labels`) with each array of one value throughout
    a read-only view of it (`one_value`)."""
    if isinstance(value, np.ndarray):
        return one_value(value)
    if isinstance(value, dict):
        return {k: one_valued(v) for k, v in value.items()}
    if isinstance(value, Labels):
        return Labels(one_value(value.codes), value.names)
    return value


def present(values: np.ndarray) -> np.ndarray:
    """Where an int64 timestamp column holds a time."""
    return values != MISSING


def first_present(*columns: np.ndarray) -> np.ndarray:
    """Per row, the first of `columns` that holds a time (MISSING when none does): where the
    first holds one in every row, a read-only view of it (no copy)."""
    if present(columns[0]).all():
        view = columns[0].view()
        view.flags.writeable = False
        return view
    out = columns[-1].copy()
    for column in reversed(columns[:-1]):
        out = np.where(present(column), column, out)
    return out


def ms_between(later: np.ndarray, earlier: np.ndarray) -> np.ndarray:
    """Milliseconds from `earlier` to `later` per row; NaN where either is missing."""
    both = present(later) & present(earlier)
    return np.where(both, (np.where(both, later, 0) - np.where(both, earlier, 0)) / 1e6, np.nan)


def per_request(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The sum of each request's slice of a flat per-token column (0 for an empty one), a
    block of requests at a time: summing narrow values into wide ones copies them first."""
    out = np.zeros(len(offsets) - 1, np.int64 if values.dtype.kind in "iub" else float)
    filled = np.flatnonzero(offsets[1:] > offsets[:-1])
    starts = offsets[:-1][filled]
    cuts = np.unique(np.searchsorted(starts, np.arange(0, offsets[-1], BLOCK)))
    for i, j in zip(cuts, np.append(cuts[1:], len(filled))):
        if i == j:
            continue
        begin, end = starts[i], offsets[filled[j - 1] + 1]
        out[filled[i:j]] = np.add.reduceat(values[begin:end], starts[i:j] - begin,
                                           dtype=out.dtype)
    return out


def value_of(v: Any, kind: type = int) -> Any:
    if isinstance(v, np.floating):
        return None if np.isnan(v) else kind(v)
    return None if v == MISSING else int(v)
