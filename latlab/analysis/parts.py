"""A decomposition's two forms: one request's (`Decomposition`: its components, which add
up to its E2E from schedule) and every request's as columns (`Parts`). `analysis.decompose`
makes them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from latlab.analysis.components import QUALITIES, Component, Quality, members
from latlab.records.cache import RawColumn
from latlab.records.columns import one_value
from latlab.records.spill import Spill


@dataclass(slots=True)
class Decomposition:
    """One request's E2E-from-schedule (ms) and its components, which add up to it."""

    total: float
    components: dict[str, Component]
    has_server: bool

    def ms(self, name: str) -> float:
        """The component's time, 0 when unavailable or not applicable."""
        c = self.components.get(name)
        return c.ms if c is not None and c.ms is not None else 0.0

    def quality(self, name: str) -> Quality | None:
        c = self.components.get(name)
        return c.quality if c is not None else None

    def bucket(self, name: str) -> float:
        return sum(self.ms(c) for c in members(name, self.components))


@dataclass(eq=False)
class Parts:
    """Every request's decomposition as columns: `ms` NaN where unavailable or not
    applicable, `quality` codes into QUALITIES (−1: not applicable), `total` NaN and
    `decomposed` False for a request without one."""

    total: np.ndarray
    ms: dict[str, np.ndarray]
    quality: dict[str, np.ndarray]
    has_server: np.ndarray
    decomposed: np.ndarray
    _spill: Spill | None = field(default=None, repr=False, compare=False)  # mapped from

    def give_back(self) -> None:
        """The pages of the columns read since the last call given back (`records.spill`)."""
        if self._spill is not None:
            self._spill.give_back()

    def value(self, name: str, rows: np.ndarray | None = None) -> np.ndarray:
        """The component's time per request (of `rows` only, when given), 0 when unavailable
        or not applicable (made at each call, not kept: a second copy of every column; a
        caller that wants a few rows many times gives them, not the whole column each)."""
        column = self.ms[name] if rows is None else self.ms[name][rows]
        return np.nan_to_num(column)

    def bucket(self, name: str) -> np.ndarray:
        return sum(self.value(c) for c in members(name, self.ms))

    @classmethod
    def concat(cls, blocks: list[Parts]) -> Parts:
        """Blocks of requests one after the other, a column at a time (each block's let go
        of as it is copied: `blocks` are emptied); a column of one value throughout stays
        one value."""
        def joined(columns: list[np.ndarray]) -> np.ndarray:
            return one_value(np.concatenate(columns)) if all(
                c.strides == (0,) and len(c) for c in columns) else np.concatenate(columns)

        parts = {}
        for group in ("ms", "quality"):
            columns = [getattr(b, group) for b in blocks]
            parts[group] = {name: joined([c.pop(name) for c in columns])
                            for name in list(columns[0])}
        return cls(**parts, **{name: np.concatenate([getattr(b, name) for b in blocks])
                               for name in ("total", "has_server", "decomposed")})

    @classmethod
    def spilled(cls, blocks: Iterable[Parts], spill: Spill) -> Parts:
        """`concat(blocks)` written to `spill` a block at a time, mapped back."""
        columns: dict[str, dict[str, RawColumn]] = {}
        for block in blocks:
            for group in ("ms", "quality"):
                into = columns.setdefault(group, {})
                for name, values in getattr(block, group).items():
                    into.setdefault(name, spill.column(values.dtype)).write(values)
            for name in ("total", "has_server", "decomposed"):
                values = getattr(block, name)
                columns.setdefault(name, {"": spill.column(values.dtype)})[""].write(values)
            del block, values
            spill.give_back()  # the block's pages of the run's columns
        mapped = {group: {name: spill.mapped(c) for name, c in written.items()}
                  for group, written in columns.items()}
        return cls(ms=mapped.pop("ms"), quality=mapped.pop("quality"), _spill=spill,
                   **{name: mapped[name][""] for name in ("total", "has_server", "decomposed")})

    def row(self, i: int) -> Decomposition | None:
        if not self.decomposed[i]:
            return None
        components = {}
        for name in self.ms:
            code = self.quality[name][i]
            if code >= 0:
                value = self.ms[name][i]
                components[name] = Component(None if np.isnan(value) else float(value),
                                             QUALITIES[code])
        return Decomposition(total=float(self.total[i]), components=components,
                             has_server=bool(self.has_server[i]))
