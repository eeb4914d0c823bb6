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
once (`ClusterDraws.whole`). Every pass over the values goes a block at a time: a big run's
token gaps are 10⁸ values, and no pass copies them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

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
    `weights[r, i]`, how often round r drew group i, `per_round` groups a round."""

    values: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    weights: sparse.csr_matrix
    per_round: int

    @classmethod
    def draw(cls, groups: Ragged, rounds: int, most: int, rng: np.random.Generator,
             rows: np.ndarray | None = None) -> ClusterDraws:
        """`rounds` resamples of `min(n, most)` of the n groups that have samples (of the
        `rows` only, a mask, when given)."""
        from scipy import sparse

        values, starts, lengths = _kept(groups, rows)
        m = min(len(lengths), most)
        picks = rng.integers(0, len(lengths), rounds * m)
        weights = sparse.csr_matrix((np.ones(rounds * m), picks, np.arange(rounds + 1) * m),
                                    shape=(rounds, len(lengths)))
        return cls(values, starts, lengths, weights, m)

    @classmethod
    def whole(cls, groups: Ragged, rows: np.ndarray | None = None) -> ClusterDraws:
        """The sample itself, as one round that drew every group once."""
        from scipy import sparse

        values, starts, lengths = _kept(groups, rows)
        weights = sparse.csr_matrix(np.ones((1, len(lengths))))
        return cls(values, starts, lengths, weights, len(lengths))

    def means(self) -> np.ndarray:
        return self.weights @ self._per_group(lambda v: v) / self.sizes()

    def sizes(self) -> np.ndarray:
        """The number of values in each round's resample."""
        return np.rint(self.weights @ self.lengths.astype(float)).astype(np.int64)

    def percentiles(self, qs: list[float]) -> dict[float, np.ndarray]:
        """Each round's q-th percentile (linear interpolation) for each of `qs`."""
        sizes = self.sizes()
        sample = np.sort(self._sample(-(-self.lengths.sum() // WINDOW_SAMPLE)))
        # the window's half-width, in levels: the resample's error and the sample's own
        sampled = 2 * np.sqrt(0.25 / len(sample)) if len(sample) < self.lengths.sum() else 0
        found = {}
        for q in qs:
            spread = WINDOW_ERRORS * self._level_error(_at(sample, q / 100), q / 100) \
                + sampled + 1 / len(sample)
            found[q] = np.full(len(sizes), np.nan)
            while len(rounds := np.flatnonzero(np.isnan(found[q]))):
                found[q][rounds] = self._read(sample, q / 100, spread, rounds, sizes[rounds])
                spread *= 4
        return found

    def _level_error(self, value: float, level: float) -> float:
        """The standard error of the share of a resample's values below `value`, a share
        `level` of the sample's: groups that sit high or low as a whole widen it."""
        below = self._per_group(lambda v: v < value)
        spread = np.std(below - level * self.lengths)
        return float(spread / np.sqrt(self.per_round) / self.lengths.mean())

    def _read(self, sample: np.ndarray, level: float, spread: float, rounds: np.ndarray,
              sizes: np.ndarray) -> np.ndarray:
        """The `level` percentile of the resamples `rounds` (of `sizes` values) from the
        window of values at `level ± spread` of the sorted `sample`; NaN for a round whose
        two order statistics are not both in it. A big window is cut in buckets: a round's
        counts in each say which bucket holds each order statistic, and only that bucket's
        values are counted one by one."""
        bottom, top = _at(sample, level - spread), _at(sample, level + spread)
        inside, owner = self._where(lambda v: (v >= bottom) & (v <= top))
        drawn = len(rounds) * len(inside) * self.per_round / len(self.starts)
        buckets = int(np.clip(drawn // BUCKET_VALUES, 1, BUCKETS))
        cuts = [_at(sample, x) for x in np.linspace(level - spread, level + spread,
                                                    buckets + 1)[1:-1]]
        bucket = np.searchsorted(cuts, self.values[inside], side="right") + 1  # 0: below
        n = len(self.starts)
        per_group = np.bincount(owner * (buckets + 1) + bucket, minlength=n * (buckets + 1))
        per_group = per_group.reshape(n, buckets + 1).astype(float)
        per_group[:, 0] = self._per_group(lambda v: v < bottom)
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

    def _sample(self, every: int) -> np.ndarray:
        """Every `every`-th of the groups' values (what lies between groups left out)."""
        return np.concatenate([
            self.values[v0 + np.flatnonzero(_members(self.starts[g0:g1] - v0,
                                                     self.lengths[g0:g1], v1 - v0))[::every]]
            for g0, g1, v0, v1 in self._blocks()])

    def _per_group(self, of: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """Each group's sum of `of(values)` (the values, or a test of them)."""
        out = []
        for g0, g1, v0, v1 in self._blocks():
            ends = (self.starts[g0:g1] + self.lengths[g0:g1] - v0)[:-1]
            at = np.stack([self.starts[g0:g1] - v0, np.append(ends, 0)], axis=1).ravel()[:-1]
            out.append(np.add.reduceat(of(self.values[v0:v1]), at)[::2])
        return np.concatenate(out)

    def _where(self, test: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Where the groups' values pass `test`, and the group of each."""
        found = np.concatenate([np.flatnonzero(test(self.values[v0:v1])) + v0
                                for _, _, v0, v1 in self._blocks()])
        owner = np.searchsorted(self.starts, found, side="right") - 1
        member = found < self.starts[owner] + self.lengths[owner]
        return found[member], owner[member]


def _kept(groups: Ragged, rows: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """The values, and the starts and lengths of the groups that have any (among `rows`)."""
    kept = groups.lengths > 0 if rows is None else rows & (groups.lengths > 0)
    return groups.values, groups.offsets[:-1][kept], groups.lengths[kept]


def _members(starts: np.ndarray, lengths: np.ndarray, size: int) -> np.ndarray:
    """A mask of `size` values: those inside the groups."""
    edges = np.zeros(size + 1, np.int8)
    np.add.at(edges, starts, 1)
    np.add.at(edges, starts + lengths, -1)
    return np.cumsum(edges[:-1], dtype=np.int8).astype(bool)


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
