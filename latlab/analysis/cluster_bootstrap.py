"""The rounds of a cluster bootstrap (groups of samples, a request's token gaps, drawn whole)
without building the rounds' resamples: each round's mean and percentiles, exactly as
sorting its resample would give them.

A round draws m groups: a row of `ClusterDraws.weights`, how often it drew each group, so
that a sum over a round's resample is one sparse product. Its mean is the sum of the drawn
groups' sums over the sum of their sizes. Its q-th percentile depends on two order
statistics of the resample, which lie, but in rare rounds, within a few standard errors of
the sample's own q-th percentile: a window of the sample's values around it. The drawn
groups' values below the window say where in the window the round's order statistics are,
and the window's values are counted, round by round, in order (equal values once, however
many share them). A round whose order statistics fall outside the window is read again from
a window four times as wide. The sample itself is one more such round, each group drawn
once. A window is placed from a subset of the groups, and read in one pass over the values,
a block at a time: a big run's token gaps are 10⁸ values, and no pass copies them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import numpy as np

from latlab.records.columns import Ragged

if TYPE_CHECKING:
    from scipy import sparse

WINDOW_ERRORS = 3.0  # a first window: ± this many standard errors of the resample's level
WINDOW_SAMPLE = 1_000_000  # at most this many of the values place the windows
BUCKETS = 8  # at most: a window's parts, counted as a whole before one's values are
BUCKET_VALUES = 250_000  # a bucket's values the rounds drew, counted one by one
BLOCK = 1 << 22  # values a pass takes at a time


@dataclass(frozen=True)
class ClusterDraws:
    """Resamples of groups of `values` (group i: `lengths[i]` values from `starts[i]`):
    `weights[r, i]`, how often round r drew group i; row 0 is the sample itself (every group
    once), then `per_round` groups a round."""

    values: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    weights: sparse.csr_matrix
    per_round: int

    @classmethod
    def draw(cls, groups: Ragged, rounds: int, most: int, rng: np.random.Generator,
             rows: np.ndarray | None = None) -> ClusterDraws:
        """The sample and `rounds` resamples of `min(n, most)` of its n groups that have
        samples (of the `rows` only, a mask, when given)."""
        from scipy import sparse

        values, starts, lengths = _kept(groups, rows)
        n, m = len(lengths), min(len(lengths), most)
        picks = np.concatenate([np.arange(n), rng.integers(0, n, rounds * m)])
        weights = sparse.csr_matrix((np.ones(len(picks)), picks,
                                     np.concatenate([[0], n + np.arange(rounds + 1) * m])),
                                    shape=(rounds + 1, n))
        return cls(values, starts, lengths, weights, m)

    def means(self) -> np.ndarray:
        sums = np.concatenate([_sums(self.values[v0:v1], self.starts[g0:g1] - v0,
                                     self.lengths[g0:g1]) for g0, g1, v0, v1 in self._blocks()])
        return self.weights @ sums / self.sizes()

    def sizes(self) -> np.ndarray:
        """The number of values in each round's resample."""
        return np.rint(self.weights @ self.lengths.astype(float)).astype(np.int64)

    def percentiles(self, qs: list[float]) -> dict[float, np.ndarray]:
        """Each round's q-th percentile (linear interpolation) for each of `qs`."""
        sizes = self.sizes()
        values, lengths = self._subset()  # some groups, whole: where the windows go
        sample, offsets = np.sort(values), np.cumsum(lengths) - lengths
        found = {}
        for q in qs:
            # the window's half-width, in levels: the resample's error, the subset's
            level = q / 100
            below = np.add.reduceat(values < _at(sample, level), offsets)
            error = np.std(below - level * lengths) / lengths.mean()
            spread = WINDOW_ERRORS * error / np.sqrt(self.per_round) + 1 / len(sample) \
                + 2 * error * np.sqrt(max(0.0, 1 / len(lengths) - 1 / len(self.lengths)))
            found[q] = np.full(len(sizes), np.nan)
            while len(rounds := np.flatnonzero(np.isnan(found[q]))):
                found[q][rounds] = self._read(sample, level, spread, rounds, sizes[rounds])
                spread *= 4
        return found

    def _subset(self) -> tuple[np.ndarray, np.ndarray]:
        """The values of an even choice of groups, about `WINDOW_SAMPLE` values in all (all
        of them, at most that), and those groups' lengths."""
        chosen = slice(None, None, max(1, -(-self.lengths.sum() // WINDOW_SAMPLE)))
        starts, lengths = self.starts[chosen], self.lengths[chosen]
        at = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) \
            + np.arange(lengths.sum())
        return self.values[at], lengths

    def _read(self, sample: np.ndarray, level: float, spread: float, rounds: np.ndarray,
              sizes: np.ndarray) -> np.ndarray:
        """The `level` percentile of the resamples `rounds` (of `sizes` values) from the
        window of values at `level ± spread` of the sorted `sample`; NaN for a round whose
        two order statistics are not both in it. A big window is cut in buckets: a round's
        counts in each say which bucket holds each order statistic, and only that bucket's
        values are counted one by one."""
        bottom, top = _at(sample, level - spread), _at(sample, level + spread)
        below, inside, owner = self._window(bottom, top)
        drawn = len(rounds) * len(inside) * self.per_round / len(self.starts)
        buckets = int(np.clip(drawn // BUCKET_VALUES, 1, BUCKETS))
        cuts = [_at(sample, x) for x in np.linspace(level - spread, level + spread,
                                                    buckets + 1)[1:-1]]
        bucket = np.searchsorted(cuts, self.values[inside], side="right") + 1  # 0: below
        n = len(self.starts)
        per_group = np.bincount(owner * (buckets + 1) + bucket, minlength=n * (buckets + 1))
        per_group = per_group.reshape(n, buckets + 1).astype(float)
        per_group[:, 0] = below
        weights = self.weights if len(rounds) == self.weights.shape[0] else self.weights[rounds]
        running = np.cumsum(weights @ per_group, axis=1)  # values up to each bucket's end
        position = (sizes - 1) * level
        first = position.astype(np.int64)
        wanted = np.concatenate([first, np.minimum(first + 1, sizes - 1)])
        row = np.tile(np.arange(len(rounds)), 2)
        at = (running[row] <= wanted[:, None]).sum(axis=1)  # buckets + 1: above the window
        value = np.full(len(wanted), np.nan)
        for b in np.unique(at[(at >= 1) & (at <= buckets)]):
            asked = np.flatnonzero(at == b)
            value[asked] = self._count_out(weights, inside[bucket == b], owner[bucket == b],
                                           row[asked], wanted[asked] - running[row[asked], b - 1])
        return interpolate(value[:len(rounds)], value[len(rounds):], position)

    def _count_out(self, weights: sparse.csr_matrix, inside: np.ndarray, owner: np.ndarray,
                   row: np.ndarray, position: np.ndarray) -> np.ndarray:
        """The values at `position` among the values `inside` (of groups `owner`) that the
        rounds `row` of `weights` drew, in order of value."""
        from scipy import sparse

        distinct, column = np.unique(self.values[inside], return_inverse=True)
        counts = sparse.csr_matrix((np.ones(len(inside)), (owner, column)),
                                   shape=(len(self.starts), len(distinct)))
        rows, which = np.unique(row, return_inverse=True)
        drawn = weights[rows] @ counts  # how often each round drew each distinct value
        drawn.sort_indices()
        running = np.concatenate([[0], np.cumsum(drawn.data)])
        entry = np.searchsorted(running, running[drawn.indptr[which]] + position, side="right")
        return distinct[drawn.indices[entry - 1]]

    def _blocks(self) -> Iterator[tuple[int, int, int, int]]:
        """Runs of whole groups of about `BLOCK` values: first and end group, first and end
        value."""
        cuts = np.unique(np.searchsorted(self.starts, np.arange(0, self.starts[-1] + 1, BLOCK)))
        bounds = np.append(cuts, len(self.starts))
        for g0, g1 in zip(bounds[:-1], bounds[1:]):
            yield g0, g1, self.starts[g0], self.starts[g1 - 1] + self.lengths[g1 - 1]

    def _window(self, bottom: float, top: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """In one pass over the values: each group's values below `bottom`, and where the
        groups' values within [bottom, top] are, with the group of each."""
        below, found = [], []
        for g0, g1, v0, v1 in self._blocks():
            part = self.values[v0:v1]
            below.append(_sums(part < bottom, self.starts[g0:g1] - v0, self.lengths[g0:g1]))
            found.append(np.flatnonzero((part >= bottom) & (part <= top)) + v0)
        at = np.concatenate(found)
        owner = np.searchsorted(self.starts, at, side="right") - 1
        member = at < self.starts[owner] + self.lengths[owner]  # not between two groups
        return np.concatenate(below), at[member], owner[member]


def _kept(groups: Ragged, rows: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """The values, and the starts and lengths of the groups that have any (among `rows`)."""
    kept = groups.lengths > 0 if rows is None else rows & (groups.lengths > 0)
    return groups.values, groups.offsets[:-1][kept], groups.lengths[kept]


def _sums(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each group's sum of `values` (group i: `lengths[i]` from `starts[i]`; the last one
    ends where `values` does)."""
    at = np.empty(2 * len(starts) - 1, np.int64)  # reduceat sums from each index to the next
    at[0::2], at[1::2] = starts, (starts + lengths)[:-1]
    return np.add.reduceat(values, at)[::2]


def interpolate(low: np.ndarray, high: np.ndarray, position: np.ndarray) -> np.ndarray:
    """Between the order statistics `low` and `high` around `position` (a sorted sample's
    `(n − 1) · level`), as `np.percentile` interpolates, to the last bit."""
    fraction = position - np.floor(position)
    step = high - low
    return np.where(fraction >= 0.5, high - step * (1 - fraction), low + step * fraction)


def _at(ordered: np.ndarray, level: float) -> float:
    """The sorted sample's value at `level`, unbounded past its ends."""
    if level <= 0 or level >= 1:
        return -np.inf if level <= 0 else np.inf
    return float(ordered[round(level * (len(ordered) - 1))])
