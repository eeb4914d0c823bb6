"""Arrow columns (as DuckDB parses `requests.jsonl`) as the numpy arrays a request table
holds: a struct's fields, integers with a missing value, floats with NaN, flags, a map of
spans one column per name, a list column flat with its offsets."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def fields_of(column: pa.ChunkedArray | pa.Array) -> dict[str, pa.Array]:
    """A struct column's fields, missing where the struct is."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return {field.name: values for field, values in zip(array.type, array.flatten())}


def ints(column: pa.ChunkedArray | pa.Array, missing: int) -> np.ndarray:
    return np.asarray(pc.fill_null(column, missing).to_numpy(), dtype=np.int64)


def floats(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.array(pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False), dtype=float)


def flags(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(column, False).to_numpy(zero_copy_only=False), dtype=bool)


def spans(column: pa.MapArray) -> dict[str, np.ndarray]:
    """A map column (span name → ms) as one column per name, NaN where a request has none."""
    offsets = column.offsets.to_numpy()  # into the whole of `keys` and `items`
    keys = column.keys[offsets[0]:offsets[-1]].to_numpy(zero_copy_only=False)
    values = column.items[offsets[0]:offsets[-1]].to_numpy(zero_copy_only=False).astype(float)
    owner = np.repeat(np.arange(len(column)), np.diff(offsets))
    spans = {}
    for name in sorted(set(keys.tolist())):
        spans[name] = np.full(len(column), np.nan)
        spans[name][owner[keys == name]] = values[keys == name]
    return spans


def lists(column: pa.ChunkedArray | pa.Array, dtype: type = np.int64
           ) -> tuple[np.ndarray, np.ndarray]:
    """A list column as its flat values and offsets (a missing list is empty), copied once."""
    lengths = ints(pc.list_value_length(column), 0)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.empty(offsets[-1], dtype)
    at = 0
    for chunk in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        values = chunk.flatten().to_numpy(zero_copy_only=False)
        flat[at:at + len(values)] = values
        at += len(values)
    return flat, offsets
