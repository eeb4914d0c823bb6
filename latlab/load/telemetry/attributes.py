"""A span's attributes as `latlab observe` holds them while its trace waits: only the keys its
calls are made from (`Kept`), in a compact mapping (`Attributes`).

A waiting span lives for seconds, and up to --max-pending-spans of them (100,000) wait at
once. A dict of a span's attributes cost about as much as the rest of the span: its hash
table (184 to 464 bytes for 1 to 12 keys), a copy of every string value, and the attributes
observe never reads (an HTTP span's method, route, scheme, URL, ...). `Attributes` keeps
only the read keys, their values in one tuple, and shares the key → position table between
every span of the same keys (a service's spans of one kind have the same); a value that
names one of few things (a model, an operation) is one shared string.

    kept = Kept(frozenset({"gen_ai.request.id", ...}), labels=frozenset({"gen_ai.request.model"}))
    attributes = kept.of(pairs)           # pairs of (key, value), as decoded
    attributes.get("gen_ai.request.id")   # a read-only Mapping
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

MAX_SHARED = 10_000  # key tables and label values kept, for a sender whose names never repeat

_INDEXES: dict[tuple[str, ...], dict[str, int]] = {}
_LABELS: dict[str, str] = {}


class Attributes(Mapping[str, Any]):
    """A read-only mapping of a span's attributes: `index` (key → position, shared) into
    `values`."""

    __slots__ = ("_index", "_values")

    def __init__(self, index: dict[str, int], values: tuple[Any, ...]) -> None:
        self._index, self._values = index, values

    def __getitem__(self, key: str) -> Any:
        return self._values[self._index[key]]

    def get(self, key: str, default: Any = None) -> Any:
        at = self._index.get(key)
        return default if at is None else self._values[at]

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"Attributes({dict(self)!r})"


NONE = Attributes({}, ())


@dataclass(frozen=True, slots=True)
class Kept:
    """The attribute keys a waiting span keeps, and those of them whose values name one of
    few things (a model, an operation, an error type), one string object each."""

    keys: frozenset[str]
    labels: frozenset[str] = frozenset()

    def of(self, pairs: Iterable[tuple[str, Any]]) -> Attributes:
        """The kept ones of `pairs` (a later value of a key repeated wins, as in a dict)."""
        keys, values = [], []
        for key, value in pairs:
            if key in self.keys:
                if key in self.labels and isinstance(value, str):
                    value = _shared(_LABELS, value, value)
                keys.append(key)
                values.append(value)
        if not keys:
            return NONE
        shape = tuple(keys)
        index = _INDEXES.get(shape)
        if index is None:
            index = _shared(_INDEXES, shape, {k: i for i, k in enumerate(shape)})
        return Attributes(index, tuple(values))


def _shared(table: dict[Any, Any], key: Any, value: Any) -> Any:
    """`table`'s value for `key`, set to `value` if there is none and room (`MAX_SHARED`)."""
    if len(table) < MAX_SHARED:
        return table.setdefault(key, value)
    return table.get(key, value)
